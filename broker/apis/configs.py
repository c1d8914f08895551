"""DescribeConfigs (key 32), AlterConfigs (key 33) and IncrementalAlterConfigs (key 44).

Topics (resource type 2) and the broker (type 4) are served the way Kafka 4.x serves them:

- A topic config's value resolves topic override -> dynamic per-broker synonym -> dynamic
  cluster-wide synonym -> static synonym -> the topic default, and its synonyms are listed in
  that order (Kafka's ConfigHelper, including its habit of dropping the lower-priority synonym
  names when the first one is unset: `retention.ms` lists no synonym unless `log.retention.ms`
  is set somewhere).
- The broker resource is named by its node id (every config with its static or dynamic value)
  or "" (only the cluster-wide dynamic defaults). Dynamic broker configs are Kafka's
  (broker.metadata.dynamic_config); they are persisted as ConfigRecords, and the log settings
  among them become the broker-wide defaults of every topic without an override at once.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from broker.apis.config_resources import (
    alter_client_metrics,
    client_metrics_list_type,
    current_client_metrics,
    describe_client_metrics,
)
from broker.apis.context import BrokerServices, RequestContext
from broker.apis.registry import api
from broker.config import PROPS, BrokerConfig, base_property
from broker.coordinator.group.group_config import GROUP_CONFIG_DEFS, default_value, validate_group_configs
from broker.log.config import TOPIC_CONFIGS, TOPIC_SYNONYMS
from broker.metadata import (
    MIN_INSYNC_REPLICAS,
    RESOURCE_BROKER,
    RESOURCE_CLIENT_METRICS,
    RESOURCE_GROUP,
    RESOURCE_TOPIC,
    features,
    validate_topic_name,
)
from broker.metadata.dynamic_config import REPLICATION_RATES, check_update, is_dynamic, listener_base_name
from broker.security.acl import AUTHORIZATION_MESSAGES
from broker.security.authz import CLUSTER_NAME, Op, Res, authorize, error_for
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

RESOURCE_BROKER_LOGGER = 8

# DescribeConfigsResponse.ConfigSource
TOPIC_CONFIG = 1
DYNAMIC_BROKER_CONFIG = 2
DYNAMIC_DEFAULT_BROKER_CONFIG = 3
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
GROUP_CONFIG = 8

# DescribeConfigsResponse.ConfigType
CONFIG_TYPES = {
    "boolean": 1, "string": 2, "int": 3, "short": 4, "long": 5, "double": 6, "list": 7, "class": 8, "password": 9,
}

# IncrementalAlterConfigs operations
OP_SET, OP_DELETE, OP_APPEND, OP_SUBTRACT = 0, 1, 2, 3
OP_NAMES = {OP_SET: "SET", OP_DELETE: "DELETE", OP_APPEND: "APPEND", OP_SUBTRACT: "SUBTRACT"}

LONG_MAX = str((1 << 63) - 1)


@dataclass(frozen=True)
class TopicConfigDef:
    type: str
    default: str | None
    doc: str


# Kafka 4.2's topic configs: type, default (as Kafka renders it) and a short description.
TOPIC_CONFIG_DEFS: dict[str, TopicConfigDef] = {
    "cleanup.policy": TopicConfigDef("list", "delete", "delete, compact or both: how old segments are discarded."),
    "compression.gzip.level": TopicConfigDef("int", "-1", "Gzip level when compression.type is gzip."),
    "compression.lz4.level": TopicConfigDef("int", "9", "Lz4 level when compression.type is lz4."),
    "compression.type": TopicConfigDef("string", "producer", "Codec of stored batches; producer keeps theirs."),
    "compression.zstd.level": TopicConfigDef("int", "3", "Zstd level when compression.type is zstd."),
    "delete.retention.ms": TopicConfigDef("long", "86400000", "How long tombstones stay in a compacted log."),
    "file.delete.delay.ms": TopicConfigDef("long", "60000", "Delay before a deleted segment's files are removed."),
    "flush.messages": TopicConfigDef("long", LONG_MAX, "Messages appended between two fsyncs."),
    "flush.ms": TopicConfigDef("long", LONG_MAX, "Milliseconds between two fsyncs."),
    "follower.replication.throttled.replicas": TopicConfigDef("list", "", "Replicas throttled on the follower."),
    "index.interval.bytes": TopicConfigDef("int", "4096", "Bytes between two offset index entries."),
    "leader.replication.throttled.replicas": TopicConfigDef("list", "", "Replicas throttled on the leader."),
    "local.retention.bytes": TopicConfigDef("long", "-2", "Local retention by size with tiered storage."),
    "local.retention.ms": TopicConfigDef("long", "-2", "Local retention by time with tiered storage."),
    "max.compaction.lag.ms": TopicConfigDef("long", LONG_MAX, "Longest time a record stays uncompacted."),
    "max.message.bytes": TopicConfigDef("int", "1048588", "Largest record batch the topic accepts."),
    "message.timestamp.after.max.ms": TopicConfigDef("long", "3600000", "Allowed future skew of a timestamp."),
    "message.timestamp.before.max.ms": TopicConfigDef("long", LONG_MAX, "Allowed age of a CreateTime timestamp."),
    "message.timestamp.type": TopicConfigDef("string", "CreateTime", "CreateTime or LogAppendTime."),
    "min.cleanable.dirty.ratio": TopicConfigDef("double", "0.5", "Dirty ratio that makes a log eligible for cleaning."),
    "min.compaction.lag.ms": TopicConfigDef("long", "0", "Shortest time a record stays uncompacted."),
    "min.insync.replicas": TopicConfigDef("int", "1", "Replicas that must acknowledge an acks=all write."),
    "preallocate": TopicConfigDef("boolean", "false", "Preallocate segment files."),
    "remote.log.copy.disable": TopicConfigDef("boolean", "false", "Stop copying segments to tiered storage."),
    "remote.log.delete.on.disable": TopicConfigDef("boolean", "false", "Delete tiered data when it is disabled."),
    "remote.storage.enable": TopicConfigDef("boolean", "false", "Tiered storage for this topic."),
    "retention.bytes": TopicConfigDef("long", "-1", "Largest size of a partition before old segments go; -1: none."),
    "retention.ms": TopicConfigDef("long", "604800000", "Age after which segments are deleted; -1: forever."),
    "segment.bytes": TopicConfigDef("int", "1073741824", "Size of a segment file."),
    "segment.index.bytes": TopicConfigDef("int", "10485760", "Size of a segment's offset index."),
    "segment.jitter.ms": TopicConfigDef("long", "0", "Random jitter subtracted from segment.ms."),
    "segment.ms": TopicConfigDef("long", "604800000", "Age after which the active segment rolls."),
    "unclean.leader.election.enable": TopicConfigDef("boolean", "false", "Allow out-of-sync leaders."),
}
# Valid topic configs described only when set: internal ones, and those newer than Kafka 4.2.
INTERNAL_TOPIC_CONFIG_DEFS = {
    "internal.segment.bytes": TopicConfigDef("int", None, "Segment size below the 1 MiB floor, for tests."),
    "errors.deadletterqueue.group.enable": TopicConfigDef(
        "boolean", "false", "The topic may be a share group's dead-letter queue (KIP-1191, Kafka 4.4)."),
}


# Broker configs that are one setting under several names (DynamicBrokerConfig.brokerConfigSynonyms)
_BROKER_SYNONYM_GROUPS = [
    ["log.roll.ms", "log.roll.hours"],
    ["log.roll.jitter.ms", "log.roll.jitter.hours"],
    ["log.retention.ms", "log.retention.minutes", "log.retention.hours"],
]


def broker_synonyms(name: str) -> list[str]:
    for group in _BROKER_SYNONYM_GROUPS:
        if name in group:
            return group
    if name == "log.flush.interval.ms":  # the scheduler interval is its fallback
        return ["log.flush.interval.ms", "log.flush.scheduler.interval.ms"]
    return [name]


def render(value: object) -> str | None:
    """A config value as Kafka writes it (booleans in lower case, lists comma-separated)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return str(value)


