"""Topic-level log configuration with Kafka's names, defaults and broker-wide synonyms.

`LogConfig` is an immutable value; a log swaps in a new one at runtime (`Log.update_config`).
Build it from string properties (CreateTopics / AlterConfigs / a properties file) with
`LogConfig.from_properties`, which raises KafkaError(INVALID_CONFIG) on a bad name or value.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.errors import ErrorCode, KafkaError

LONG_MAX = (1 << 63) - 1
INT_MAX = (1 << 31) - 1
LONG_MIN = -(1 << 63)

# Kafka's max.message.bytes default: 1 MiB plus the 12-byte log overhead (offset + length).
DEFAULT_MAX_MESSAGE_BYTES = 1024 * 1024 + 12

COMPRESSION_TYPES = ("uncompressed", "zstd", "lz4", "snappy", "gzip", "producer")


@dataclass(frozen=True)
class LogConfig:
    """The per-partition settings the storage engine honours (Kafka topic config names in comments)."""

    segment_bytes: int = 1024 * 1024 * 1024  # segment.bytes
    segment_ms: int = 7 * 24 * 3600 * 1000  # segment.ms
    segment_jitter_ms: int = 0  # segment.jitter.ms
    segment_index_bytes: int = 10 * 1024 * 1024  # segment.index.bytes
    index_interval_bytes: int = 4096  # index.interval.bytes
    retention_ms: int = 7 * 24 * 3600 * 1000  # retention.ms (-1: infinite)
    retention_bytes: int = -1  # retention.bytes (-1: infinite)
    cleanup_policy: tuple[str, ...] = ("delete",)  # cleanup.policy
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # max.message.bytes
    message_timestamp_type: str = "CreateTime"  # message.timestamp.type
    message_timestamp_before_max_ms: int = LONG_MAX  # message.timestamp.before.max.ms
    message_timestamp_after_max_ms: int = 3600000  # message.timestamp.after.max.ms
    flush_messages: int = LONG_MAX  # flush.messages
    flush_ms: int = LONG_MAX  # flush.ms
    delete_retention_ms: int = 24 * 3600 * 1000  # delete.retention.ms
    min_cleanable_dirty_ratio: float = 0.5  # min.cleanable.dirty.ratio
    min_compaction_lag_ms: int = 0  # min.compaction.lag.ms
    max_compaction_lag_ms: int = LONG_MAX  # max.compaction.lag.ms
    file_delete_delay_ms: int = 60000  # file.delete.delay.ms
    preallocate: bool = False  # preallocate
    compression_type: str = "producer"  # compression.type (stored; the log keeps the producer's codec)
    # Topic configs the log does not act on but that are valid names, kept for DescribeConfigs.
    extra: tuple[tuple[str, str], ...] = ()

    @property
    def compact(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def delete(self) -> bool:
        return "delete" in self.cleanup_policy

    @property
    def log_append_time(self) -> bool:
        return self.message_timestamp_type == "LogAppendTime"

    def with_overrides(self, props: Mapping[str, str | None]) -> LogConfig:
        """A copy with the given topic-level properties applied (validated); None values are ignored."""
        changes: dict[str, Any] = {}
        extra = dict(self.extra)
        for name, raw in props.items():
            if raw is None:
                continue
            if name == "internal.segment.bytes":  # Kafka's test-only escape hatch below the 1 MiB floor
                changes["segment_bytes"] = _parse_int(name, raw, 1, INT_MAX)
                continue
            spec = TOPIC_CONFIGS.get(name)
            if spec is None:
                raise KafkaError(ErrorCode.INVALID_CONFIG, f"Unknown topic config name: {name}")
            if spec.attr is None:
                extra[name] = _validate_passive(name, raw)
                continue
            changes[spec.attr] = spec.parse(name, raw)
        changes["extra"] = tuple(sorted(extra.items()))
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_properties(cls, props: Mapping[str, str | None], defaults: LogConfig | None = None) -> LogConfig:
        """Topic properties (Kafka names, string values) over `defaults` (broker-wide or Kafka's)."""
        return (defaults or cls()).with_overrides(props)

    @classmethod
    def from_broker_properties(cls, props: Mapping[str, str]) -> LogConfig:
        """Broker-wide defaults from `log.*` synonyms (log.segment.bytes, log.retention.hours, message.max.bytes...)."""
        topic_props: dict[str, str] = {}
        for topic_name, synonyms in BROKER_SYNONYMS.items():
            for broker_name, factor in synonyms:  # the first synonym present wins, as in Kafka
                if broker_name in props:
                    raw = props[broker_name]
                    if factor != 1:
                        value = _parse_int(broker_name, raw, LONG_MIN, LONG_MAX)
                        raw = str(value * factor if value >= 0 else value)
                    topic_props[topic_name] = raw
                    break
        return cls().with_overrides(topic_props)

    def to_properties(self) -> dict[str, str]:
        """Every topic config as Kafka would describe it (string values)."""
        out: dict[str, str] = {}
        for name, spec in TOPIC_CONFIGS.items():
            if spec.attr is not None:
                out[name] = spec.render(getattr(self, spec.attr))
        out.update(dict(self.extra))
        return out


# ---------------------------------------------------------------------------------------------
# Parsing and validation


def _invalid(name: str, raw: object, why: str) -> KafkaError:
    return KafkaError(ErrorCode.INVALID_CONFIG, f"Invalid value {raw} for configuration {name}: {why}")


def _parse_int(name: str, raw: str, lo: int, hi: int) -> int:
    try:
        value = int(str(raw).strip())
    except ValueError:
        raise _invalid(name, raw, "Not a number") from None
    if value < lo or value > hi:
        raise _invalid(name, raw, f"Value must be in [{lo}, {hi}]")
    return value


_THROTTLED_REPLICA = re.compile(r"([0-9]+:[0-9]+)?")


def _parse_throttled_replicas(name: str, raw: str) -> str:
    """Kafka's ThrottledReplicaListValidator: `*` or `partition:broker` pairs."""
    proposed = [part.strip() for part in str(raw).split(",")]
    if not (all(_THROTTLED_REPLICA.fullmatch(p) for p in proposed) or "".join(proposed) == "*"):
        raise _invalid(name, raw, f"{name} must be the literal '*' or a list of replicas in the following format: "
                                  "[partitionId]:[brokerId],[partitionId]:[brokerId],...")
    return str(raw).strip()


def _parse_double(name: str, raw: str, lo: float, hi: float) -> float:
    try:
        value = float(str(raw).strip())
    except ValueError:
        raise _invalid(name, raw, "Not a number") from None
    if math.isnan(value) or value < lo or value > hi:
        raise _invalid(name, raw, f"Value must be in [{lo}, {hi}]")
    return value


def _parse_bool(name: str, raw: str) -> bool:
    text = str(raw).strip().lower()
    if text not in ("true", "false"):
        raise _invalid(name, raw, "Expected value to be either true or false")
    return text == "true"


def _parse_policy(name: str, raw: str) -> tuple[str, ...]:
    items = [p.strip() for p in str(raw).split(",") if p.strip()]
    for item in items:
        if item not in ("compact", "delete"):
            raise _invalid(name, raw, "String must be one of: compact, delete")
    # Kafka keeps the list as given; an empty list means neither deletion nor compaction.
    return tuple(dict.fromkeys(items))


def _parse_choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def parse(name: str, raw: str) -> str:
        text = str(raw).strip()
        if text not in choices:
            raise _invalid(name, raw, "String must be one of: " + ", ".join(choices))
        return text

    return parse


@dataclass(frozen=True)
class _Spec:
    attr: str | None
    parse: Callable[[str, str], Any]
    render: Callable[[Any], str] = str


def _int(lo: int, hi: int = INT_MAX) -> Callable[[str, str], int]:
    return lambda name, raw: _parse_int(name, raw, lo, hi)


def _long(lo: int) -> Callable[[str, str], int]:
    return lambda name, raw: _parse_int(name, raw, lo, LONG_MAX)


def _render_bool(value: Any) -> str:
    return "true" if value else "false"


TOPIC_CONFIGS: dict[str, _Spec] = {
    "segment.bytes": _Spec("segment_bytes", _int(1024 * 1024)),
    "segment.ms": _Spec("segment_ms", _long(1)),
    "segment.jitter.ms": _Spec("segment_jitter_ms", _long(0)),
    "segment.index.bytes": _Spec("segment_index_bytes", _int(4)),
    "index.interval.bytes": _Spec("index_interval_bytes", _int(0)),
    "retention.ms": _Spec("retention_ms", _long(-1)),
    "retention.bytes": _Spec("retention_bytes", _long(LONG_MIN)),
    "cleanup.policy": _Spec("cleanup_policy", _parse_policy, ",".join),
    "max.message.bytes": _Spec("max_message_bytes", _int(0)),
    "message.timestamp.type": _Spec("message_timestamp_type", _parse_choice(("CreateTime", "LogAppendTime"))),
    "message.timestamp.before.max.ms": _Spec("message_timestamp_before_max_ms", _long(0)),
    "message.timestamp.after.max.ms": _Spec("message_timestamp_after_max_ms", _long(0)),
    "flush.messages": _Spec("flush_messages", _long(1)),
    "flush.ms": _Spec("flush_ms", _long(0)),
    "delete.retention.ms": _Spec("delete_retention_ms", _long(0)),
    "min.cleanable.dirty.ratio": _Spec(
        "min_cleanable_dirty_ratio", lambda n, r: _parse_double(n, r, 0.0, 1.0)
    ),
    "min.compaction.lag.ms": _Spec("min_compaction_lag_ms", _long(0)),
    "max.compaction.lag.ms": _Spec("max_compaction_lag_ms", _long(1)),
    "file.delete.delay.ms": _Spec("file_delete_delay_ms", _long(0)),
    "preallocate": _Spec("preallocate", _parse_bool, _render_bool),
    "compression.type": _Spec("compression_type", _parse_choice(COMPRESSION_TYPES)),
    # Valid topic configs the storage engine does not act on (validated loosely, kept verbatim).
    "compression.gzip.level": _Spec(None, _int(-1, 9)),
    "compression.lz4.level": _Spec(None, _int(1, 17)),
    "compression.zstd.level": _Spec(None, _int(-131072, 22)),
    "min.insync.replicas": _Spec(None, _int(1)),
    "unclean.leader.election.enable": _Spec(None, _parse_bool),
    "message.downconversion.enable": _Spec(None, _parse_bool),
    "leader.replication.throttled.replicas": _Spec(None, _parse_throttled_replicas),
    "follower.replication.throttled.replicas": _Spec(None, _parse_throttled_replicas),
    "remote.storage.enable": _Spec(None, _parse_bool),
    "local.retention.ms": _Spec(None, _long(-2)),
    "local.retention.bytes": _Spec(None, _long(-2)),
    "remote.log.copy.disable": _Spec(None, _parse_bool),
    "remote.log.delete.on.disable": _Spec(None, _parse_bool),
    "errors.deadletterqueue.group.enable": _Spec(None, _parse_bool),  # KIP-1191 (Kafka 4.4)
}


def _validate_passive(name: str, raw: str) -> str:
    TOPIC_CONFIGS[name].parse(name, raw)
    return str(raw).strip()


# topic config name -> broker-wide synonyms in priority order, with a unit factor to milliseconds.
BROKER_SYNONYMS: dict[str, list[tuple[str, int]]] = {
    "segment.bytes": [("log.segment.bytes", 1)],
    "segment.ms": [("log.roll.ms", 1), ("log.roll.hours", 3600_000)],
    "segment.jitter.ms": [("log.roll.jitter.ms", 1), ("log.roll.jitter.hours", 3600_000)],
    "segment.index.bytes": [("log.index.size.max.bytes", 1)],
    "flush.messages": [("log.flush.interval.messages", 1)],
    "flush.ms": [("log.flush.interval.ms", 1), ("log.flush.scheduler.interval.ms", 1)],
    "retention.bytes": [("log.retention.bytes", 1)],
    "retention.ms": [
        ("log.retention.ms", 1),
        ("log.retention.minutes", 60_000),
        ("log.retention.hours", 3600_000),
    ],
    "max.message.bytes": [("message.max.bytes", 1)],
    "index.interval.bytes": [("log.index.interval.bytes", 1)],
    "delete.retention.ms": [("log.cleaner.delete.retention.ms", 1)],
    "min.compaction.lag.ms": [("log.cleaner.min.compaction.lag.ms", 1)],
    "max.compaction.lag.ms": [("log.cleaner.max.compaction.lag.ms", 1)],
    "file.delete.delay.ms": [("log.segment.delete.delay.ms", 1)],
    "min.cleanable.dirty.ratio": [("log.cleaner.min.cleanable.ratio", 1)],
    "cleanup.policy": [("log.cleanup.policy", 1)],
    "compression.type": [("compression.type", 1)],
    "preallocate": [("log.preallocate", 1)],
    "message.timestamp.type": [("log.message.timestamp.type", 1)],
    "message.timestamp.before.max.ms": [("log.message.timestamp.before.max.ms", 1)],
    "message.timestamp.after.max.ms": [("log.message.timestamp.after.max.ms", 1)],
    "min.insync.replicas": [("min.insync.replicas", 1)],
    "unclean.leader.election.enable": [("unclean.leader.election.enable", 1)],
}

# topic config -> broker synonyms in priority order with the factor to milliseconds
TOPIC_SYNONYMS: dict[str, list[tuple[str, int]]] = {
    **BROKER_SYNONYMS,
    "compression.gzip.level": [("compression.gzip.level", 1)],
    "compression.lz4.level": [("compression.lz4.level", 1)],
    "compression.zstd.level": [("compression.zstd.level", 1)],
    "local.retention.ms": [("log.local.retention.ms", 1)],
    "local.retention.bytes": [("log.local.retention.bytes", 1)],
}
