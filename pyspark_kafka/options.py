"""Options of the data source: parsed and checked at planning time, with Spark's names and messages.

Pure functions over the (lower-cased) option map Spark hands to a Python data source. Spark's
Kafka connector is the reference: the same option names, defaults and error messages, so a job
moves over by changing the format name. Unknown options are refused (Spark's connector ignores
them); `kafka.*` options go to the client.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

EARLIEST = -2
LATEST = -1

# Offsets and timestamps per partition: {topic: {partition: value}}.
PartitionMap = dict[tuple[str, int], int]


class OptionError(ValueError):
    """A bad or contradictory option (Spark raises IllegalArgumentException for these)."""


# canonical (camelCase) spelling of every option, keyed by its lower-case form
SOURCE_OPTIONS = [
    "assign", "subscribe", "subscribePattern",
    "startingOffsets", "endingOffsets", "startingTimestamp", "endingTimestamp",
    "startingOffsetsByTimestamp", "endingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy",
    "failOnDataLoss", "minPartitions", "maxRecordsPerPartition",
    "maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "groupIdPrefix", "includeHeaders", "kafkaConsumer.pollTimeoutMs",
    "fetchOffset.numRetries", "fetchOffset.retryIntervalMs",
]
SINK_OPTIONS = ["topic", "includeHeaders", "deliveryGuarantee", "transactionalIdPrefix"]
# options Spark itself adds to a data source's map
SPARK_OPTIONS = ["path", "checkpointLocation"]

STRATEGY_KEYS = ("subscribe", "subscribepattern", "assign")

INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_FALSE = (
    "Some data may have been lost because they are not available in Kafka any more; either the "
    "data was aged out by Kafka or the topic may have been deleted before all the data in the "
    "topic was processed. If you want your streaming query to fail on such cases, set the source "
    'option "failOnDataLoss" to "true".'
)
INSTRUCTION_FOR_FAIL_ON_DATA_LOSS_TRUE = (
    "Some data may have been lost because they are not available in Kafka any more; either the "
    "data was aged out by Kafka or the topic may have been deleted before all the data in the "
    "topic was processed. If you don't want your streaming query to fail on such cases, set the "
    'source option "failOnDataLoss" to "false".'
)

_AUTO_OFFSET_RESET_MESSAGE = (
    "Kafka option 'auto.offset.reset' is not supported.\n"
    "Instead set the source option 'startingoffsets' to 'earliest' or 'latest'\n"
    "to specify where to start. Structured Streaming manages which offsets are consumed\n"
    "internally, rather than relying on the kafkaConsumer to do it. This will ensure that no\n"
    "data is missed when new topics/partitions are dynamically subscribed. Note that\n"
    "'startingoffsets' only applies when a new Streaming query is started, and\n"
    "that resuming will always pick up from where the query left off. See the docs for more\n"
    "details."
)


# --- offset range limits (Spark's KafkaOffsetRangeLimit) -------------------------------------


@dataclass(frozen=True)
class Earliest:
    pass


@dataclass(frozen=True)
class Latest:
    pass


@dataclass(frozen=True)
class SpecificOffsets:
    offsets: PartitionMap


@dataclass(frozen=True)
class SpecificTimestamps:
    timestamps: PartitionMap
    no_match_latest: bool  # startingOffsetsByTimestampStrategy=latest


@dataclass(frozen=True)
class GlobalTimestamp:
    timestamp: int
    no_match_latest: bool


OffsetLimit = Earliest | Latest | SpecificOffsets | SpecificTimestamps | GlobalTimestamp


# --- topic selection (Spark's ConsumerStrategy) ----------------------------------------------


@dataclass(frozen=True)
class Assign:
    partitions: tuple[tuple[str, int], ...]


@dataclass(frozen=True)
class Subscribe:
    topics: tuple[str, ...]


@dataclass(frozen=True)
class SubscribePattern:
    pattern: str


Strategy = Assign | Subscribe | SubscribePattern


def topic_matches(strategy: Strategy, topic: str) -> bool:
    if isinstance(strategy, Subscribe):
        return topic in strategy.topics
    if isinstance(strategy, Assign):
        return any(t == topic for t, _ in strategy.partitions)
    # Java's Matcher.find(): the pattern may match anywhere in the name
    return re.search(strategy.pattern, topic) is not None


# --- JSON helpers (Spark's JsonUtils) ---------------------------------------------------------


def parse_partitions(text: str) -> tuple[tuple[str, int], ...]:
    try:
        parsed = json.loads(text)
        if not isinstance(parsed, dict):
            raise TypeError
        return tuple((str(t), _as_int(p)) for t, parts in parsed.items() for p in parts)
    except (ValueError, TypeError) as e:
        raise OptionError('Expected e.g. {"topicA":[0,1],"topicB":[0,1]}, got %s' % text) from e


def parse_partition_offsets(text: str) -> PartitionMap:
    try:
        return _partition_map(text)
    except (ValueError, TypeError) as e:
        raise OptionError('Expected e.g. {"topicA":{"0":23,"1":-1},"topicB":{"0":-2}}, got %s' % text) from e


def parse_partition_timestamps(text: str) -> PartitionMap:
    try:
        return _partition_map(text)
    except (ValueError, TypeError) as e:
        raise OptionError(
            'Expected e.g. {"topicA": {"0": 123456789, "1": 123456789},\n'
            '"topicB": {"0": 123456789, "1": 123456789}}, got %s' % text
        ) from e


def _partition_map(text: str) -> PartitionMap:
    parsed = json.loads(text)
    if not isinstance(parsed, dict):
        raise TypeError("not an object")
    out: PartitionMap = {}
    for topic, parts in parsed.items():
        if not isinstance(parts, dict):
            raise TypeError("not an object")
        for p, value in parts.items():
            out[(str(topic), _as_int(p))] = _as_int(value)
    return out


def _as_int(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError("not an integer: %r" % (value,))
    return int(value)


def offsets_to_json(offsets: Mapping[tuple[str, int], int]) -> dict[str, dict[str, int]]:
    """The checkpointed offset: {"topic": {"partition": offset}}, sorted as Spark writes it."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition) in sorted(offsets):
        out.setdefault(topic, {})[str(partition)] = offsets[(topic, partition)]
    return out


