"""Batch and micro-batch readers: plan offset ranges on the driver, read them on executors.

Reader objects are pickled into Spark's read function, so they hold only options; the driver's
AdminClient is made on first use and never pickled.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import DataSourceReader, DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)

from pyspark_kafka.admin import OffsetReader
from pyspark_kafka.fetch import RangeReader, consumer_config
from pyspark_kafka.options import (
    EARLIEST,
    LATEST,
    OptionError,
    PartitionMap,
    SourceOptions,
    format_partitions,
    offsets_from_json,
    offsets_to_json,
)
from pyspark_kafka.planning import (
    OffsetRange,
    micro_batch_ranges,
    rate_limit,
    resolve_start,
    split_ranges,
    total_waiting,
)

log = logging.getLogger("pyspark_kafka")


class KafkaInputPartition(InputPartition):
    """One Spark task: an offset range of one topic-partition."""

    def __init__(self, rng: OffsetRange) -> None:
        super().__init__(None)
        self.range = rng


class _Reading:
    """What both readers share: options, the driver's offset reader, the executor's read."""

    def __init__(self, options: SourceOptions) -> None:
        self.options = options
        for warning in options.warnings:
            log.warning(warning)
        self._offsets: OffsetReader | None = None

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_offsets"] = None
        return state

    @property
    def offsets(self) -> OffsetReader:
        if self._offsets is None:
            self._offsets = OffsetReader(self.options)
        return self._offsets

    def read_partition(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, KafkaInputPartition):  # Spark's placeholder when nothing is planned
            return iter(())
        o = self.options
        conf = consumer_config(o.kafka, o.group_id + "-executor")
        return RangeReader(conf, partition.range, o.include_headers, o.poll_timeout_ms, o.fail_on_data_loss).batches()

    def input_partitions(self, ranges: list[OffsetRange]) -> list[KafkaInputPartition]:
        o = self.options
        return [KafkaInputPartition(r) for r in split_ranges(ranges, o.min_partitions, o.max_records_per_partition)]


class KafkaBatchReader(_Reading, DataSourceReader):
    """`spark.read`: the offsets between startingOffsets and endingOffsets, resolved at planning."""

    def partitions(self) -> list[InputPartition]:  # type: ignore[override]
        o = self.options
        start = self.offsets.resolve(o.starting, is_start=True)
        end = self.offsets.resolve(o.ending, is_start=False)
        if set(start) != set(end):
            raise RuntimeError(
                "different topic partitions for starting offsets topics[%s] and ending offsets topics[%s]"
                % (",".join(sorted({t for t, _ in start})), ",".join(sorted({t for t, _ in end})))
            )
        ranges = []
        for tp in sorted(end):
            if start[tp] > end[tp]:
                raise OptionError(
                    "The resolved start offset %d is greater than the resolved end offset %d for topic %s "
                    "partition %d." % (start[tp], end[tp], tp[0], tp[1])
                )
            ranges.append(OffsetRange(tp[0], tp[1], start[tp], end[tp]))
        return list(self.input_partitions(ranges))

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return self.read_partition(partition)


class KafkaStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """`spark.readStream`: micro-batches between checkpointed offsets {"topic": {"partition": offset}}."""

    def __init__(self, options: SourceOptions) -> None:
        super().__init__(options)
        self._available_now = False
        self._available_now_target: PartitionMap | None = None
        self._latest: PartitionMap = {}
        self._last_trigger = 0.0

    # --- offsets ---

    def initialOffset(self) -> dict:
        # earliest/latest stay symbolic (-2/-1) so that a replay of the first batch reads the
        # same range; see planning.resolve_start
        return offsets_to_json(self.offsets.resolve(self.options.starting, is_start=True, symbolic=True))

    def getDefaultReadLimit(self) -> ReadLimit:
        o = self.options
        if o.max_offsets_per_trigger is not None:
            return ReadMaxRows(o.max_offsets_per_trigger)
        if o.min_offsets_per_trigger is not None:
            return ReadMinRows(o.min_offsets_per_trigger)
        return ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._available_now = True

    def reportLatestOffset(self) -> dict | None:
        return offsets_to_json(self._latest) if self._latest else None

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # type: ignore[override]
        start_map = offsets_from_json(start)
        known = {tp: o for tp, o in start_map.items() if o >= 0}
        if self._available_now:
            # everything there is when the query starts, and nothing after (Trigger.AvailableNow)
            if self._available_now_target is None:
                self._available_now_target = self.offsets.latest_checked(known)
            latest = self._available_now_target
        else:
            latest = self.offsets.latest_checked(known)
        self._latest = latest
        if isinstance(limit, ReadAllAvailable):
            return offsets_to_json(latest)
        o = self.options
        begin = self._concrete_start(start_map, latest)
        if o.min_offsets_per_trigger is not None and not self._available_now:
            now = time.monotonic()
            if now - self._last_trigger < o.max_trigger_delay_ms / 1000.0 and (
                total_waiting(begin, latest) < o.min_offsets_per_trigger
            ):
                return start  # wait for more data (minOffsetsPerTrigger, maxTriggerDelay)
            self._last_trigger = now
        max_rows = limit.max_rows if isinstance(limit, ReadMaxRows) else o.max_offsets_per_trigger
        if max_rows is None:
            return offsets_to_json(latest)
        new = [tp for tp in latest if tp not in begin]
        limited = rate_limit(max_rows, begin, latest, self.offsets.earliest(new) if new else {})
        return offsets_to_json(limited)

    def _concrete_start(self, start: PartitionMap, latest: PartitionMap) -> PartitionMap:
        earliest = [tp for tp, o in start.items() if o == EARLIEST]
        return resolve_start(start, latest, self.offsets.earliest(earliest) if earliest else {})

    # --- planning and reading ---

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        start_map = offsets_from_json(start)
        end_map = offsets_from_json(end)
        if any(o == LATEST for o in end_map.values()):
            raise RuntimeError("end offsets must be resolved: %s" % end)
        if self._available_now_target is not None:
            self._verify_available_now(end_map)
        begin = self._concrete_start(start_map, end_map)
        new = [tp for tp in end_map if tp not in begin]
        earliest_of_new = self.offsets.earliest(new) if new else {}
        ranges = micro_batch_ranges(begin, end_map, earliest_of_new, self.options.fail_on_data_loss, log.warning)
        return self.input_partitions(ranges)

    def _verify_available_now(self, end: PartitionMap) -> None:
        target = self._available_now_target or {}
        if set(target) != set(end):
            raise RuntimeError(
                "Kafka data source in Trigger.AvailableNow should provide the same topic partitions in "
                "pre-fetched offset to end offset for each microbatch. topic-partitions for pre-fetched "
                "offset: %s, topic-partitions for end offset: %s."
                % (format_partitions(target), format_partitions(end))
            )
        if any(end[tp] > target[tp] for tp in end):
            raise RuntimeError(
                "For Kafka data source with Trigger.AvailableNow, end offset should have lower or equal "
                "offset per each topic partition than pre-fetched offset. pre-fetched offset: %s, end "
                "offset: %s." % (offsets_to_json(target), offsets_to_json(end))
            )

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        return self.read_partition(partition)

    def commit(self, end: dict) -> None:
        pass  # offsets live in Spark's checkpoint; nothing is committed to Kafka