STATIC_DEFAULTS: dict[str, str] = {
    p.name: v for p in PROPS.values() if (v := render(p.default)) is not None
}




def _is_sensitive(name: str) -> bool:
    prop = base_property(name)  # a listener's own ssl.* or sasl.jaas.config is as secret as the broker's
    return prop is not None and (prop.sensitive or prop.type == "password")


# ---------------------------------------------------------------------------------------------
# Resolution and synonyms


@dataclass(frozen=True)
class Synonym:
    name: str
    value: str | None
    source: int


def _layers(config: BrokerConfig) -> list[tuple[Mapping[str, str], int]]:
    return [
        (config.dynamic_broker, DYNAMIC_BROKER_CONFIG),
        (config.dynamic_default, DYNAMIC_DEFAULT_BROKER_CONFIG),
        (config.raw, STATIC_BROKER_CONFIG),
        (STATIC_DEFAULTS, DEFAULT_CONFIG),
    ]


def config_synonyms(config: BrokerConfig, name: str, names: list[str], sensitive: bool) -> list[Synonym]:
    """Where `names` are set, by source then by name priority, from the first entry for `name` on."""
    found = [
        Synonym(n, None if sensitive else layer[n], source)
        for layer, source in _layers(config)
        for n in names
        if n in layer
    ]
    for i, s in enumerate(found):
        if s.name == name:
            return found[i:]
    return []


