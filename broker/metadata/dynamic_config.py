"""Which broker configs AlterConfigs / IncrementalAlterConfigs may change, and Kafka's checks of
such an update (DynamicBrokerConfig.AllDynamicConfigs and validateConfigs, Kafka 4.x).

Kafka refuses only the names it knows as static broker configs; a name it does not know at all
is stored. Here "known" is every property this broker defines (broker.config.PROPS) plus the
dynamic set, so Kafka configs this broker has no property for are stored as Kafka stores custom
ones. Listener, SSL and SASL settings are accepted and described as Kafka does; the listeners
themselves are built at start-up, so a changed value does not reconfigure a running listener.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from broker.config import PROPS
from broker.log.config import TOPIC_SYNONYMS
from protocol.errors import ErrorCode, KafkaError

# SslConfigs.RECONFIGURABLE_CONFIGS: the key and trust stores (per listener only)
SSL_RECONFIGURABLE = frozenset({
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.password",
    "ssl.keystore.certificate.chain", "ssl.keystore.key", "ssl.truststore.certificates",
})
# DynamicListenerConfig.ReconfigurableConfigs
LISTENER_RECONFIGURABLE = frozenset({
    "listeners", "listener.security.protocol.map",
    "principal.builder.class", "ssl.protocol", "ssl.provider", "ssl.cipher.suites", "ssl.enabled.protocols",
    "ssl.keystore.type", "ssl.keystore.location", "ssl.keystore.password", "ssl.key.password",
    "ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.password", "ssl.keymanager.algorithm",
    "ssl.trustmanager.algorithm", "ssl.endpoint.identification.algorithm", "ssl.secure.random.implementation",
    "ssl.client.auth", "ssl.engine.factory.class",
    "sasl.mechanism.inter.broker.protocol", "sasl.jaas.config", "sasl.enabled.mechanisms",
    "sasl.kerberos.service.name", "sasl.kerberos.kinit.cmd", "sasl.kerberos.ticket.renew.window.factor",
    "sasl.kerberos.ticket.renew.jitter", "sasl.kerberos.min.time.before.relogin",
    "sasl.kerberos.principal.to.local.rules", "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter", "sasl.login.refresh.min.period.seconds", "sasl.login.refresh.buffer.seconds",
    "max.connections", "max.connection.creation.rate", "num.network.threads",
})
# the broker default of each topic config (ServerTopicConfigSynonyms: its first synonym only)
LOG_RECONFIGURABLE = frozenset(synonyms[0][0] for synonyms in TOPIC_SYNONYMS.values())
OTHER_RECONFIGURABLE = frozenset({
    # LogCleaner
    "log.cleaner.threads", "log.cleaner.io.max.bytes.per.second", "log.cleaner.dedupe.buffer.size",
    "log.cleaner.io.buffer.size", "message.max.bytes", "log.cleaner.io.buffer.load.factor", "log.cleaner.backoff.ms",
    # DynamicThreadPool
    "num.io.threads", "num.replica.fetchers", "num.recovery.threads.per.data.dir", "background.threads",
    # SocketServer
    "max.connections.per.ip", "max.connections.per.ip.overrides", "max.connections", "max.connection.creation.rate",
    # producer state
    "producer.id.expiration.ms", "transaction.partition.verification.enable",
    # DynamicRemoteLogConfig, DynamicReplicationConfig
    "remote.log.index.file.cache.total.size.bytes", "remote.fetch.max.wait.ms",
    "remote.log.manager.copy.max.bytes.per.second", "remote.log.manager.fetch.max.bytes.per.second",
    "remote.list.offsets.request.timeout.ms", "remote.log.manager.copier.thread.pool.size",
    "remote.log.manager.expiration.thread.pool.size", "remote.log.manager.follower.thread.pool.size",
    "remote.log.reader.threads", "follower.fetch.last.tiered.offset.enable",
    # GroupCoordinatorConfig, ShareCoordinatorConfig
    "group.coordinator.cached.buffer.max.bytes", "group.consumer.assignment.interval.ms",
    "group.consumer.assignor.offload.enable", "group.share.assignment.interval.ms",
    "group.share.assignor.offload.enable", "group.streams.assignment.interval.ms",
    "group.streams.assignor.offload.enable", "share.coordinator.cached.buffer.max.bytes",
    "metric.reporters", "config.providers",
})
# QuotaConfig.brokerQuotaConfigs: only dynamic, no static property (bytes per second, unbounded
# by default); the replication throttles (broker/cluster/replication_quota.py) take them from here
LEADER_REPLICATION_THROTTLED_RATE = "leader.replication.throttled.rate"
FOLLOWER_REPLICATION_THROTTLED_RATE = "follower.replication.throttled.rate"
REPLICATION_RATES = frozenset({LEADER_REPLICATION_THROTTLED_RATE, FOLLOWER_REPLICATION_THROTTLED_RATE,
                               "replica.alter.log.dirs.io.max.bytes.per.second"})
ALL_DYNAMIC = SSL_RECONFIGURABLE | LISTENER_RECONFIGURABLE | LOG_RECONFIGURABLE | OTHER_RECONFIGURABLE
_CLUSTER_LEVEL_LISTENER = frozenset({"max.connections", "max.connection.creation.rate", "num.network.threads"})
PER_BROKER = (SSL_RECONFIGURABLE | LISTENER_RECONFIGURABLE) - _CLUSTER_LEVEL_LISTENER
_LISTENER_CONFIG = re.compile(r"listener\.name\.[^.]*\.(.*)")


def is_dynamic(name: str) -> bool:
    """Whether AlterConfigs may change a broker config (DescribeConfigs' read_only is the opposite)."""
    return name in ALL_DYNAMIC


def check_update(props: Mapping[str, str], per_broker: bool) -> None:
    """Kafka's validateConfigs on the whole new set of a broker resource's dynamic configs:
    INVALID_REQUEST with Kafka's message naming the refused configs."""
    _refuse((n for n in props if n in PROPS and n not in ALL_DYNAMIC), "Cannot update these configs dynamically")
    _refuse((n for n in props if n in SSL_RECONFIGURABLE),
            "These security configs can be dynamically updated only per-listener using the listener prefix")
    if not per_broker:
        _refuse((n for n in props if n in PER_BROKER or _per_broker_listener_config(n)),
                "Cannot update these configs at default cluster level, broker id must be specified")


def listener_base_name(name: str) -> str:
    """The config a listener-prefixed name sets (listener.name.<l>.<config>), else the name."""
    found = _LISTENER_CONFIG.fullmatch(name)
    return found.group(1) if found else name


def _per_broker_listener_config(name: str) -> bool:
    found = _LISTENER_CONFIG.fullmatch(name)
    return found is not None and found.group(1) not in _CLUSTER_LEVEL_LISTENER


def _refuse(names: Iterable[str], message: str) -> None:
    refused = sorted(set(names))
    if refused:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "%s: Set(%s)" % (message, ", ".join(refused)))