def offsets_from_json(value: Mapping[str, Mapping[str, int]]) -> PartitionMap:
    return {(topic, int(p)): int(o) for topic, parts in value.items() for p, o in parts.items()}


def format_partitions(partitions: Any) -> str:
    """Set(topic-0, topic-1) as Spark prints a Set[TopicPartition]."""
    return "Set(%s)" % ", ".join("%s-%d" % tp for tp in sorted(partitions))


# --- the parsed option sets -------------------------------------------------------------------


@dataclass(frozen=True)
class SourceOptions:
    strategy: Strategy
    kafka: dict[str, str]
    starting: OffsetLimit
    ending: OffsetLimit
    fail_on_data_loss: bool = True
    include_headers: bool = False
    min_partitions: int | None = None
    max_records_per_partition: int | None = None
    max_offsets_per_trigger: int | None = None
    min_offsets_per_trigger: int | None = None
    max_trigger_delay_ms: int = 15 * 60 * 1000
    poll_timeout_ms: int = 120_000
    fetch_offset_retries: int = 3
    fetch_offset_retry_interval_ms: int = 1000
    group_id: str = ""
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SinkOptions:
    topic: str | None
    kafka: dict[str, str]
    exactly_once: bool
    transactional_id_prefix: str


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def kafka_params(options: Mapping[str, str]) -> dict[str, str]:
    """`kafka.*` options without the prefix: the client's configuration."""
    return {k[len("kafka."):]: v for k, v in options.items() if k.lower().startswith("kafka.")}


def _check_known(opts: Mapping[str, str], known: list[str], what: str) -> None:
    canonical = {k.lower(): k for k in known + SPARK_OPTIONS}
    unknown = sorted(k for k in opts if not k.startswith("kafka.") and k not in canonical)
    if unknown:
        raise OptionError(
            "Unknown option%s %s for the Kafka %s. Known options: %s, and kafka.* for the client."
            % ("s" if len(unknown) > 1 else "", ", ".join("'%s'" % k for k in unknown), what,
               ", ".join(known))
        )