def _normalise(name: str, value: str) -> str:
    """A topic config value as Kafka renders it after parsing."""
    d = TOPIC_CONFIG_DEFS.get(name) or INTERNAL_TOPIC_CONFIG_DEFS.get(name)
    if d is None:
        return value
    text = value.strip()
    if d.type == "boolean":
        return text.lower()
    if d.type == "list":
        return ",".join(p.strip() for p in text.split(",") if p.strip())
    if d.type in ("int", "long"):
        try:
            return str(int(text))
        except ValueError:
            return text
    return text


def _convert(value: str, factor: int) -> str:
    if factor == 1:
        return value
    try:
        number = int(value.strip())
    except ValueError:
        return value
    return str(number * factor if number >= 0 else number)


def resolve_topic_config(name: str, topic_props: Mapping[str, str], config: BrokerConfig) -> tuple[str | None, int]:
    """(value, source) of one topic config: override, then broker synonyms layer by layer, then default."""
    if name in topic_props:
        return _normalise(name, topic_props[name]), TOPIC_CONFIG
    synonyms = TOPIC_SYNONYMS.get(name, [])
    for layer, source in _layers(config)[:3]:
        for broker_name, factor in synonyms:
            if broker_name in layer:
                return _convert(layer[broker_name], factor), source
    d = TOPIC_CONFIG_DEFS.get(name) or INTERNAL_TOPIC_CONFIG_DEFS.get(name)
    return (d.default if d else None), DEFAULT_CONFIG


def topic_config_names(topic_props: Mapping[str, str]) -> list[str]:
    names = set(TOPIC_CONFIG_DEFS) | set(topic_props)
    return sorted(names)


def effective_topic_configs(topic_props: Mapping[str, str], config: BrokerConfig) -> list[tuple[str, str | None, int]]:
    """Every config of a topic with its value and source, as CreateTopics v5+ returns them."""
    return [(n, *resolve_topic_config(n, topic_props, config)) for n in topic_config_names(topic_props)]


# ---------------------------------------------------------------------------------------------
# DescribeConfigs

D = M.DescribeConfigsResponse
ConfigEntry = D.DescribeConfigsResourceResult


def _config_type(type_name: str | None) -> int:
    return CONFIG_TYPES.get(type_name or "", 0)


def _wanted(keys: list[str] | None, name: str) -> bool:
    return not keys or name in keys


def describe_topic(
    topic_props: Mapping[str, str], config: BrokerConfig, keys: list[str] | None, synonyms: bool, docs: bool
) -> list[ConfigEntry]:
    out = []
    for name in topic_config_names(topic_props):
        if not _wanted(keys, name):
            continue
        value, _ = resolve_topic_config(name, topic_props, config)
        found: list[Synonym] = []
        broker_names = TOPIC_SYNONYMS.get(name)
        if broker_names:
            first = broker_names[0][0]
            found = config_synonyms(config, first, broker_synonyms(first), False)
        if name in topic_props:
            found = [Synonym(name, value, TOPIC_CONFIG), *found]
        d = TOPIC_CONFIG_DEFS.get(name) or INTERNAL_TOPIC_CONFIG_DEFS.get(name)
        out.append(D.DescribeConfigsResourceResult(
            name=name, value=value, read_only=False, config_source=found[0].source if found else DEFAULT_CONFIG,
            is_sensitive=False, synonyms=_synonym_results(found) if synonyms else [],
            config_type=_config_type(d.type if d else None), documentation=d.doc if docs and d else None,
        ))
    return out


