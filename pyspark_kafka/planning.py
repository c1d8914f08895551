"""Offset planning: ranges per Spark task, rate limits, data-loss checks. Pure functions.

The same arithmetic as Spark's KafkaOffsetRangeCalculator and KafkaMicroBatchStream, so a batch
reads the same records in the same number of tasks as the JVM connector would.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from pyspark_kafka.options import (
    EARLIEST,
    INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE,
    INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_TRUE,
    LATEST,
    PartitionMap,
    format_partitions,
)

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class OffsetRange:
    """Records [from_offset, until_offset) of one topic-partition, read by one Spark task."""

    topic: str
    partition: int
    from_offset: int
    until_offset: int

    @property
    def size(self) -> int:
        return self.until_offset - self.from_offset


class DataLossError(RuntimeError):
    """Spark's KAFKA_DATA_LOSS (an IllegalStateException) when failOnDataLoss is true."""


def report_data_loss(message: str, fail_on_data_loss: bool, warn: Callable[[str], None]) -> None:
    if fail_on_data_loss:
        raise DataLossError("%s. %s" % (message, INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_TRUE))
    warn("%s. %s" % (message, INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE))


def split_ranges(ranges: list[OffsetRange], min_partitions: int | None,
                 max_records_per_partition: int | None) -> list[OffsetRange]:
    """Spark's KafkaOffsetRangeCalculator.getRanges: drop empty ranges, then split large ones so
    there are about `min_partitions` tasks and none reads more than `max_records_per_partition`."""
    ranges = [r for r in ranges if r.size > 0]
    if min_partitions is not None and len(ranges) < min_partitions:
        total = sum(r.size for r in ranges)

        def part_count(size: int, total_size: int, parts: int) -> int:
            return max(int(_round_half_up(size / total_size * parts)), 1)

        unsplit = {(r.topic, r.partition) for r in ranges if part_count(r.size, total, min_partitions) == 1}
        unsplit_size = sum(r.size for r in ranges if (r.topic, r.partition) in unsplit)
        split_total = total - unsplit_size
        split_min = max(min_partitions - len(unsplit), 1)
        out: list[OffsetRange] = []
        for r in ranges:
            parts = 1 if (r.topic, r.partition) in unsplit else part_count(r.size, split_total, split_min)
            out.extend(_divide(r, parts))
        ranges = out
    if max_records_per_partition is not None:
        out = []
        for r in ranges:
            out.extend(_divide(r, math.ceil(r.size / max_records_per_partition)))
        ranges = out
    return [r for r in ranges if r.size > 0]


def _round_half_up(x: float) -> float:
    return math.floor(x + 0.5)  # Scala's math.round


def _divide(r: OffsetRange, parts: int) -> list[OffsetRange]:
    """Split into `parts` consecutive ranges; the integer division's remainder goes to the last ones."""
    if parts <= 1:
        return [r]
    out = []
    remaining, start = r.size, r.from_offset
    for part in range(parts):
        this = remaining // (parts - part)
        remaining -= this
        end = min(start + this, r.until_offset)
        out.append(OffsetRange(r.topic, r.partition, start, end))
        start = end
    return out


def rate_limit(limit: int, start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int],
               earliest_of_new: Mapping[TopicPartition, int]) -> PartitionMap:
    """Spark's rateLimit: share `limit` offsets among partitions in proportion to what each has
    waiting; a partition with anything waiting gets at least one."""
    sizes: dict[TopicPartition, int] = {}
    for tp, end in latest.items():
        begin = start.get(tp, earliest_of_new.get(tp))
        if begin is not None and end - begin > 0:
            sizes[tp] = end - begin
    total = float(sum(sizes.values()))
    if total < 1:
        return dict(latest)
    out: PartitionMap = {}
    for tp, end in latest.items():
        if tp not in sizes:
            out[tp] = end
            continue
        begin = start.get(tp, earliest_of_new.get(tp, 0))
        prorate = limit * (sizes[tp] / total)
        share = math.ceil(prorate) if prorate < 1 else math.floor(prorate)
        out[tp] = min(end, begin + int(share))
    return out


def total_waiting(start: Mapping[TopicPartition, int], latest: Mapping[TopicPartition, int]) -> int:
    return sum(end - start.get(tp, 0) for tp, end in latest.items())


def resolve_start(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
                  earliest: Mapping[TopicPartition, int]) -> PartitionMap:
    """Concrete start offsets of a micro-batch.

    A first batch may start from symbolic offsets: LATEST means "from where this batch ends" (so
    replaying the first batch after a crash reads the same, empty, range instead of a later
    "latest"), EARLIEST the log start offset.
    """
    out: PartitionMap = {}
    for tp, off in start.items():
        if off == LATEST:
            out[tp] = end.get(tp, off)
        elif off == EARLIEST:
            out[tp] = earliest.get(tp, 0)
        else:
            out[tp] = off
    return out


def micro_batch_ranges(start: Mapping[TopicPartition, int], end: Mapping[TopicPartition, int],
                       earliest_of_new: Mapping[TopicPartition, int], fail_on_data_loss: bool,
                       warn: Callable[[str], None]) -> list[OffsetRange]:
    """Spark's getOffsetRangesFromResolvedOffsets (before splitting): partitions new since the
    start are read from their earliest offset; deleted ones and offsets that went backwards are
    data loss."""
    new = set(end) - set(start)
    missing = new - set(earliest_of_new)
    if missing:
        report_data_loss(
            "Cannot find earliest offsets of %s. Some data may have been missed" % format_partitions(missing),
            fail_on_data_loss, warn,
        )
    for tp in sorted(new & set(earliest_of_new)):
        if earliest_of_new[tp] != 0:
            report_data_loss(
                "Added partition %s-%d starts from %d instead of 0. Some data may have been missed"
                % (tp[0], tp[1], earliest_of_new[tp]),
                fail_on_data_loss, warn,
            )
    deleted = set(start) - set(end)
    if deleted:
        report_data_loss(
            "%s are gone. Some data may have been missed." % format_partitions(deleted), fail_on_data_loss, warn
        )
    ranges = []
    for tp in sorted(end):
        if tp in start:
            begin = start[tp]
        elif tp in earliest_of_new:
            begin = earliest_of_new[tp]
        else:
            continue
        until = end[tp]
        if until < begin:
            report_data_loss(
                "Partition %s-%d's offset was changed from %d to %d, some data may have been missed"
                % (tp[0], tp[1], begin, until),
                fail_on_data_loss, warn,
            )
        ranges.append(OffsetRange(tp[0], tp[1], begin, until))
    return ranges
