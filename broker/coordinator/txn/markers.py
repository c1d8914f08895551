"""The transaction coordinator's markers, written to this broker's partitions: the single-node
WriteTxnMarkers (Kafka's TransactionMarkerChannelManager and the partition side of the request).

Every marker of a partition served here is appended at once, synchronously (each reaches the OS
before `append_markers` returns); what must still be awaited (the fsyncs the flush policy asks
for, and a marker to `__consumer_offsets`, written through the group coordinator's runtime) is
handed back as one awaitable. A partition that no longer exists (its topic was deleted) counts as
written, as in Kafka. A stale epoch means the marker was written already (a retry after a crash,
or a producer fenced since) and is not retried.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from broker.coordinator.txn import MarkerWrite, TxnCompletion
from broker.coordinator.txn.state import TopicPartition
from broker.observability.logger import get_logger
from broker.partition import Partition
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.txn")

_NOT_RETRIED = frozenset([ErrorCode.INVALID_PRODUCER_EPOCH, ErrorCode.TRANSACTION_COORDINATOR_FENCED])


MARKER_TIMEOUT_S = 30.0  # a marker waits for the in-sync replicas as long as Kafka's request.timeout.ms

CoordinatorMarkers = Callable[[int, TxnCompletion], Awaitable[None]]


class PartitionMarkerWriter:
    """`partition_of(topic, index)`: the partition, or None when it does not exist.
    `coordinators`: topic -> how a coordinator writes a marker to one of its partitions (the
    group coordinator for `__consumer_offsets`: the marker commits or drops the transaction's
    offsets, so it goes through the coordinator's runtime)."""

    def __init__(self, partition_of: Callable[[str, int], Partition | None],
                 coordinators: dict[str, CoordinatorMarkers] | None = None) -> None:
        self.partition_of = partition_of
        self.coordinators = coordinators or {}

    def append_markers(self, completion: TxnCompletion, partitions: set[TopicPartition]) -> MarkerWrite:
        failed: set[TopicPartition] = set()
        waits: list[tuple[TopicPartition, Awaitable[Any]]] = []
        for tp in sorted(partitions):
            coordinator = self.coordinators.get(tp[0])
            if coordinator is not None:
                waits.append((tp, coordinator(tp[1], completion)))
                continue
            partition = self.partition_of(*tp)
            if partition is None:
                continue
            try:
                partition.check_enough_replicas(-1)  # markers are written as acks=all, as Kafka does
                result = partition.append_marker(completion.producer_id, completion.producer_epoch,
                                                 completion.committed, completion.coordinator_epoch,
                                                 completion.transaction_version)
            except KafkaError as exc:
                if exc.code in _NOT_RETRIED:
                    log.warning("transaction marker not written", partition="%s-%d" % tp,
                                transactional_id=completion.transactional_id, error=exc.code.name,
                                message=exc.message)
                else:
                    failed.add(tp)
                continue
            except OSError as exc:
                log.error("transaction marker write failed", partition="%s-%d" % tp, error=str(exc))
                failed.add(tp)
                continue
            if partition.log.needs_flush():
                waits.append((tp, partition.group_commit.commit(partition.log.log_end_offset)))
            if not partition.leads_alone:
                waits.append((tp, partition.replicated(result.first_offset + 1, MARKER_TIMEOUT_S)))
        return MarkerWrite(failed, asyncio.ensure_future(self._settle(completion, waits)) if waits else None)

    @staticmethod
    async def _settle(completion: TxnCompletion, waits: list[tuple[TopicPartition, Awaitable[Any]]]
                      ) -> set[TopicPartition]:
        """Await the fsyncs and the coordinators' markers; returns the partitions to try again."""
        failed: set[TopicPartition] = set()
        results = await asyncio.gather(*(w for _, w in waits), return_exceptions=True)
        for (tp, _), result in zip(waits, results):
            if isinstance(result, KafkaError) and result.code in _NOT_RETRIED:
                log.warning("transaction marker not written", partition="%s-%d" % tp,
                            transactional_id=completion.transactional_id, error=result.code.name)
            elif isinstance(result, BaseException):
                log.error("transaction marker write failed", partition="%s-%d" % tp, error=repr(result))
                failed.add(tp)
        return failed