def _synonym_results(found: Iterable[Synonym]) -> list[D.DescribeConfigsSynonym]:
    return [D.DescribeConfigsSynonym(name=s.name, value=s.value, source=s.source) for s in found]


def broker_config_value(config: BrokerConfig, name: str) -> str | None:
    for layer, _ in _layers(config):
        if name in layer:
            return layer[name]
    return None


def describe_broker(
    config: BrokerConfig, per_broker: bool, keys: list[str] | None, synonyms: bool, docs: bool
) -> list[ConfigEntry]:
    """A node's configs (per_broker) or the cluster-wide dynamic defaults (resource name "")."""
    if per_broker:
        names = sorted(set(PROPS) | set(config.raw) | set(config.dynamic_default) | set(config.dynamic_broker))
    else:
        names = sorted(config.dynamic_default)
    out = []
    for name in names:
        if not _wanted(keys, name):
            continue
        sensitive = _is_sensitive(name)
        value = None if sensitive else (broker_config_value(config, name) if per_broker
                                         else config.dynamic_default.get(name))
        found = config_synonyms(config, name, broker_synonyms(name), sensitive)
        if not per_broker:
            found = [s for s in found if s.source == DYNAMIC_DEFAULT_BROKER_CONFIG]
        prop = PROPS.get(name)
        out.append(D.DescribeConfigsResourceResult(
            name=name, value=value, read_only=not is_dynamic(name),
            config_source=found[0].source if found else DEFAULT_CONFIG, is_sensitive=sensitive,
            synonyms=_synonym_results(found) if synonyms else [],
            config_type=_config_type(prop.type if prop else None), documentation=prop.doc if docs and prop else None,
        ))
    return out


def describe_group(config: BrokerConfig, overrides: Mapping[str, str], keys: list[str] | None, synonyms: bool,
                   docs: bool) -> list[ConfigEntry]:
    """A group's configs: its overrides (GROUP_CONFIG), else the broker's values (Kafka's
    ConfigHelper for GROUP resources)."""
    out = []
    for name in sorted(GROUP_CONFIG_DEFS):
        if not _wanted(keys, name):
            continue
        d = GROUP_CONFIG_DEFS[name]
        found: list[Synonym] = []
        if d.synonym is not None:
            found = config_synonyms(config, d.synonym, [d.synonym], False)
        if name in overrides:
            value, found = overrides[name], [Synonym(name, overrides[name], GROUP_CONFIG), *found]
        else:
            value = default_value(name, config.get)
        out.append(D.DescribeConfigsResourceResult(
            name=name, value=value, read_only=False, config_source=found[0].source if found else DEFAULT_CONFIG,
            is_sensitive=False, synonyms=_synonym_results(found) if synonyms else [],
            config_type=_config_type(d.type), documentation=d.doc if docs else None,
        ))
    return out


def _group_name(name: str) -> None:
    if not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Group id must not be empty.")


def _broker_id(name: str, node_id: int, what: str) -> None:
    try:
        value = int(name)
    except ValueError:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "%s must be an integer, but it is: %s" % (what, name)) from None
    if value != node_id:
        expected = "%d or empty string" % node_id if what == "Broker id" else str(node_id)
        raise KafkaError(ErrorCode.INVALID_REQUEST,
                         "Unexpected broker id, expected %s, but received %s" % (expected, name))


