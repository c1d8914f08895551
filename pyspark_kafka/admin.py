"""Driver side: which partitions a query reads and their offsets (Spark's KafkaOffsetReaderAdmin).

Uses confluent-kafka's AdminClient: Metadata for the partitions, ListOffsets for earliest,
latest (the last stable offset under read_committed) and by timestamp.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from confluent_kafka import IsolationLevel, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from pyspark_kafka.options import (
    EARLIEST,
    LATEST,
    Assign,
    Earliest,
    GlobalTimestamp,
    Latest,
    OffsetLimit,
    OptionError,
    PartitionMap,
    SourceOptions,
    SpecificOffsets,
    SpecificTimestamps,
    Strategy,
    format_partitions,
    topic_matches,
)

log = logging.getLogger("pyspark_kafka")

INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})
# consumer-only settings an AdminClient would only warn about
_CONSUMER_ONLY = ("group.", "isolation.level", "fetch.", "queued.", "enable.partition.eof", "auto.",
                  "session.timeout.ms", "heartbeat.interval.ms", "max.poll.interval.ms", "partition.assignment.strategy",
                  "check.crcs", "enable.auto.offset.store")

T = TypeVar("T")


def admin_config(kafka: dict[str, str]) -> dict[str, Any]:
    conf: dict[str, Any] = {k: v for k, v in kafka.items() if not k.startswith(_CONSUMER_ONLY)}
    conf["logger"] = log
    return conf


def make_admin(kafka: dict[str, str]) -> AdminClient:
    """An AdminClient; a configuration the client does not accept is an option error."""
    try:
        return AdminClient(admin_config(kafka))
    except KafkaException as e:
        raise OptionError("Invalid kafka.* option: %s" % e.args[0].str()) from None
    except (TypeError, ValueError) as e:
        raise OptionError("Invalid kafka.* option: %s" % e) from None


class OffsetReader:
    def __init__(self, options: SourceOptions, request_timeout: float = 30.0) -> None:
        self.options = options
        self.strategy: Strategy = options.strategy
        self.timeout = request_timeout
        level = options.kafka.get("isolation.level", "read_uncommitted").strip().lower()
        if level not in ("read_uncommitted", "read_committed"):
            raise OptionError("kafka.isolation.level must be read_uncommitted or read_committed, got '%s'" % level)
        self.isolation = IsolationLevel.READ_COMMITTED if level == "read_committed" else IsolationLevel.READ_UNCOMMITTED
        self.admin = make_admin(options.kafka)

    # --- retries (Spark's withRetries: fetchOffset.numRetries, fetchOffset.retryIntervalMs) ---

    def _with_retries(self, body: Callable[[], T]) -> T:
        attempts = max(1, self.options.fetch_offset_retries)
        for attempt in range(1, attempts + 1):
            try:
                return body()
            except KafkaException as e:
                if attempt == attempts:
                    raise
                log.warning("Error in attempt %d getting Kafka offsets: %s", attempt, e)
                time.sleep(self.options.fetch_offset_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    # --- partitions ---

    def partitions(self) -> set[tuple[str, int]]:
        return self._with_retries(self._partitions)

    def _partitions(self) -> set[tuple[str, int]]:
        md = self.admin.list_topics(timeout=self.timeout)
        out: set[tuple[str, int]] = set()
        strategy = self.strategy
        for name, topic in md.topics.items():
            if name in INTERNAL_TOPICS or not topic_matches(strategy, name):
                continue
            if topic.error is not None:
                continue
            for p in topic.partitions:
                if isinstance(strategy, Assign) and (name, p) not in strategy.partitions:
                    continue
                out.add((name, p))
        return out

    # --- offsets ---

    def _list(self, specs: dict[tuple[str, int], OffsetSpec]) -> dict[tuple[str, int], int]:
        if not specs:
            return {}

        def body() -> dict[tuple[str, int], int]:
            request = {TopicPartition(t, p): spec for (t, p), spec in specs.items()}
            futures = self.admin.list_offsets(request, isolation_level=self.isolation, request_timeout=self.timeout)
            return {(tp.topic, tp.partition): f.result().offset for tp, f in futures.items()}

        return self._with_retries(body)

    def earliest(self, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self._list({tp: OffsetSpec.earliest() for tp in tps})

    def latest(self, tps: Iterable[tuple[str, int]]) -> dict[tuple[str, int], int]:
        return self._list({tp: OffsetSpec.latest() for tp in tps})

    def for_timestamps(self, timestamps: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """The first offset at or after each timestamp; -1 where there is none."""
        return self._list({tp: OffsetSpec.for_timestamp(ts) for tp, ts in timestamps.items()})

    def latest_checked(self, known: PartitionMap) -> PartitionMap:
        """Latest offsets of the current partitions, fetched again (fetchOffset.numRetries times)
        while some went below an offset already seen (Spark's fetchLatestOffsets)."""
        attempts = max(1, self.options.fetch_offset_retries)
        for attempt in range(1, attempts + 1):
            latest = self.latest(self.partitions())
            wrong = [(tp, known[tp], off) for tp, off in latest.items() if tp in known and known[tp] > off]
            if not wrong or attempt == attempts:
                return latest
            log.warning("Found incorrect offsets in some partitions (partition, previous offset, "
                        "fetched offset): %s; retrying", wrong)
            time.sleep(self.options.fetch_offset_retry_interval_ms / 1000.0)
        raise AssertionError("unreachable")

    # --- an offset limit resolved to concrete offsets ---

    def resolve(self, limit: OffsetLimit, is_start: bool, symbolic: bool = False) -> PartitionMap:
        """Offsets of every assigned partition for a starting/ending limit.

        With `symbolic`, earliest/latest stay as -2/-1 (a streaming query's initial offset, see
        planning.resolve_start); otherwise they are looked up."""
        partitions = self.partitions()
        offsets: PartitionMap
        if isinstance(limit, Earliest):
            offsets = dict.fromkeys(partitions, EARLIEST)
        elif isinstance(limit, Latest):
            offsets = dict.fromkeys(partitions, LATEST)
        elif isinstance(limit, SpecificOffsets):
            if set(limit.offsets) != partitions:
                raise OptionError(
                    "Partitions specified for Kafka %s offsets don't match what are assigned. Maybe "
                    "topic partitions are created or deleted while the query is running. Use -1 for "
                    "latest, -2 for earliest. Specified: %s Assigned: %s"
                    % ("start" if is_start else "end", format_partitions(limit.offsets), format_partitions(partitions))
                )
            offsets = dict(limit.offsets)
        else:
            if isinstance(limit, SpecificTimestamps):
                if set(limit.timestamps) != partitions:
                    raise OptionError(
                        "Partitions specified for Kafka timestamp based %s offsets don't match what "
                        "are assigned. Maybe topic partitions are created or deleted while the query "
                        "is running, or you didn't specify all the partitions. Specified: %s Assigned: %s"
                        % ("start" if is_start else "end", format_partitions(limit.timestamps),
                           format_partitions(partitions))
                    )
                timestamps = dict(limit.timestamps)
            else:
                assert isinstance(limit, GlobalTimestamp)
                timestamps = dict.fromkeys(partitions, limit.timestamp)
            offsets = {}
            for tp, off in self.for_timestamps(timestamps).items():
                if off == -1:  # no record at or after the timestamp
                    if is_start and not limit.no_match_latest:
                        raise OptionError(
                            "No offset matched from request of topic-partition %s-%d and timestamp %d."
                            % (tp[0], tp[1], timestamps[tp])
                        )
                    off = LATEST
                offsets[tp] = off
        if symbolic:
            return offsets
        return self.concrete(offsets)

    def concrete(self, offsets: PartitionMap) -> PartitionMap:
        """-2/-1 replaced by the partitions' earliest/latest offsets."""
        earliest = self.earliest([tp for tp, o in offsets.items() if o == EARLIEST])
        latest = self.latest([tp for tp, o in offsets.items() if o == LATEST])
        return {tp: earliest.get(tp, latest.get(tp, o)) if o < 0 else o for tp, o in offsets.items()}
