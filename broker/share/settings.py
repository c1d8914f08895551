"""A share group's settings as the share-partition engine and the dead-letter queue read them: the
broker's `group.share.*` and `errors.deadletterqueue.*` properties under the group's own configs
(GroupConfigs' effective settings)."""

from __future__ import annotations

from typing import Any

from broker.coordinator.group.group_config import GroupSettings
from broker.share.dlq import DlqSettings
from broker.share.engine import ShareSettings
from broker.share.ports import ShareGroupSettings


def share_group_settings(s: GroupSettings) -> ShareGroupSettings:
    return ShareGroupSettings(
        engine=ShareSettings(
            delivery_count_limit=s.share_delivery_count_limit, record_lock_duration_ms=s.share_record_lock_duration_ms,
            max_record_locks=s.share_partition_max_record_locks, dlq=bool(s.dlq_topic_name),
            renew_enabled=s.share_renew_acknowledge_enable),
        auto_offset_reset=s.share_auto_offset_reset,
        isolation_level=1 if s.share_isolation_level == "read_committed" else 0,
    )


def dlq_settings(s: GroupSettings, config: Any) -> DlqSettings:
    return DlqSettings(s.dlq_topic_name, s.dlq_copy_record_enable,
                       str(config["errors.deadletterqueue.topic.name.prefix"] or ""),
                       bool(config["errors.deadletterqueue.auto.create.topics.enable"]),
                       s.share_delivery_count_limit)
