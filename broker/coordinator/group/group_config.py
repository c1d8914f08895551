"""Group configs (ConfigResource type GROUP = 32): per-group overrides of the broker's group settings.

Kafka's GroupConfig: a group may override the KIP-848 consumer group settings
(`consumer.session.timeout.ms`, `consumer.heartbeat.interval.ms`), the share group settings
(`share.*`) and the share group's dead-letter queue (`errors.deadletterqueue.*`, KIP-1191). A config
a group does not set takes the broker's value (its synonym, `group.consumer.*` / `group.share.*`,
or a fixed default). Values are validated as Kafka validates them: by type, by fixed lower bounds,
and by the broker's min/max bounds (`group.share.min.record.lock.duration.ms`, ...); every failure
is INVALID_CONFIG with Kafka's message. The overrides are stored in the metadata log
(ConfigRecords of resource type 32, broker/metadata/); `GroupConfigs` gives every group's
effective settings to the coordinator and the share-partition engines, which read them at each
request, so a change applies to live groups at once.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from protocol.errors import ErrorCode, KafkaError

_DURATION = re.compile(r"^P(?:(\d+)D)?(?:T(?:(\d+)H)?(?:(\d+)M)?(?:(\d+(?:\.\d+)?)S)?)?$", re.IGNORECASE)


@dataclass(frozen=True)
class GroupConfigDef:
    name: str
    type: str  # int, string, boolean
    doc: str
    synonym: str | None = None  # the broker config giving the default
    default: str | None = None  # the default when there is no synonym
    at_least: int | None = None  # Kafka's ConfigDef range
    bounds: tuple[str, str] | None = None  # broker configs bounding a group's value
    choices: tuple[str, ...] | None = None


_DEFS = [
    GroupConfigDef("consumer.session.timeout.ms", "int", "Session timeout of the consumer group's members.",
                   synonym="group.consumer.session.timeout.ms", at_least=1,
                   bounds=("group.consumer.min.session.timeout.ms", "group.consumer.max.session.timeout.ms")),
    GroupConfigDef("consumer.heartbeat.interval.ms", "int", "Heartbeat interval of the consumer group's members.",
                   synonym="group.consumer.heartbeat.interval.ms", at_least=1,
                   bounds=("group.consumer.min.heartbeat.interval.ms", "group.consumer.max.heartbeat.interval.ms")),
    GroupConfigDef("share.session.timeout.ms", "int", "Session timeout of the share group's members.",
                   synonym="group.share.session.timeout.ms", at_least=1,
                   bounds=("group.share.min.session.timeout.ms", "group.share.max.session.timeout.ms")),
    GroupConfigDef("share.heartbeat.interval.ms", "int", "Heartbeat interval of the share group's members.",
                   synonym="group.share.heartbeat.interval.ms", at_least=1,
                   bounds=("group.share.min.heartbeat.interval.ms", "group.share.max.heartbeat.interval.ms")),
    GroupConfigDef("share.record.lock.duration.ms", "int", "How long an acquired record is locked to its member.",
                   synonym="group.share.record.lock.duration.ms", at_least=1000,
                   bounds=("group.share.min.record.lock.duration.ms", "group.share.max.record.lock.duration.ms")),
    GroupConfigDef("share.delivery.count.limit", "int", "Deliveries of a record before it is archived.",
                   synonym="group.share.delivery.count.limit", at_least=2,
                   bounds=("group.share.min.delivery.count.limit", "group.share.max.delivery.count.limit")),
    GroupConfigDef("share.partition.max.record.locks", "int", "Records in flight per share-partition.",
                   synonym="group.share.partition.max.record.locks", at_least=100,
                   bounds=("group.share.min.partition.max.record.locks", "group.share.max.partition.max.record.locks")),
    GroupConfigDef("share.auto.offset.reset", "string",
                   "Where a share-partition starts: latest, earliest, or by_duration:<ISO-8601 duration>.",
                   default="latest"),
    GroupConfigDef("share.isolation.level", "string", "read_committed delivers only committed transactional records.",
                   default="read_uncommitted", choices=("read_committed", "read_uncommitted")),
    GroupConfigDef("share.renew.acknowledge.enable", "boolean", "Whether members may renew acquisition locks.",
                   default="true"),
    GroupConfigDef("errors.deadletterqueue.topic.name", "string",
                   "The share group's dead-letter queue topic; blank: none (KIP-1191).", default=""),
    GroupConfigDef("errors.deadletterqueue.copy.record.enable", "boolean",
                   "Whether dead-letter queue records carry the original key and value.", default="false"),
]
GROUP_CONFIG_DEFS: dict[str, GroupConfigDef] = {d.name: d for d in _DEFS}
_SESSION_HEARTBEAT = [("consumer.session.timeout.ms", "consumer.heartbeat.interval.ms"),
                      ("share.session.timeout.ms", "share.heartbeat.interval.ms")]

BrokerValue = Callable[[str], Any]
"""A broker config's value by name."""


def _invalid(message: str) -> KafkaError:
    return KafkaError(ErrorCode.INVALID_CONFIG, message)


def parse_auto_offset_reset(value: str) -> tuple[str, int | None]:
    """(strategy, duration ms) of share.auto.offset.reset; raises INVALID_CONFIG."""
    text = value.strip().lower()
    if text in ("latest", "earliest"):
        return text, None
    if text.startswith("by_duration:"):
        m = _DURATION.match(text.split(":", 1)[1].strip())
        if m is not None and any(m.groups()):
            days, hours, minutes, seconds = m.groups()
            ms = (int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60) * 1000
            return "by_duration", ms + int(float(seconds or 0) * 1000)
    raise _invalid("Invalid value `%s` for configuration share.auto.offset.reset. The value must be either "
                   "'earliest', 'latest' or of the format 'by_duration:<PnDTnHnMn.nS.>'." % value)