def _describe_resource(broker: BrokerServices, resource: M.DescribeConfigsRequest.DescribeConfigsResource, synonyms: bool,
                       docs: bool) -> D.DescribeConfigsResult:
    rtype, name, keys = resource.resource_type, resource.resource_name, resource.configuration_keys
    if rtype == RESOURCE_TOPIC:
        validate_topic_name(name)
        info = broker.metadata.topic(name)
        if info is None:
            return D.DescribeConfigsResult(error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION), configs=[])
        return D.DescribeConfigsResult(configs=describe_topic(info.configs, broker.config, keys, synonyms, docs))
    if rtype == RESOURCE_BROKER:
        if name:
            _broker_id(name, broker.node_id, "Broker id")
        return D.DescribeConfigsResult(configs=describe_broker(broker.config, bool(name), keys, synonyms, docs))
    if rtype == RESOURCE_CLIENT_METRICS:
        return describe_client_metrics(broker, name, keys)
    if rtype == RESOURCE_GROUP:
        _group_name(name)
        overrides = broker.metadata.image.resource_configs[RESOURCE_GROUP].get(name, {})
        return D.DescribeConfigsResult(configs=describe_group(broker.config, overrides, keys, synonyms, docs))
    raise KafkaError(ErrorCode.INVALID_REQUEST, "Unsupported resource type: %s" % _type_name(rtype))


def _type_name(rtype: int) -> str:
    names = {0: "UNKNOWN", 2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER", 16: "CLIENT_METRICS", 32: "GROUP"}
    return names.get(rtype, "UNKNOWN")


_CONFIG_RESOURCE_TYPES = (RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS, 32)


def config_access(ctx: RequestContext, rtype: int, name: str, operation: Op) -> KafkaError | None:
    """Whether the principal may describe (DESCRIBE_CONFIGS) or alter (ALTER_CONFIGS) a config
    resource: a topic's or a group's own, the cluster's for the broker, its loggers and client
    metrics (ConfigHelper, ControllerApis.authorizeAlterResource); the error if not."""
    if rtype not in _CONFIG_RESOURCE_TYPES:
        return None  # refused on its own
    resource = Res.TOPIC if rtype == RESOURCE_TOPIC else Res.GROUP if rtype == 32 else Res.CLUSTER
    if authorize(ctx, operation, resource, name if resource != Res.CLUSTER else CLUSTER_NAME):
        return None
    code = error_for(resource)
    return KafkaError(code, AUTHORIZATION_MESSAGES[code])


@api(32)
async def handle_describe_configs(ctx: RequestContext, request: M.DescribeConfigsRequest) -> M.DescribeConfigsResponse:
    docs = ctx.api_version >= 3 and request.include_documentation
    results = []
    for resource in request.resources:
        try:
            denied = config_access(ctx, resource.resource_type, resource.resource_name, Op.DESCRIBE_CONFIGS)
            if denied is not None:
                raise denied
            result = _describe_resource(ctx.broker, resource, request.include_synonyms, docs)
        except KafkaError as exc:
            result = D.DescribeConfigsResult(error_code=int(exc.code), error_message=exc.message, configs=[])
        result.resource_type = resource.resource_type
        result.resource_name = resource.resource_name
        results.append(result)
    return D(throttle_time_ms=0, results=results)


# ---------------------------------------------------------------------------------------------
# AlterConfigs / IncrementalAlterConfigs


def validate_broker_configs(props: Mapping[str, str], per_broker: bool = True) -> None:
    """The whole set of dynamic configs of a broker resource (INVALID_REQUEST when refused, as
    Kafka's ConfigAdminManager answers a failed DynamicBrokerConfig validation)."""
    check_update(props, per_broker)
    for name, value in props.items():
        try:
            _validate_broker_value(listener_base_name(name), value)
        except KafkaError as exc:
            raise KafkaError(ErrorCode.INVALID_REQUEST, exc.message) from None


def _validate_broker_value(name: str, value: str) -> None:
    prop = PROPS.get(name)
    # the replication rates have no static property (QuotaConfig.brokerQuotaConfigs: longs, at least 0)
    prop_type = "long" if name in REPLICATION_RATES else prop.type if prop is not None else None
    if prop_type is None:
        return  # a config this broker does not define: stored as given, as Kafka stores custom ones
    text = value.strip()
    kind = {"int": "INT", "long": "LONG", "short": "SHORT", "double": "DOUBLE"}.get(prop_type)
    if kind is not None:
        try:
            number = float(text) if prop_type == "double" else int(text)
        except ValueError:
            raise KafkaError(ErrorCode.INVALID_CONFIG, "Invalid value %s for configuration %s: Not a number of type %s"
                             % (value, name, kind)) from None
        if name in REPLICATION_RATES and number < 0:
            raise KafkaError(ErrorCode.INVALID_CONFIG, "Invalid value %s for configuration %s: Value must be at "
                             "least 0" % (value, name))
    elif prop_type == "boolean" and text.lower() not in ("true", "false"):
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Invalid value %s for configuration %s: Expected value to be "
                         "either true or false" % (value, name))
    # the ranges and choices are those of the topic config the setting defaults
    for topic_name, synonyms in TOPIC_SYNONYMS.items():
        if synonyms[0][0] == name and topic_name in TOPIC_CONFIGS:
            TOPIC_CONFIGS[topic_name].parse(name, value)


