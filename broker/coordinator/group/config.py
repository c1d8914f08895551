"""The group coordinator's settings, under Kafka's property names and with Kafka's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

INT32_MAX = 2**31 - 1


@dataclass(frozen=True)
class GroupCoordinatorConfig:
    num_partitions: int = 50  # offsets.topic.num.partitions
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    max_size: int = INT32_MAX  # group.max.size
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes
    offsets_retention_ms: int = 7 * 24 * 60 * 60 * 1000  # offsets.retention.minutes
    offsets_retention_check_interval_ms: int = 600000  # offsets.retention.check.interval.ms
    # Kafka's fixed timeout for a new member's parked JoinGroup (CLASSIC_GROUP_NEW_MEMBER_JOIN_TIMEOUT_MS).
    new_member_join_timeout_ms: int = 5 * 60 * 1000

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> GroupCoordinatorConfig:
        """From broker properties (missing ones take Kafka's defaults)."""
        d = cls()

        def get(name: str, default: int) -> int:
            raw = values.get(name)
            return default if raw is None else int(raw)

        return cls(
            num_partitions=get("offsets.topic.num.partitions", d.num_partitions),
            min_session_timeout_ms=get("group.min.session.timeout.ms", d.min_session_timeout_ms),
            max_session_timeout_ms=get("group.max.session.timeout.ms", d.max_session_timeout_ms),
            initial_rebalance_delay_ms=get("group.initial.rebalance.delay.ms", d.initial_rebalance_delay_ms),
            max_size=get("group.max.size", d.max_size),
            offset_metadata_max_bytes=get("offset.metadata.max.bytes", d.offset_metadata_max_bytes),
            offsets_retention_ms=get("offsets.retention.minutes", d.offsets_retention_ms // 60000) * 60000,
            offsets_retention_check_interval_ms=get(
                "offsets.retention.check.interval.ms", d.offsets_retention_check_interval_ms
            ),
        )