def _parse(d: GroupConfigDef, value: str) -> Any:
    text = value.strip()
    if d.type == "int":
        try:
            number = int(text)
        except ValueError:
            raise _invalid("Invalid value %s for configuration %s: Not a number of type INT" % (value, d.name)) from None
        if d.at_least is not None and number < d.at_least:
            raise _invalid("Invalid value %s for configuration %s: Value must be at least %d"
                           % (value, d.name, d.at_least))
        return number
    if d.type == "boolean":
        if text.lower() not in ("true", "false"):
            raise _invalid("Invalid value %s for configuration %s: Expected value to be either true or false"
                           % (value, d.name))
        return text.lower() == "true"
    if d.choices is not None and text.lower() not in d.choices:
        raise _invalid("Invalid value %s for configuration %s: String must be one of: %s"
                       % (value, d.name, ", ".join(d.choices)))
    if d.name == "share.auto.offset.reset":
        parse_auto_offset_reset(text)
    return text


def validate_group_configs(props: Mapping[str, str], broker: BrokerValue) -> None:
    """A group's whole set of overrides (Kafka's GroupConfig.validate); raises INVALID_CONFIG."""
    parsed: dict[str, Any] = {}
    for name, value in props.items():
        d = GROUP_CONFIG_DEFS.get(name)
        if d is None:
            raise _invalid("Unknown group config name: %s" % name)
        parsed[name] = _parse(d, value)
    for name, value in parsed.items():
        bounds = GROUP_CONFIG_DEFS[name].bounds
        if bounds is not None:
            lo, hi = int(broker(bounds[0])), int(broker(bounds[1]))
            if not lo <= value <= hi:
                raise _invalid("%s must be in the range %d to %d inclusive." % (name, lo, hi))
    for session, heartbeat in _SESSION_HEARTBEAT:
        if session in parsed or heartbeat in parsed:
            s = parsed.get(session, int(broker(GROUP_CONFIG_DEFS[session].synonym or "")))
            h = parsed.get(heartbeat, int(broker(GROUP_CONFIG_DEFS[heartbeat].synonym or "")))
            if s <= h:
                raise _invalid("%s must be greater than %s" % (session, heartbeat))
    dlq = parsed.get("errors.deadletterqueue.topic.name")
    if dlq and dlq.startswith("__"):
        raise _invalid("errors.deadletterqueue.topic.name: DLQ topic name must not start with '__'")


def default_value(name: str, broker: BrokerValue) -> str:
    """The value of a config the group does not set (the broker's, or the fixed default)."""
    d = GROUP_CONFIG_DEFS[name]
    if d.synonym is not None:
        return str(broker(d.synonym))
    return d.default or ""


@dataclass(frozen=True)
class GroupSettings:
    """A group's effective settings."""

    consumer_session_timeout_ms: int
    consumer_heartbeat_interval_ms: int
    share_session_timeout_ms: int
    share_heartbeat_interval_ms: int
    share_record_lock_duration_ms: int
    share_delivery_count_limit: int
    share_partition_max_record_locks: int
    share_auto_offset_reset: str
    share_isolation_level: str
    share_renew_acknowledge_enable: bool
    dlq_topic_name: str
    dlq_copy_record_enable: bool


def group_settings(overrides: Mapping[str, str], broker: BrokerValue) -> GroupSettings:
    def value(name: str) -> Any:
        raw = overrides.get(name)
        return _parse(GROUP_CONFIG_DEFS[name], raw if raw is not None else default_value(name, broker))

    return GroupSettings(
        consumer_session_timeout_ms=value("consumer.session.timeout.ms"),
        consumer_heartbeat_interval_ms=value("consumer.heartbeat.interval.ms"),
        share_session_timeout_ms=value("share.session.timeout.ms"),
        share_heartbeat_interval_ms=value("share.heartbeat.interval.ms"),
        share_record_lock_duration_ms=value("share.record.lock.duration.ms"),
        share_delivery_count_limit=value("share.delivery.count.limit"),
        share_partition_max_record_locks=value("share.partition.max.record.locks"),
        share_auto_offset_reset=value("share.auto.offset.reset").lower(),
        share_isolation_level=value("share.isolation.level").lower(),
        share_renew_acknowledge_enable=value("share.renew.acknowledge.enable"),
        dlq_topic_name=value("errors.deadletterqueue.topic.name"),
        dlq_copy_record_enable=value("errors.deadletterqueue.copy.record.enable"),
    )


class GroupConfigs:
    """Every group's effective settings: its overrides (from the metadata) over the broker's
    values. Cached per group; `changed` drops the cache when configs change."""

    def __init__(self, broker: BrokerValue, overrides: Callable[[str], Mapping[str, str]]) -> None:
        self.broker = broker
        self.overrides = overrides
        self._cache: dict[str, GroupSettings] = {}

    def settings(self, group_id: str) -> GroupSettings:
        settings = self._cache.get(group_id)
        if settings is None:
            try:
                settings = group_settings(self.overrides(group_id), self.broker)
            except KafkaError:
                settings = group_settings({}, self.broker)  # overrides a narrower broker bound now refuses
            if len(self._cache) > 10_000:
                self._cache.clear()
            self._cache[group_id] = settings
        return settings

    def changed(self, group_id: str | None = None) -> None:
        if group_id is None:
            self._cache.clear()
        else:
            self._cache.pop(group_id, None)
