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
    # KIP-848 consumer groups (group.consumer.*).
    consumer_heartbeat_interval_ms: int = 5000  # group.consumer.heartbeat.interval.ms
    consumer_session_timeout_ms: int = 45000  # group.consumer.session.timeout.ms
    consumer_min_session_timeout_ms: int = 45000  # group.consumer.min.session.timeout.ms
    consumer_max_session_timeout_ms: int = 60000  # group.consumer.max.session.timeout.ms
    consumer_max_size: int = INT32_MAX  # group.consumer.max.size
    consumer_assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors; the first is the default
    # group.consumer.assignment.interval.ms (Kafka 4.3, KIP-1263): a new target assignment at most this
    # often. 0 (the default here) computes it at once, as Kafka 4.2 does; Kafka 4.3 defaults to 1000.
    consumer_assignment_interval_ms: int = 0
    consumer_regex_refresh_interval_ms: int = 10 * 60 * 1000  # group.consumer.regex.refresh.interval.ms
    consumer_migration_policy: str = "bidirectional"  # group.consumer.migration.policy
    consumer_min_heartbeat_interval_ms: int = 5000  # group.consumer.min.heartbeat.interval.ms
    consumer_max_heartbeat_interval_ms: int = 15000  # group.consumer.max.heartbeat.interval.ms
    # Share groups (group.share.*).
    share_heartbeat_interval_ms: int = 5000  # group.share.heartbeat.interval.ms
    share_min_heartbeat_interval_ms: int = 5000  # group.share.min.heartbeat.interval.ms
    share_max_heartbeat_interval_ms: int = 15000  # group.share.max.heartbeat.interval.ms
    share_session_timeout_ms: int = 45000  # group.share.session.timeout.ms
    share_min_session_timeout_ms: int = 45000  # group.share.min.session.timeout.ms
    share_max_session_timeout_ms: int = 60000  # group.share.max.session.timeout.ms
    share_max_size: int = 200  # group.share.max.size
    # Not a Kafka setting: the least a new classic group waits for its first members, whatever
    # group.initial.rebalance.delay.ms says. With a delay of 0 Kafka forms the group with the first
    # member to join; the others then force a second rebalance, which librdkafka joins at most once
    # a second: five consumers started together take over a second instead of a fifth of one.
    classic_min_initial_delay_ms: int = 200
    # group.heartbeat.hold.ms (not in Kafka): the longest a member's heartbeat with nothing new is
    # held until there is something to tell it (membership.py, consumer_wait.py, share_wait.py).
    # 0 (the default): every heartbeat is answered at once, as Kafka does; -1: as long as the
    # clients allow. librdkafka sends nothing else to the coordinator while a heartbeat is held.
    heartbeat_hold_ms: int = 0
    # Not a Kafka setting: with holds on, how long a heartbeat of a member waiting for partitions
    # still owned by another may be held (consumer_wait.py); -1: half the heartbeat interval, at
    # most 2.5 s (and at most group.heartbeat.hold.ms).
    consumer_unreleased_wait_ms: int = -1

    # Not a Kafka setting: with holds on, how long the heartbeat of a stable member with nothing
    # new may be held (consumer_wait.py); -1: 1 s less than the heartbeat interval (half of it
    # under 2 s; at most group.heartbeat.hold.ms).
    consumer_steady_hold_ms: int = -1

    # Not a Kafka setting: the first target assignment of a group that was empty waits this long
    # for other members to join (as Kafka's group.streams.initial.rebalance.delay.ms does for
    # streams groups); the joins are answered at once and asked back when it is due
    # (heartbeat_interval.py); -1: 200 ms.
    consumer_initial_assignment_delay_ms: int = -1

    @property
    def initial_join_delay_ms(self) -> int:
        """How long a new classic group waits for members before its first join completes."""
        return max(self.initial_rebalance_delay_ms, self.classic_min_initial_delay_ms)

    @property
    def holds_heartbeats(self) -> bool:
        """Whether any heartbeat may be held (group.heartbeat.hold.ms, or a hold set directly)."""
        return self.heartbeat_hold_ms != 0 or self.consumer_unreleased_wait_ms > 0 or self.consumer_steady_hold_ms > 0

    def _hold(self, cap: int) -> int:
        return cap if self.heartbeat_hold_ms < 0 else min(cap, self.heartbeat_hold_ms)

    def classic_hold_ms(self, session_timeout_ms: int) -> int:
        """How long a classic member's heartbeat may be held (membership.py; 0: not at all): a
        third of its session timeout at most (the clients' request timeouts are longer), 5 s
        when the hold is -1."""
        return min(session_timeout_ms // 3, 5000 if self.heartbeat_hold_ms < 0 else self.heartbeat_hold_ms)

    @property
    def unreleased_wait_ms(self) -> int:
        if self.consumer_unreleased_wait_ms >= 0:
            return self.consumer_unreleased_wait_ms
        return self._hold(min(self.consumer_heartbeat_interval_ms // 2, 2500))

    @property
    def steady_hold_ms(self) -> int:
        """librdkafka times a ConsumerGroupHeartbeat out after the heartbeat interval: the answer
        leaves a second before (half the interval before, for intervals under 2 s)."""
        if self.consumer_steady_hold_ms >= 0:
            return self.consumer_steady_hold_ms
        interval = self.consumer_heartbeat_interval_ms
        return self._hold(max(0, interval - min(1000, interval // 2)))

    @property
    def initial_assignment_delay_ms(self) -> int:
        if self.consumer_initial_assignment_delay_ms >= 0:
            return self.consumer_initial_assignment_delay_ms
        return 200

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
            consumer_heartbeat_interval_ms=get("group.consumer.heartbeat.interval.ms", d.consumer_heartbeat_interval_ms),
            consumer_session_timeout_ms=get("group.consumer.session.timeout.ms", d.consumer_session_timeout_ms),
            consumer_min_session_timeout_ms=get(
                "group.consumer.min.session.timeout.ms", d.consumer_min_session_timeout_ms),
            consumer_max_session_timeout_ms=get(
                "group.consumer.max.session.timeout.ms", d.consumer_max_session_timeout_ms),
            consumer_max_size=get("group.consumer.max.size", d.consumer_max_size),
            consumer_assignors=_names(values.get("group.consumer.assignors"), d.consumer_assignors),
            consumer_assignment_interval_ms=get(
                "group.consumer.assignment.interval.ms", d.consumer_assignment_interval_ms),
            consumer_regex_refresh_interval_ms=get(
                "group.consumer.regex.refresh.interval.ms", d.consumer_regex_refresh_interval_ms),
            heartbeat_hold_ms=get("group.heartbeat.hold.ms", d.heartbeat_hold_ms),
            consumer_migration_policy=str(
                values.get("group.consumer.migration.policy") or d.consumer_migration_policy).strip().lower(),
            consumer_min_heartbeat_interval_ms=get(
                "group.consumer.min.heartbeat.interval.ms", d.consumer_min_heartbeat_interval_ms),
            consumer_max_heartbeat_interval_ms=get(
                "group.consumer.max.heartbeat.interval.ms", d.consumer_max_heartbeat_interval_ms),
            share_heartbeat_interval_ms=get("group.share.heartbeat.interval.ms", d.share_heartbeat_interval_ms),
            share_min_heartbeat_interval_ms=get(
                "group.share.min.heartbeat.interval.ms", d.share_min_heartbeat_interval_ms),
            share_max_heartbeat_interval_ms=get(
                "group.share.max.heartbeat.interval.ms", d.share_max_heartbeat_interval_ms),
            share_session_timeout_ms=get("group.share.session.timeout.ms", d.share_session_timeout_ms),
            share_min_session_timeout_ms=get("group.share.min.session.timeout.ms", d.share_min_session_timeout_ms),
            share_max_session_timeout_ms=get("group.share.max.session.timeout.ms", d.share_max_session_timeout_ms),
            share_max_size=get("group.share.max.size", d.share_max_size),
        )


def _names(raw: Any, default: tuple[str, ...]) -> tuple[str, ...]:
    """A list property: a list, or a comma-separated string."""
    if raw is None:
        return default
    items = raw.split(",") if isinstance(raw, str) else list(raw)
    return tuple(str(x).strip() for x in items if str(x).strip())


# the broker properties the group coordinator reads (group configs override some per group)
CONFIG_KEYS = (
    "offsets.topic.num.partitions", "group.min.session.timeout.ms", "group.max.session.timeout.ms",
    "group.initial.rebalance.delay.ms", "group.max.size", "offset.metadata.max.bytes",
    "offsets.retention.minutes", "offsets.retention.check.interval.ms",
    "group.consumer.assignors", "group.consumer.heartbeat.interval.ms", "group.consumer.session.timeout.ms",
    "group.consumer.min.session.timeout.ms", "group.consumer.max.session.timeout.ms", "group.consumer.max.size",
    "group.consumer.assignment.interval.ms", "group.consumer.regex.refresh.interval.ms",
    "group.consumer.migration.policy", "group.consumer.min.heartbeat.interval.ms",
    "group.consumer.max.heartbeat.interval.ms", "group.share.heartbeat.interval.ms",
    "group.share.min.heartbeat.interval.ms", "group.share.max.heartbeat.interval.ms", "group.share.session.timeout.ms",
    "group.share.min.session.timeout.ms", "group.share.max.session.timeout.ms", "group.share.max.size",
    "group.heartbeat.hold.ms",
)