def _bool(opts: Mapping[str, str], key: str, default: bool) -> bool:
    value = opts.get(key.lower())
    if value is None:
        return default
    v = value.strip().lower()
    if v not in ("true", "false"):
        raise OptionError("%s must be 'true' or 'false', got '%s'" % (key, value))
    return v == "true"


def _long(opts: Mapping[str, str], key: str) -> int | None:
    value = opts.get(key.lower())
    if value is None:
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise OptionError("%s must be a number, got '%s'" % (key, value)) from None


_TIME_UNITS = {"us": 0.001, "ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def time_string_as_ms(text: str) -> int:
    """Spark's Utils.timeStringAsMs: "15m", "30s", "100ms", a bare number is milliseconds."""
    m = re.fullmatch(r"\s*(-?\d+)\s*([a-z]*)\s*", text.lower())
    if not m or m.group(2) not in ("",) + tuple(_TIME_UNITS):
        raise OptionError("Invalid time string: %s" % text)
    return int(int(m.group(1)) * _TIME_UNITS.get(m.group(2) or "ms", 1))


def _strategy(opts: Mapping[str, str]) -> Strategy:
    given = [k for k in STRATEGY_KEYS if k in opts]
    names = ", ".join(STRATEGY_KEYS)
    if not given:
        raise OptionError(
            "One of the following options must be specified for Kafka source: %s. "
            "See the docs for more details." % names
        )
    if len(given) > 1:
        raise OptionError(
            "Only one of the following options can be specified for Kafka source: %s. "
            "See the docs for more details." % names
        )
    key, value = given[0], opts[given[0]]
    if key == "assign":
        if not value.strip().startswith("{"):
            raise OptionError(
                "No topicpartitions to assign as specified value for option 'assign' is '%s'" % value
            )
        return Assign(parse_partitions(value))
    if key == "subscribe":
        topics = tuple(t.strip() for t in value.split(",") if t.strip())
        if not topics:
            raise OptionError(
                "No topics to subscribe to as specified value for option 'subscribe' is '%s'" % value
            )
        return Subscribe(topics)
    pattern = value.strip()
    if not pattern:
        raise OptionError(
            "Pattern to subscribe is empty as specified value for option 'subscribePattern' is '%s'"
            % value
        )
    try:
        re.compile(pattern)
    except re.error as e:
        raise OptionError("Invalid subscribePattern '%s': %s" % (pattern, e)) from None
    return SubscribePattern(pattern)


def _offset_limit(opts: Mapping[str, str], global_ts_key: str, by_ts_key: str, offsets_key: str,
                  default: OffsetLimit) -> OffsetLimit:
    """Spark's getKafkaOffsetRangeLimit: a global timestamp wins over per-partition timestamps,
    which win over offsets."""
    strategy = opts.get("startingoffsetsbytimestampstrategy", "error").strip().lower()
    if strategy not in ("error", "latest"):
        raise OptionError(
            "startingOffsetsByTimestampStrategy must be 'error' or 'latest', got '%s'" % strategy
        )
    latest_on_no_match = strategy == "latest"
    if global_ts_key in opts:
        text = opts[global_ts_key].strip()
        try:
            return GlobalTimestamp(int(text), latest_on_no_match)
        except ValueError:
            raise OptionError("Expected a single long value, got %s" % text) from None
    if by_ts_key in opts:
        return SpecificTimestamps(parse_partition_timestamps(opts[by_ts_key].strip()), latest_on_no_match)
    value = opts.get(offsets_key)
    if value is None:
        return default
    value = value.strip()
    if value.lower() == "latest":
        return Latest()
    if value.lower() == "earliest":
        return Earliest()
    return SpecificOffsets(parse_partition_offsets(value))


def _starting(opts: Mapping[str, str], default: OffsetLimit) -> OffsetLimit:
    return _offset_limit(opts, "startingtimestamp", "startingoffsetsbytimestamp", "startingoffsets", default)


def _ending(opts: Mapping[str, str]) -> OffsetLimit:
    return _offset_limit(opts, "endingtimestamp", "endingoffsetsbytimestamp", "endingoffsets", Latest())


def _check_start_not_after_end(start: OffsetLimit, end: OffsetLimit) -> None:
    """Spark's checkOffsetLimitValidity for specific offsets and timestamps on both ends."""
    pairs: tuple[PartitionMap, PartitionMap] | None = None
    kind = "offset"
    if isinstance(start, SpecificOffsets) and isinstance(end, SpecificOffsets):
        pairs = (start.offsets, end.offsets)
    elif isinstance(start, SpecificTimestamps) and isinstance(end, SpecificTimestamps):
        pairs = (start.timestamps, end.timestamps)
        kind = "timestamp"
    if pairs is None:
        return
    s, e = pairs
    if set(s) != set(e):
        raise OptionError(
            "The specified start offset and end offset should have the same topic-partitions. "
            "Topic-partitions for start offset: %s, topic-partitions for end offset: %s."
            % (format_partitions(s), format_partitions(e))
        )
    for tp in sorted(s):
        if s[tp] > e[tp] and s[tp] >= 0 and e[tp] >= 0:
            raise OptionError(
                "The specified start %s %d is greater than the end %s %d for topic %s partition %d."
                % (kind, s[tp], kind, e[tp], tp[0], tp[1])
            )


def _general(opts: dict[str, str], streaming: bool) -> dict[str, Any]:
    _check_known(opts, SOURCE_OPTIONS, "source")
    strategy = _strategy(opts)
    min_partitions = _long(opts, "minPartitions")
    if min_partitions is not None and min_partitions <= 0:
        raise OptionError("minPartitions must be positive")
    max_records = _long(opts, "maxRecordsPerPartition")
    if max_records is not None and max_records <= 0:
        raise OptionError("maxRecordsPerPartition must be positive")
    kafka = kafka_params(opts)
    if "auto.offset.reset" in kafka:
        raise OptionError(_AUTO_OFFSET_RESET_MESSAGE)
    for java_only, what in (("key.deserializer", "keys"), ("value.deserializer", "values")):
        if java_only in kafka:
            raise OptionError(
                "Kafka option '%s' is not supported as %s are deserialized as byte arrays with "
                "ByteArrayDeserializer. Use DataFrame operations to explicitly deserialize the %s."
                % (java_only, what, what)
            )
    for unsupported in ("enable.auto.commit", "interceptor.classes"):
        if unsupported in kafka:
            raise OptionError("Kafka option '%s' is not supported" % unsupported)
    if "bootstrap.servers" not in kafka:
        raise OptionError(
            "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka consumer"
        )
    max_offsets = _long(opts, "maxOffsetsPerTrigger")
    min_offsets = _long(opts, "minOffsetsPerTrigger")
    if max_offsets is not None and max_offsets <= 0:
        raise OptionError("maxOffsetsPerTrigger must be positive")
    if min_offsets is not None and max_offsets is not None and min_offsets > max_offsets:
        raise OptionError(
            "The value of minOffsetPerTrigger(%d) is higher than the maxOffsetsPerTrigger(%d)."
            % (min_offsets, max_offsets)
        )
    warnings = []
    if "group.id" in kafka:
        warnings.append(
            "Kafka option 'kafka.group.id' has been set on this query; this source never joins the "
            "group nor commits offsets with it, so it only names the client's group."
        )
    prefix = opts.get("groupidprefix", "spark-kafka-source" if streaming else "spark-kafka-relation")
    group_id = kafka.get("group.id") or "%s-%s" % (prefix, uuid.uuid4())
    poll_timeout = _long(opts, "kafkaConsumer.pollTimeoutMs")
    retries = _long(opts, "fetchOffset.numRetries")
    retry_interval = _long(opts, "fetchOffset.retryIntervalMs")
    return dict(
        strategy=strategy,
        kafka=kafka,
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        include_headers=_bool(opts, "includeHeaders", False),
        min_partitions=min_partitions,
        max_records_per_partition=max_records,
        max_offsets_per_trigger=max_offsets,
        min_offsets_per_trigger=min_offsets,
        max_trigger_delay_ms=time_string_as_ms(opts.get("maxtriggerdelay", "15m")),
        poll_timeout_ms=120_000 if poll_timeout is None else poll_timeout,
        fetch_offset_retries=3 if retries is None else retries,
        fetch_offset_retry_interval_ms=1000 if retry_interval is None else retry_interval,
        group_id=group_id,
        warnings=warnings,
    )


def batch_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Spark's validateBatchOptions."""
    opts = _lower(options)
    starting = _starting(opts, Earliest())
    if isinstance(starting, Latest):
        raise OptionError("starting offset can't be latest for batch queries on Kafka")
    if isinstance(starting, SpecificOffsets):
        for tp, off in sorted(starting.offsets.items()):
            if off == LATEST:
                raise OptionError(
                    "startingOffsets for %s-%d can't be latest for batch queries on Kafka" % tp
                )
    ending = _ending(opts)
    if isinstance(ending, Earliest):
        raise OptionError("ending offset can't be earliest for batch queries on Kafka")
    if isinstance(ending, SpecificOffsets):
        for tp, off in sorted(ending.offsets.items()):
            if off == EARLIEST:
                raise OptionError(
                    "ending offset for %s-%d can't be earliest for batch queries on Kafka" % tp
                )
    general = _general(opts, streaming=False)
    _check_start_not_after_end(starting, ending)
    for ignored in ("maxOffsetsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay"):
        if ignored.lower() in opts:
            general["warnings"].append("%s option ignored in batch queries" % ignored)
    return SourceOptions(starting=starting, ending=ending, **general)


def stream_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Spark's validateStreamOptions."""
    opts = _lower(options)
    if "endingoffsets" in opts:
        raise OptionError("ending offset not valid in streaming queries")
    if "endingoffsetsbytimestamp" in opts or "endingtimestamp" in opts:
        raise OptionError("ending timestamp not valid in streaming queries")
    general = _general(opts, streaming=True)
    return SourceOptions(starting=_starting(opts, Latest()), ending=Latest(), **general)


def sink_options(options: Mapping[str, str], streaming: bool) -> SinkOptions:
    """Options of the sink; streaming writes are exactly-once unless deliveryGuarantee says otherwise."""
    opts = _lower(options)
    _check_known(opts, SINK_OPTIONS, "sink")
    kafka = kafka_params(opts)
    if "key.serializer" in kafka:
        raise OptionError(
            "Kafka option 'key.serializer' is not supported as keys are serialized with ByteArraySerializer."
        )
    if "value.serializer" in kafka:
        raise OptionError(
            "Kafka option 'value.serializer' is not supported as value are serialized with "
            "ByteArraySerializer."
        )
    if "bootstrap.servers" not in kafka:
        raise OptionError(
            "Option 'kafka.bootstrap.servers' must be specified for configuring Kafka producer"
        )
    guarantee = opts.get("deliveryguarantee", "exactly-once" if streaming else "at-least-once").strip().lower()
    if guarantee not in ("exactly-once", "at-least-once"):
        raise OptionError(
            "deliveryGuarantee must be 'exactly-once' or 'at-least-once', got '%s'" % guarantee
        )
    if guarantee == "exactly-once" and not streaming:
        raise OptionError(
            "deliveryGuarantee 'exactly-once' is for streaming writes; batch writes are at-least-once"
        )
    if guarantee == "exactly-once" and "transactional.id" in kafka:
        raise OptionError(
            "Kafka option 'transactional.id' is not supported: exactly-once writes derive one "
            "transactional id per query and task (see transactionalIdPrefix)"
        )
    topic = opts.get("topic")
    return SinkOptions(
        topic=topic.strip() if topic is not None else None,
        kafka=kafka,
        exactly_once=guarantee == "exactly-once",
        transactional_id_prefix=opts.get("transactionalidprefix", "pyspark-kafka").strip(),
    )