def _list_parts(value: str | None) -> list[str]:
    return [p for p in (value or "").split(",") if p]


def apply_incremental(
    current: Mapping[str, str], ops: list[tuple[str, int, str | None]], list_type: Callable[[str], bool],
    default: Callable[[str], str | None], broker: bool
) -> dict[str, str | None]:
    """The new values (None: removed) of the keys named by SET/DELETE/APPEND/SUBTRACT operations."""
    changes: dict[str, str | None] = {}
    for name, op, value in ops:
        old = changes[name] if name in changes else current.get(name)
        if op == OP_SET:
            changes[name] = value
        elif op == OP_DELETE:
            changes[name] = None
        elif op in (OP_APPEND, OP_SUBTRACT):
            if not list_type(name):
                if broker:
                    raise KafkaError(ErrorCode.INVALID_CONFIG, "Config value %s is not allowed for config key: %s"
                                     % ("append" if op == OP_APPEND else "subtract", name))
                raise KafkaError(ErrorCode.INVALID_CONFIG, "Can't %s to key %s because its type is not LIST."
                                 % (OP_NAMES[op], name))
            parts = _list_parts(old if old is not None else default(name))
            given = (value or "").split(",")
            if op == OP_APPEND:
                parts += [v for v in given if v not in parts]
            else:
                for v in given:
                    if v in parts:
                        parts.remove(v)
            changes[name] = ",".join(parts)
        else:
            raise KafkaError(ErrorCode.INVALID_REQUEST, "Unknown operations type %d" % op)
    return changes


def _topic_list_type(name: str) -> bool:
    d = TOPIC_CONFIG_DEFS.get(name)
    return d is not None and d.type == "list"


def _topic_default(name: str) -> str | None:
    d = TOPIC_CONFIG_DEFS.get(name)
    return d.default if d else None


def _broker_list_type(name: str) -> bool:
    prop = PROPS.get(name)
    if prop is None:
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Unknown config name: %s" % name)
    return prop.type == "list"


def validate_topic_configs(broker: BrokerServices, props: Mapping[str, str]) -> None:
    """Kafka's LogConfig validation of a topic's whole set of configs (INVALID_CONFIG)."""
    for name in props:
        if name not in TOPIC_CONFIG_DEFS and name not in INTERNAL_TOPIC_CONFIG_DEFS:
            raise KafkaError(ErrorCode.INVALID_CONFIG, "Unknown topic config name: %s" % name)
    broker.validate_topic_configs(dict(props))


# AlterConfigs and IncrementalAlterConfigs name their resources alike; the incremental one's
# configs carry an operation
AlterResource = M.AlterConfigsRequest.AlterConfigsResource | M.IncrementalAlterConfigsRequest.AlterConfigsResource
AlterRequest = M.AlterConfigsRequest | M.IncrementalAlterConfigsRequest
AlterResponse = M.AlterConfigsResponse | M.IncrementalAlterConfigsResponse
AlterableConfig = M.AlterConfigsRequest.AlterableConfig | M.IncrementalAlterConfigsRequest.AlterableConfig


def _is_delete(c: AlterableConfig) -> bool:
    return isinstance(c, M.IncrementalAlterConfigsRequest.AlterableConfig) and c.config_operation == OP_DELETE


def _check_resource(request_configs: Sequence[AlterableConfig], nulls_allowed: Callable[[AlterableConfig], bool]
                    ) -> None:
    counts = Counter(c.name for c in request_configs)
    if any(n > 1 for n in counts.values()):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    nulls = [c.name for c in request_configs if c.value is None and not nulls_allowed(c)]
    if nulls:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Null value not supported for : " + ", ".join(nulls))


