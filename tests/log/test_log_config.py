"""LogConfig: Kafka names, defaults, validation, broker synonyms."""

from __future__ import annotations

import pytest

from broker.log.config import DEFAULT_MAX_MESSAGE_BYTES, LONG_MAX, LogConfig
from protocol.errors import ErrorCode, KafkaError


def test_kafka_defaults() -> None:
    cfg = LogConfig()
    assert cfg.segment_bytes == 1 << 30
    assert cfg.segment_ms == 7 * 24 * 3600 * 1000
    assert cfg.segment_index_bytes == 10 * 1024 * 1024
    assert cfg.index_interval_bytes == 4096
    assert cfg.retention_ms == 7 * 24 * 3600 * 1000
    assert cfg.retention_bytes == -1
    assert cfg.cleanup_policy == ("delete",)
    assert cfg.max_message_bytes == DEFAULT_MAX_MESSAGE_BYTES == 1048588
    assert cfg.message_timestamp_type == "CreateTime"
    assert cfg.message_timestamp_before_max_ms == LONG_MAX
    assert cfg.message_timestamp_after_max_ms == 3600000
    assert cfg.flush_messages == LONG_MAX and cfg.flush_ms == LONG_MAX
    assert cfg.delete_retention_ms == 86400000
    assert cfg.min_cleanable_dirty_ratio == 0.5
    assert cfg.min_compaction_lag_ms == 0
    assert cfg.file_delete_delay_ms == 60000
    assert cfg.preallocate is False


def test_from_properties_parses_and_keeps_passive_names() -> None:
    cfg = LogConfig.from_properties(
        {
            "segment.bytes": "1048576",
            "cleanup.policy": "compact,delete",
            "min.cleanable.dirty.ratio": "0.1",
            "message.timestamp.type": "LogAppendTime",
            "preallocate": "true",
            "min.insync.replicas": "2",
            "retention.ms": None,
        }
    )
    assert cfg.segment_bytes == 1048576
    assert cfg.compact and cfg.delete
    assert cfg.min_cleanable_dirty_ratio == 0.1
    assert cfg.log_append_time
    assert cfg.preallocate is True
    assert cfg.retention_ms == LogConfig().retention_ms
    props = cfg.to_properties()
    assert props["min.insync.replicas"] == "2"
    assert props["cleanup.policy"] == "compact,delete"
    assert props["preallocate"] == "true"


@pytest.mark.parametrize(
    "name,value",
    [
        ("segment.bytes", "1000"),  # below Kafka's 1 MiB floor
        ("segment.bytes", "abc"),
        ("retention.ms", "-2"),
        ("cleanup.policy", "compact,shred"),
        ("min.cleanable.dirty.ratio", "1.5"),
        ("message.timestamp.type", "WallClock"),
        ("preallocate", "yes"),
        ("flush.messages", "0"),
        ("no.such.config", "1"),
        ("min.insync.replicas", "0"),
    ],
)
def test_invalid_values_raise_invalid_config(name: str, value: str) -> None:
    with pytest.raises(KafkaError) as e:
        LogConfig.from_properties({name: value})
    assert e.value.code is ErrorCode.INVALID_CONFIG


def test_internal_segment_bytes_bypasses_the_floor() -> None:
    assert LogConfig.from_properties({"internal.segment.bytes": "1000"}).segment_bytes == 1000


def test_broker_synonyms_with_units_and_priority() -> None:
    cfg = LogConfig.from_broker_properties(
        {
            "log.retention.hours": "1",
            "log.roll.hours": "2",
            "log.roll.ms": "5000",  # wins over log.roll.hours
            "message.max.bytes": "2000",
            "log.cleaner.delete.retention.ms": "10",
            "log.flush.interval.messages": "1",
            "log.cleanup.policy": "compact",
        }
    )
    assert cfg.retention_ms == 3600_000
    assert cfg.segment_ms == 5000
    assert cfg.max_message_bytes == 2000
    assert cfg.delete_retention_ms == 10
    assert cfg.flush_messages == 1
    assert cfg.compact and not cfg.delete
    # Topic overrides go on top of the broker defaults.
    topic = LogConfig.from_properties({"retention.ms": "-1"}, defaults=cfg)
    assert topic.retention_ms == -1 and topic.max_message_bytes == 2000
    assert LogConfig.from_broker_properties({"log.retention.hours": "-1"}).retention_ms == -1
