"""How one ShareFetch spreads over its partitions: the order and each partition's bytes.

Pure functions after Kafka's share fetch strategies (org.apache.kafka.server.share.fetch):

- `rotate_round_robin`: PartitionRotateStrategy.ROUND_ROBIN. SharePartitionManager.fetchMessages
  rotates the request's partitions (the share session's, in the order they joined it) left by
  the request's ShareSessionEpoch modulo their number, so that a partition late in the list is
  not starved by those before it when MaxRecords runs out early. No rotation at the initial (0)
  or final (-1) epoch, nor for fewer than two partitions.
- `uniform_partition_max_bytes`: PartitionMaxBytesStrategy.UNIFORM. DelayedShareFetch reads each
  acquired partition with an equal part of the request's MaxBytes; Kafka gives the remainder of
  the division to a partition picked at random, and when MaxBytes is smaller than the number of
  partitions, one byte each to MaxBytes partitions picked at random. Here the picks are the first
  partitions in order (the same amounts, deterministic).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

T = TypeVar("T")


def rotate_round_robin(partitions: Sequence[T], session_epoch: int) -> list[T]:
    """The partitions in the order a fetch at `session_epoch` visits them."""
    n = len(partitions)
    if n < 2 or session_epoch < 1:
        return list(partitions)
    at = session_epoch % n
    return [*partitions[at:], *partitions[:at]]


def uniform_partition_max_bytes(request_max_bytes: int, partitions: int) -> list[int]:
    """The bytes each of `partitions` partitions (in fetch order) may be read with."""
    if partitions <= 0:
        return []
    if request_max_bytes <= 0:
        return [0] * partitions
    if request_max_bytes < partitions:
        return [1] * request_max_bytes + [0] * (partitions - request_max_bytes)
    share, extra = divmod(request_max_bytes, partitions)
    return [share + extra] + [share] * (partitions - 1)