def _alter_topic(broker: BrokerServices, name: str, new_configs: dict[str, str], changes: dict[str, str | None],
                 validate_only: bool) -> None:
    if not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Default topic resources are not allowed.")
    validate_topic_name(name)
    validate_topic_configs(broker, new_configs)
    if broker.metadata.topic(name) is None:
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic '%s' does not exist." % name)
    if not validate_only and changes:
        broker.alter_topic_configs(name, changes)


def _check_elr_min_isr(broker: BrokerServices, name: str, changes: Mapping[str, str | None]) -> None:
    """With ELR on (KIP-966), min.insync.replicas is cluster-wide only: Kafka's controller refuses a
    per-broker value and the removal of the cluster-level one."""
    if MIN_INSYNC_REPLICAS not in changes or broker.metadata.feature_level(features.ELR_VERSION) < 1:
        return
    if name:
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Broker-level %s cannot be altered while ELR is enabled."
                         % MIN_INSYNC_REPLICAS)
    if changes[MIN_INSYNC_REPLICAS] is None:
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Cluster-level %s cannot be removed while ELR is enabled."
                         % MIN_INSYNC_REPLICAS)


def _alter_broker(broker: BrokerServices, name: str, new_configs: dict[str, str], changes: dict[str, str | None],
                  validate_only: bool) -> None:
    validate_broker_configs(new_configs, per_broker=bool(name))
    _check_elr_min_isr(broker, name, changes)
    if not validate_only and changes:
        broker.metadata.set_configs(RESOURCE_BROKER, name, changes)
        broker.apply_dynamic_configs()


def _alter_group(broker: BrokerServices, name: str, new_configs: dict[str, str], changes: dict[str, str | None],
                 validate_only: bool) -> None:
    validate_group_configs(new_configs, broker.config.get)
    if not validate_only and changes:
        broker.metadata.set_configs(RESOURCE_GROUP, name, changes)
        broker.group_configs_changed(name)


def _current_configs(broker: BrokerServices, rtype: int, name: str) -> dict[str, str]:
    if rtype == RESOURCE_TOPIC:
        info = broker.metadata.topic(name)
        return dict(info.configs) if info is not None else {}
    if rtype == RESOURCE_CLIENT_METRICS:
        return current_client_metrics(broker, name)
    if rtype == RESOURCE_GROUP:
        return dict(broker.metadata.image.resource_configs[RESOURCE_GROUP].get(name, {}))
    return dict(broker.metadata.image.broker_configs.get(name, {}))


def _alter_resource(broker: BrokerServices, resource: AlterResource, validate_only: bool,
                    forwarded: bool = False) -> None:
    rtype, name = resource.resource_type, resource.resource_name
    incremental = isinstance(resource, M.IncrementalAlterConfigsRequest.AlterConfigsResource)
    if incremental:
        _check_resource(resource.configs, _is_delete)
    else:
        _check_resource(resource.configs, lambda c: False)
    if rtype == RESOURCE_BROKER:
        if name and not forwarded:  # forwarded: the node it reached checked that it names it
            _broker_id(name, broker.node_id, "Node id")
    elif rtype == RESOURCE_GROUP:
        _group_name(name)
    elif rtype not in (RESOURCE_TOPIC, RESOURCE_CLIENT_METRICS):
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Unknown resource type %d" % rtype)
    current = _current_configs(broker, rtype, name)
    if isinstance(resource, M.IncrementalAlterConfigsRequest.AlterConfigsResource):
        ops = [(c.name, c.config_operation, c.value) for c in resource.configs]
        if rtype == RESOURCE_TOPIC:
            changes = apply_incremental(current, ops, _topic_list_type, _topic_default, broker=False)
        elif rtype == RESOURCE_CLIENT_METRICS:
            changes = apply_incremental(current, ops, client_metrics_list_type, lambda n: None, broker=False)
        elif rtype == RESOURCE_GROUP:
            changes = apply_incremental(current, ops, lambda n: False, lambda n: None, broker=False)
        else:
            changes = apply_incremental(current, ops, _broker_list_type, STATIC_DEFAULTS.get, broker=True)
    else:
        # the legacy API replaces the whole set: what is not named is removed
        changes = {c.name: c.value for c in resource.configs}
        changes.update({k: None for k in current if k not in changes})
    new_configs = {k: v for k, v in {**current, **changes}.items() if v is not None}
    if rtype == RESOURCE_TOPIC:
        _alter_topic(broker, name, new_configs, changes, validate_only)
    elif rtype == RESOURCE_CLIENT_METRICS:
        alter_client_metrics(broker, name, new_configs, changes, validate_only)
    elif rtype == RESOURCE_GROUP:
        _alter_group(broker, name, new_configs, changes, validate_only)
    else:
        _alter_broker(broker, name, new_configs, changes, validate_only)


def _alter(ctx: RequestContext, resources: Sequence[AlterResource], validate_only: bool) -> list[KafkaError | None]:
    """Each resource's error (None: altered, or valid with `validate_only`)."""
    keys = Counter((r.resource_type, r.resource_name) for r in resources)
    forwarded = bool(getattr(ctx.connection, "forwarded", False))
    errors = []
    for resource in resources:
        error: KafkaError | None = None
        if keys[(resource.resource_type, resource.resource_name)] > 1:
            error = KafkaError(ErrorCode.INVALID_REQUEST, "Each resource must appear at most once.")
        else:
            error = config_access(ctx, resource.resource_type, resource.resource_name, Op.ALTER_CONFIGS)
            try:
                if error is None:
                    _alter_resource(ctx.broker, resource, validate_only, forwarded)
            except KafkaError as exc:
                error = exc
        errors.append(error)
    return errors


def refused_before_forwarding(node_id: int, request: AlterRequest) -> list[KafkaError | None]:
    """Kafka's ConfigAdminManager.preprocess on the node a config change reached, before it goes
    to the controller: a broker resource naming another broker is refused there (librdkafka and
    the Java admin send a broker's configs to that broker). None: the controller decides."""
    errors: list[KafkaError | None] = []
    for resource in request.resources:
        error = None
        if resource.resource_type == RESOURCE_BROKER and resource.resource_name:
            try:
                _broker_id(resource.resource_name, node_id, "Node id")
            except KafkaError as exc:
                error = exc
        errors.append(error)
    return errors


def reassemble(request: AlterRequest, refused: list[KafkaError | None], answered: AlterResponse | None
               ) -> AlterResponse:
    """The response to `request`: the resources refused here, and the controller's answer to the
    others (`answered`, in their order)."""
    R: Any = M.AlterConfigsResponse if isinstance(request, M.AlterConfigsRequest) else M.IncrementalAlterConfigsResponse
    rest = iter(answered.responses if answered is not None else ())
    responses = []
    resources: list[AlterResource] = list(request.resources)
    for resource, error in zip(resources, refused):
        if error is None:
            responses.append(next(rest))
        else:
            responses.append(R.AlterConfigsResourceResponse(
                error_code=int(error.code), error_message=error.message, resource_type=resource.resource_type,
                resource_name=resource.resource_name))
    response: AlterResponse = R(throttle_time_ms=answered.throttle_time_ms if answered is not None else 0,
                               responses=responses)
    return response


@api(33)
async def handle_alter_configs(ctx: RequestContext, request: M.AlterConfigsRequest) -> M.AlterConfigsResponse:
    R = M.AlterConfigsResponse
    errors = _alter(ctx, request.resources, request.validate_only)
    return R(throttle_time_ms=0, responses=[R.AlterConfigsResourceResponse(
        error_code=int(error.code) if error else 0, error_message=error.message if error else None,
        resource_type=resource.resource_type, resource_name=resource.resource_name,
    ) for resource, error in zip(request.resources, errors)])


@api(44)
async def handle_incremental_alter_configs(ctx: RequestContext, request: M.IncrementalAlterConfigsRequest
                                           ) -> M.IncrementalAlterConfigsResponse:
    R = M.IncrementalAlterConfigsResponse
    errors = _alter(ctx, request.resources, request.validate_only)
    return R(throttle_time_ms=0, responses=[R.AlterConfigsResourceResponse(
        error_code=int(error.code) if error else 0, error_message=error.message if error else None,
        resource_type=resource.resource_type, resource_name=resource.resource_name,
    ) for resource, error in zip(request.resources, errors)])
