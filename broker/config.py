"""Broker configuration: Kafka's property names, types, defaults and validation.

Configuration comes from a Java-style properties file and `--override key=value` options; every
property has Kafka's name and, unless noted, Kafka's default. `BrokerConfig` exposes typed values
(DescribeConfigs reports them, broker/apis/configs.py). The user's reference,
docs/configuration.md, is generated from these definitions (`markdown()`, by area), so it cannot
drift from them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from protocol.errors import ErrorCode, KafkaError

LONG_MAX = 9223372036854775807
INT_MAX = 2147483647


@dataclass(frozen=True)
class Prop:
    name: str
    type: str  # string, int, long, double, boolean, list, class, password
    default: Any
    doc: str
    read_only: bool = True  # False: AlterConfigs may change it at runtime (a log default this broker honours)
    sensitive: bool = False


_PROPS: list[Prop] = [
    # network and identity
    Prop("listeners", "list", ["PLAINTEXT://:9092"], "Comma-separated listener URIs the broker binds to."),
    Prop("advertised.listeners", "list", None, "Listeners given to clients in Metadata; defaults to `listeners`."),
    Prop("node.id", "int", 1, "Id of this broker (Kafka has no default; 1 here)."),
    Prop("broker.id", "int", -1, "Alias of node.id kept for older configurations."),
    Prop("cluster.id", "string", None, "Cluster id; generated once and kept in meta.properties when unset."),
    Prop("broker.rack", "string", None, "Rack of the broker, reported in Metadata."),
    Prop("socket.request.max.bytes", "int", 104857600, "Largest request frame accepted; larger closes the connection."),
    Prop("connections.max.idle.ms", "long", 600000, "Idle connections are closed after this many ms."),
    # listeners and security (broker/security/); every ssl.*, sasl.* and connections.* property may be
    # set for one listener as listener.name.<listener>.<property> (sasl.jaas.config per mechanism:
    # listener.name.<listener>.<mechanism>.sasl.jaas.config)
    Prop("listener.security.protocol.map", "string",
         "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT",
         "Security protocol of each listener name (NAME:PROTOCOL,...)."),
    Prop("inter.broker.listener.name", "string", None, "Listener the nodes of a cluster reach each other on (default: the one named as the protocol below)."),
    Prop("security.inter.broker.protocol", "string", "PLAINTEXT", "Names the inter-broker listener when inter.broker.listener.name is unset."),
    Prop("controller.listener.names", "list", None, "Listeners of the controller (not advertised to clients)."),
    Prop("ssl.keystore.type", "string", "JKS", "PEM (or PKCS12 with the cryptography package); JKS is not read."),
    Prop("ssl.keystore.location", "string", None, "Key store file: PEM private key and certificate chain."),
    Prop("ssl.keystore.password", "password", None, "Password of a PKCS12 key store."),
    Prop("ssl.key.password", "password", None, "Password of the (encrypted) PEM private key."),
    Prop("ssl.keystore.key", "password", None, "PEM private key given inline (with ssl.keystore.certificate.chain)."),
    Prop("ssl.keystore.certificate.chain", "password", None, "PEM certificate chain given inline."),
    Prop("ssl.truststore.type", "string", "JKS", "PEM (or PKCS12 with the cryptography package); JKS is not read."),
    Prop("ssl.truststore.location", "string", None, "Trust store file: PEM CA certificates."),
    Prop("ssl.truststore.password", "password", None, "Password of a PKCS12 trust store."),
    Prop("ssl.truststore.certificates", "password", None, "PEM CA certificates given inline."),
    Prop("ssl.client.auth", "string", "none", "Client certificates: none, requested or required."),
    Prop("ssl.protocol", "string", "TLSv1.3", "TLS protocol of the SSL context."),
    Prop("ssl.enabled.protocols", "list", ["TLSv1.2", "TLSv1.3"], "TLS versions accepted."),
    Prop("ssl.cipher.suites", "list", None, "Cipher suites (IANA or OpenSSL names); null: OpenSSL's defaults."),
    Prop("ssl.principal.mapping.rules", "string", "DEFAULT", "Rules mapping a client certificate's DN to a principal."),
    Prop("ssl.endpoint.identification.algorithm", "string", "https", "Host name verification of another node as the inter-broker client: https, or empty (off)."),
    Prop("sasl.jaas.config", "password", None,
         "JAAS entry of a SASL mechanism; set per listener as listener.name.<l>.<mechanism>.sasl.jaas.config."),
    Prop("sasl.enabled.mechanisms", "list", ["GSSAPI"],
         "SASL mechanisms of SASL listeners: PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER (GSSAPI is not served)."),
    Prop("sasl.mechanism.inter.broker.protocol", "string", "GSSAPI", "SASL mechanism the nodes of a cluster authenticate to each other with."),
    Prop("sasl.server.max.receive.size", "int", 524288, "Largest frame accepted before and during SASL authentication."),
    Prop("connections.max.reauth.ms", "long", 0, "Session lifetime of SASL connections (KIP-368); 0: no limit."),
    Prop("connection.failed.authentication.delay.ms", "int", 100, "Delay of the response to a failed authentication."),
    Prop("principal.builder.class", "class",
         "org.apache.kafka.common.security.authenticator.DefaultKafkaPrincipalBuilder",
         "Principal builder (only Kafka's default is available)."),
    Prop("authorizer.class.name", "string", "",
         "org.apache.kafka.metadata.authorizer.StandardAuthorizer turns ACL authorization on; empty: off."),
    Prop("super.users", "string", None, "Principals allowed everything, separated by ';' (User:admin;User:ops)."),
    Prop("allow.everyone.if.no.acl.found", "boolean", False, "Allow an action on a resource without ACLs."),
    Prop("quota.window.num", "int", 11, "Samples kept for client quota rates."),
    Prop("quota.window.size.seconds", "int", 1, "Length of one client quota sample."),
    Prop("max.incremental.fetch.session.cache.slots", "int", 1000,
         "Incremental fetch sessions (KIP-227) kept; 0 declines them (every fetch is answered in full)."),
    Prop("replication.quota.window.num", "int", 11, "Samples kept for replication throttle rates."),
    Prop("replication.quota.window.size.seconds", "int", 1, "Length of one replication throttle sample."),
    # logs
    Prop("log.dirs", "list", None, "Directories holding partition logs (falls back to log.dir)."),
    Prop("log.dir", "string", "/tmp/kafka-logs", "Directory holding partition logs when log.dirs is unset."),
    Prop("num.partitions", "int", 1, "Partitions of an auto-created topic or of CreateTopics with -1."),
    Prop("default.replication.factor", "int", 1, "Replication factor of auto-created topics."),
    Prop("auto.create.topics.enable", "boolean", True, "Create unknown topics on Metadata requests."),
    Prop("delete.topic.enable", "boolean", True, "Allow DeleteTopics."),
    Prop("message.max.bytes", "int", 1048588, "Largest record batch accepted (topic: max.message.bytes).", False),
    Prop("log.segment.bytes", "int", 1073741824, "Segment size (topic: segment.bytes).", False),
    Prop("log.roll.ms", "long", None, "Segment age before a roll (topic: segment.ms).", False),
    Prop("log.roll.hours", "int", 168, "Segment age in hours when log.roll.ms is unset."),
    Prop("log.roll.jitter.ms", "long", None, "Random jitter subtracted from the roll age (topic: segment.jitter.ms).", False),
    Prop("log.roll.jitter.hours", "int", 0, "Roll jitter in hours when log.roll.jitter.ms is unset."),
    Prop("log.retention.ms", "long", None, "Retention by time (topic: retention.ms); -1 keeps forever.", False),
    Prop("log.retention.minutes", "int", None, "Retention in minutes when log.retention.ms is unset."),
    Prop("log.retention.hours", "int", 168, "Retention in hours when ms and minutes are unset."),
    Prop("log.retention.bytes", "long", -1, "Retention by size per partition (topic: retention.bytes).", False),
    Prop("log.retention.check.interval.ms", "long", 300000, "How often retention runs."),
    Prop("log.cleanup.policy", "list", "delete", "delete, compact or both (topic: cleanup.policy).", False),
    Prop("log.cleaner.enable", "boolean", True, "Run the log cleaner for compacted topics."),
    Prop("log.cleaner.backoff.ms", "long", 15000, "Sleep between cleaner runs when there is nothing to clean."),
    Prop("log.cleaner.delete.retention.ms", "long", 86400000, "Tombstone retention (topic: delete.retention.ms).", False),
    Prop("log.cleaner.min.cleanable.ratio", "double", 0.5, "Dirty ratio that triggers cleaning.", False),
    Prop("log.cleaner.min.compaction.lag.ms", "long", 0, "Minimum age before compaction.", False),
    Prop("log.cleaner.max.compaction.lag.ms", "long", LONG_MAX, "Maximum age before compaction.", False),
    Prop("log.index.interval.bytes", "int", 4096, "Bytes between offset index entries.", False),
    Prop("log.index.size.max.bytes", "int", 10485760, "Size of an offset index file.", False),
    Prop("log.flush.interval.messages", "long", LONG_MAX, "Messages between fsyncs (topic: flush.messages).", False),
    Prop("log.flush.interval.ms", "long", None, "Ms between fsyncs (topic: flush.ms).", False),
    Prop("log.flush.scheduler.interval.ms", "long", LONG_MAX, "How often the flusher checks flush.ms."),
    Prop("log.flush.offset.checkpoint.interval.ms", "int", 60000, "How often the recovery point is checkpointed."),
    Prop("log.flush.start.offset.checkpoint.interval.ms", "int", 60000, "How often log start offsets are written."),
    Prop("log.segment.delete.delay.ms", "long", 60000, "Delay before a deleted segment's files are removed.", False),
    Prop("log.message.timestamp.type", "string", "CreateTime", "CreateTime or LogAppendTime.", False),
    Prop("log.message.timestamp.before.max.ms", "long", LONG_MAX, "Allowed age of a CreateTime timestamp.", False),
    Prop("log.message.timestamp.after.max.ms", "long", 3600000, "Allowed future skew of a timestamp.", False),
    Prop("log.preallocate", "boolean", False, "Preallocate segment files.", False),
    Prop("log.open.files.max", "int", -1,
         "Not in Kafka: the most segment and index files held open at once (the least recently used is "
         "closed first; files reopen on demand). -1: a quarter of the process's descriptor limit."),
    Prop("log.open.files.idle.ms", "long", 60000,
         "Not in Kafka: segment and index files unused for this long (up to twice as long) are closed."),
    Prop("compression.type", "string", "producer", "Compression of stored batches; producer keeps theirs.", False),
    Prop("compression.gzip.level", "int", -1, "Gzip level when compression.type is gzip.", False),
    Prop("compression.lz4.level", "int", 9, "Lz4 level when compression.type is lz4.", False),
    Prop("compression.zstd.level", "int", 3, "Zstd level when compression.type is zstd.", False),
    Prop("min.insync.replicas", "int", 1, "Replicas that must acknowledge an acks=all write (topic: min.insync.replicas).",
         False),
    Prop("unclean.leader.election.enable", "boolean", False, "Allow out-of-sync replicas to become leader.", False),
    Prop("replica.lag.time.max.ms", "long", 30000,
         "A follower not caught up with its leader for this long leaves the ISR."),
    Prop("log.local.retention.ms", "long", -2, "Local retention with tiered storage; -2 follows retention.ms.", False),
    Prop("log.local.retention.bytes", "long", -2, "Local retention with tiered storage; -2 follows retention.bytes.",
         False),
    # coordinators
    Prop("offsets.topic.num.partitions", "int", 50, "Partitions of __consumer_offsets."),
    Prop("offsets.topic.replication.factor", "short", 1, "Replication factor of __consumer_offsets (Kafka: 3; unset in a cluster: 3 at most the live brokers)."),
    Prop("offsets.topic.segment.bytes", "int", 104857600, "Segment size of __consumer_offsets."),
    Prop("offsets.retention.minutes", "int", 10080, "Retention of committed offsets of empty groups."),
    Prop("offsets.retention.check.interval.ms", "long", 600000, "How often expired offsets are swept."),
    Prop("offsets.commit.timeout.ms", "int", 5000,
         "How long a group coordinator write (a commit, a join) waits for its records to be replicated "
         "to every in-sync replica before it fails (COORDINATOR_NOT_AVAILABLE)."),
    Prop("offset.metadata.max.bytes", "int", 4096, "Largest metadata string of a committed offset."),
    Prop("group.initial.rebalance.delay.ms", "int", 3000, "Delay of the first rebalance of a new group."),
    Prop("group.min.session.timeout.ms", "int", 6000, "Smallest session timeout a member may ask for."),
    Prop("group.max.session.timeout.ms", "int", 1800000, "Largest session timeout a member may ask for."),
    Prop("group.max.size", "int", INT_MAX, "Largest number of members of a classic group."),
    # KIP-848 consumer groups
    Prop("group.consumer.assignors", "list", "uniform,range",
         "Server-side assignors of consumer groups (uniform, range); the first is the default."),
    Prop("group.consumer.heartbeat.interval.ms", "int", 5000, "Heartbeat interval given to consumer group members."),
    Prop("group.consumer.session.timeout.ms", "int", 45000, "Session timeout of consumer group members."),
    Prop("group.consumer.min.session.timeout.ms", "int", 45000, "Smallest consumer group session timeout."),
    Prop("group.consumer.max.session.timeout.ms", "int", 60000, "Largest consumer group session timeout."),
    Prop("group.consumer.max.size", "int", INT_MAX, "Largest number of members of a consumer group."),
    Prop("group.consumer.assignment.interval.ms", "int", 0,
         "Least time between two target assignments of a consumer group (Kafka 4.3; 0: at once, as Kafka 4.2)."),
    Prop("group.consumer.regex.refresh.interval.ms", "int", 600000,
         "How often the topics matching consumer groups' regular expressions are resolved again."),
    Prop("group.heartbeat.hold.ms", "int", 0,
         "Not in Kafka: the longest a group member's heartbeat that brings nothing new is held until there is "
         "news for it (a rebalance, partitions to take), so that members learn of changes before their next "
         "heartbeat. 0 (default): every heartbeat is answered at once, as Kafka does; -1: as long as the clients "
         "allow (a third of the session timeout up to 5 s for classic members, the heartbeat interval less 1 s, or "
         "half of it, for consumer and share members). Beware: librdkafka keeps one heartbeat in flight per member, "
         "so while one is held that member's next heartbeat (a new subscription, an acknowledged revocation, a "
         "leave) waits for it."),
    Prop("group.consumer.migration.policy", "string", "bidirectional",
         "Online conversion between classic and consumer groups: bidirectional, upgrade, downgrade, disabled."),
    Prop("group.consumer.min.heartbeat.interval.ms", "int", 5000, "Smallest consumer group heartbeat interval."),
    Prop("group.consumer.max.heartbeat.interval.ms", "int", 15000, "Largest consumer group heartbeat interval."),
    # share groups (KIP-932)
    Prop("group.share.heartbeat.interval.ms", "int", 5000, "Heartbeat interval given to share group members."),
    Prop("group.share.min.heartbeat.interval.ms", "int", 5000, "Smallest share group heartbeat interval."),
    Prop("group.share.max.heartbeat.interval.ms", "int", 15000, "Largest share group heartbeat interval."),
    Prop("group.share.session.timeout.ms", "int", 45000, "Session timeout of share group members."),
    Prop("group.share.min.session.timeout.ms", "int", 45000, "Smallest share group session timeout."),
    Prop("group.share.max.session.timeout.ms", "int", 60000, "Largest share group session timeout."),
    Prop("group.share.max.size", "int", 200, "Largest number of members of a share group."),
    Prop("group.share.record.lock.duration.ms", "int", 30000, "How long an acquired record is locked to its member."),
    Prop("group.share.min.record.lock.duration.ms", "int", 15000, "Smallest share.record.lock.duration.ms of a group."),
    Prop("group.share.max.record.lock.duration.ms", "int", 60000, "Largest share.record.lock.duration.ms of a group."),
    Prop("group.share.delivery.count.limit", "int", 5, "Deliveries of a record before it is archived."),
    Prop("group.share.min.delivery.count.limit", "int", 2, "Smallest share.delivery.count.limit of a group."),
    Prop("group.share.max.delivery.count.limit", "int", 10, "Largest share.delivery.count.limit of a group."),
    Prop("group.share.partition.max.record.locks", "int", 2000, "Records in flight per share-partition."),
    Prop("group.share.min.partition.max.record.locks", "int", 100,
         "Smallest share.partition.max.record.locks of a group."),
    Prop("group.share.max.partition.max.record.locks", "int", 4000,
         "Largest share.partition.max.record.locks of a group."),
    Prop("group.share.max.share.sessions", "int", 2000, "Share sessions this broker keeps."),
    Prop("share.coordinator.state.topic.num.partitions", "int", 50, "Partitions of __share_group_state."),
    Prop("share.coordinator.state.topic.segment.bytes", "int", 104857600, "Segment size of __share_group_state."),
    Prop("share.coordinator.state.topic.replication.factor", "short", 1,
         "Replication factor of __share_group_state (Kafka: 3; unset in a cluster: 3 at most the live brokers)."),
    Prop("share.coordinator.snapshot.update.records.per.snapshot", "int", 500,
         "ShareUpdate records of a share-partition between two ShareSnapshot records."),
    Prop("share.coordinator.write.timeout.ms", "int", 5000,
         "How long a share coordinator write waits for its records to be replicated to every in-sync replica."),
    Prop("share.coordinator.state.topic.prune.interval.ms", "long", 300000,
         "How often records superseded by newer snapshots are removed from __share_group_state."),
    Prop("errors.deadletterqueue.topic.name.prefix", "string", "dlq.",
         "Prefix every share group dead-letter queue topic name must have (KIP-1191)."),
    Prop("errors.deadletterqueue.auto.create.topics.enable", "boolean", False,
         "Create a share group's dead-letter queue topic when it does not exist (KIP-1191)."),
    Prop("transaction.state.log.num.partitions", "int", 50, "Partitions of __transaction_state."),
    Prop("transaction.state.log.segment.bytes", "int", 104857600, "Segment size of __transaction_state."),
    Prop("transaction.state.log.replication.factor", "short", 1,
         "Replication factor of __transaction_state (Kafka: 3; unset in a cluster: 3 at most the live brokers)."),
    Prop("transactional.id.expiration.ms", "int", 604800000, "Expiry of idle transactional ids."),
    Prop("transaction.max.timeout.ms", "int", 900000, "Largest transaction timeout."),
    Prop("transaction.abort.timed.out.transaction.cleanup.interval.ms", "int", 10000,
         "How often transactions older than their timeout are aborted."),
    Prop("transaction.remove.expired.transaction.cleanup.interval.ms", "int", 3600000,
         "How often expired transactional ids are removed."),
    Prop("producer.id.expiration.ms", "int", 86400000, "Expiry of idle idempotent producer state."),
    Prop("telemetry.max.bytes", "int", 1048576, "Largest metrics payload a client may push (KIP-714)."),
    # operations
    Prop("metrics.port", "int", -1,
         "Port of the HTTP endpoint with Prometheus /metrics and /faults (fault injection); -1 disables it (not in "
         "Kafka)."),
    Prop("metrics.host", "string", "127.0.0.1", "Address the /metrics and /faults endpoint binds to (not in Kafka)."),
    Prop("log.format", "string", "console", "console (key=value) or json log lines (not in Kafka)."),
    Prop("log.level", "string", "INFO", "DEBUG logs every request (not in Kafka)."),
    Prop("simulated.brokers", "int", 1,
         "Answer as a cluster of this many brokers (ids node.id and up, node k on each listener's port + k): "
         "replicas, leaders and coordinators spread over them, nothing replicated (not in Kafka)."),
    # a cluster of separate processes and hosts (docs/cluster.md)
    Prop("etcd.endpoints", "string", None,
         "Comma-separated http://host:port URLs of the etcd cluster that holds the controller election and the "
         "metadata log: set, this broker is one node of a cluster (every node gets the same value); unset, a "
         "single node with its local metadata log (not in Kafka)."),
    Prop("etcd.root", "string", "/kafka",
         "Key prefix of the cluster in etcd: its data lives under <root>/<cluster id>/ (not in Kafka)."),
    Prop("etcd.lease.timeout.ms", "int", 3000,
         "The etcd lease of a node (whole seconds): a dead controller is replaced, and a dead node's id freed, "
         "within it (not in Kafka)."),
    Prop("broker.session.timeout.ms", "int", 9000,
         "A broker whose heartbeats to the controller stop for this long is fenced."),
    Prop("broker.heartbeat.interval.ms", "int", 2000, "How often a broker heartbeats to the controller."),
    Prop("initial.broker.registration.timeout.ms", "int", 60000,
         "How long a starting node waits for etcd to answer and for the cluster's first controller before it "
         "declares failure and exits."),
    Prop("auto.leader.rebalance.enable", "boolean", True,
         "The controller moves leaderships back to each partition's preferred replica (its first) when it "
         "is in sync, every leader.imbalance.check.interval.seconds."),
    Prop("leader.imbalance.check.interval.seconds", "long", 300,
         "How often the controller looks for partitions not led by their preferred replica."),
    Prop("leader.imbalance.per.broker.percentage", "int", 10,
         "Kafka's ZooKeeper-era threshold, kept for its name: a KRaft controller (and this one) rebalances "
         "every imbalanced partition."),
    Prop("metadata.log.max.record.bytes.between.snapshots", "int", 20971520,
         "The controller writes a snapshot of the metadata to etcd after this many bytes of records, and "
         "deletes the log behind it."),
    Prop("replica.fetch.wait.max.ms", "int", 500,
         "How long a follower's fetch waits at the leader for data (replica.fetch.min.bytes)."),
    Prop("replica.fetch.min.bytes", "int", 1, "The bytes a follower's fetch waits for at the leader."),
    Prop("replica.fetch.max.bytes", "int", 1048576,
         "The bytes a follower fetches per partition at most (a first batch larger than it comes whole)."),
    Prop("replica.fetch.response.max.bytes", "int", 10485760,
         "The bytes of a whole fetch response a follower asks for at most."),
    Prop("replica.fetch.backoff.ms", "int", 1000, "How long a follower waits after a fetch error for a partition."),
]

PROPS: dict[str, Prop] = {p.name: p for p in _PROPS}

# The areas of the configuration reference (docs/configuration.md): each starts at its property in
# _PROPS and runs to the next area's first property, so a property added inside an area joins it.
AREAS: tuple[tuple[str, str], ...] = (
    ("listeners", "Network and identity"),
    ("listener.security.protocol.map", "Listeners and TLS"),
    ("sasl.jaas.config", "SASL"),
    ("principal.builder.class", "Principals, ACLs and quotas"),
    ("log.dirs", "Logs and topics"),
    ("offsets.topic.num.partitions", "Committed offsets and classic groups"),
    ("group.consumer.assignors", "Consumer groups (KIP-848)"),
    ("group.share.heartbeat.interval.ms", "Share groups (KIP-932)"),
    ("transaction.state.log.num.partitions", "Transactions and producer state"),
    ("telemetry.max.bytes", "Client telemetry (KIP-714)"),
    ("metrics.port", "Metrics, fault injection and logs"),
    ("simulated.brokers", "Simulated cluster"),
    ("etcd.endpoints", "Cluster of processes and hosts"),
)


def base_property(name: str) -> Prop | None:
    """The property a name sets, also through a listener prefix (listener.name.<l>.[<mechanism>.]<prop>)."""
    prop = PROPS.get(name)
    if prop is not None or not name.startswith("listener.name."):
        return prop
    rest = name[len("listener.name."):].split(".", 1)[-1]  # drop the listener name
    return PROPS.get(rest) or PROPS.get(rest.split(".", 1)[-1])  # and a mechanism prefix


def _parse(prop: Prop, raw: Any) -> Any:
    if raw is None:
        return None
    if not isinstance(raw, str):
        return raw
    text = raw.strip()
    try:
        if prop.type in ("int", "long", "short"):
            return int(text)
        if prop.type == "double":
            return float(text)
        if prop.type == "boolean":
            if text.lower() not in ("true", "false"):
                raise ValueError(text)
            return text.lower() == "true"
        if prop.type == "list":
            return [x.strip() for x in text.split(",") if x.strip()]
    except ValueError:
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Invalid value %s for configuration %s" % (raw, prop.name)) from None
    return text


# Variables of apache/kafka's image that are not broker properties (JVM and log4j settings)
_NOT_PROPERTIES = frozenset({
    "KAFKA_VERSION", "KAFKA_HEAP_OPT", "KAFKA_HEAP_OPTS", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS", "KAFKA_JMX_OPTS",
    "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS", "KAFKA_LOG4J_ROOT_LOGLEVEL", "KAFKA_LOG4J_LOGGERS",
    "KAFKA_TOOLS_LOG4J_LOGLEVEL",
})
_UNDERSCORES = re.compile("_+")


def env_property_name(variable: str) -> str:
    """A KAFKA_* variable's property, as apache/kafka's image names it: the prefix dropped, `_`
    becomes `.`, `__` becomes `_`, `___` becomes `-`, lower case (KAFKA_LOG_DIRS: log.dirs)."""
    runs = {1: ".", 2: "_", 3: "-"}
    return _UNDERSCORES.sub(lambda m: runs.get(len(m.group()), m.group()), variable[len("KAFKA_"):]).lower()


def env_properties(environ: Mapping[str, str]) -> dict[str, str]:
    """Broker properties from environment variables, as apache/kafka's image takes them:
    every KAFKA_* variable but its JVM and log4j ones, CLUSTER_ID for cluster.id, and
    `listeners` derived from `advertised.listeners` (hosts made 0.0.0.0) when not given."""
    out = {env_property_name(k): v for k, v in environ.items() if k.startswith("KAFKA_") and k not in _NOT_PROPERTIES}
    if environ.get("CLUSTER_ID"):
        out.setdefault("cluster.id", environ["CLUSTER_ID"])
    if "listeners" not in out and out.get("advertised.listeners"):
        out["listeners"] = re.sub(r"://[^:]*:", "://0.0.0.0:", out["advertised.listeners"])
    return out


def read_properties(path: str | Path) -> dict[str, str]:
    """Java properties files: key=value or key: value, # and ! comments, backslash continuations."""
    out: dict[str, str] = {}
    pending = ""
    for raw in Path(path).read_text().splitlines():
        line = pending + raw.strip()
        pending = ""
        if not line or line[0] in "#!":
            continue
        if line.endswith("\\"):
            pending = line[:-1]
            continue
        for i, ch in enumerate(line):
            if ch in "=:":
                out[line[:i].strip()] = line[i + 1 :].strip()
                break
        else:
            out[line] = ""
    return out


@dataclass(frozen=True)
class Listener:
    name: str
    host: str
    port: int


def parse_listener(uri: str) -> Listener:
    name, _, rest = uri.partition("://")
    host, _, port = rest.rpartition(":")
    if not port.isdigit():
        raise KafkaError(ErrorCode.INVALID_CONFIG, "Invalid listener %r" % uri)
    return Listener(name or "PLAINTEXT", host.strip("[]"), int(port))


class BrokerConfig:
    """Typed broker configuration; `values` holds only what was set explicitly."""

    def __init__(self, values: Mapping[str, Any] | None = None) -> None:
        self.values: dict[str, Any] = {}
        self.raw: dict[str, str] = {}  # explicitly set properties as text (topic-config synonyms need them)
        self.dynamic: dict[str, Any] = {}  # parsed dynamic values, per-broker over cluster-wide
        self.dynamic_default: dict[str, str] = {}  # dynamic cluster-wide defaults (resource name "")
        self.dynamic_broker: dict[str, str] = {}  # dynamic configs of this node (resource name = node id)
        for key, value in (values or {}).items():
            prop = PROPS.get(key)
            self.values[key] = _parse(prop, value) if prop else value
            self.raw[key] = ",".join(value) if isinstance(value, list) else str(value)

    @classmethod
    def load(cls, path: str | Path | None = None, overrides: Iterable[str] = (),
             environ: Mapping[str, str] | None = None) -> BrokerConfig:
        """The properties file, then the KAFKA_* variables of `environ` (env_properties), then
        the --override options: each wins over the one before."""
        values: dict[str, Any] = dict(read_properties(path)) if path else {}
        values.update(env_properties(environ or {}))
        for item in overrides:
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError("--override expects key=value, got %r" % item)
            values[key.strip()] = value.strip()
        return cls(values)

    def set_dynamic(self, cluster_default: Mapping[str, str], per_broker: Mapping[str, str]) -> None:
        """Install the dynamic broker configs (AlterConfigs on the broker resource); a per-broker
        value wins over a cluster-wide one, both over the static configuration."""
        self.dynamic_default = dict(cluster_default)
        self.dynamic_broker = dict(per_broker)
        self.dynamic = {}
        for key, value in {**self.dynamic_default, **self.dynamic_broker}.items():
            prop = PROPS.get(key)
            self.dynamic[key] = _parse(prop, value) if prop else value

    @property
    def effective_raw(self) -> dict[str, str]:
        """Every explicitly set property as text, dynamic values over static ones."""
        return {**self.raw, **self.dynamic_default, **self.dynamic_broker}

    def get(self, name: str) -> Any:
        if name in self.dynamic:
            return self.dynamic[name]
        if name in self.values:
            return self.values[name]
        prop = PROPS.get(name)
        return prop.default if prop else None

    def is_default(self, name: str) -> bool:
        return name not in self.values and name not in self.dynamic

    def __getitem__(self, name: str) -> Any:
        return self.get(name)

    # derived values, resolved the way Kafka resolves its fallbacks ---------------------------
    @property
    def node_id(self) -> int:
        node = self.get("node.id")
        broker = self.get("broker.id")
        return broker if self.is_default("node.id") and broker >= 0 else node

    @property
    def static_min_insync_replicas(self) -> int:
        """min.insync.replicas of the static configuration (Kafka's getStaticallyConfiguredMinInsyncReplicas)."""
        value = self.values.get("min.insync.replicas")
        return int(value) if value is not None else int(PROPS["min.insync.replicas"].default)

    @property
    def log_dirs(self) -> list[str]:
        dirs = self.get("log.dirs")
        return list(dirs) if dirs else [self.get("log.dir")]

    @property
    def listeners(self) -> list[Listener]:
        return [parse_listener(u) for u in self.get("listeners")]

    @property
    def advertised_listeners(self) -> list[Listener]:
        adv = self.get("advertised.listeners")
        if adv:
            return [parse_listener(u) for u in adv]
        controllers = {n.upper() for n in self.get("controller.listener.names") or []}
        return [listener for listener in self.listeners if listener.name.upper() not in controllers]

    @property
    def security_protocol_map(self) -> dict[str, str]:
        """listener.security.protocol.map as {listener name: security protocol}."""
        out: dict[str, str] = {}
        for item in str(self.get("listener.security.protocol.map") or "").split(","):
            name, sep, protocol = item.strip().partition(":")
            if not sep or not name.strip() or not protocol.strip():
                raise KafkaError(ErrorCode.INVALID_CONFIG, "Invalid listener.security.protocol.map entry %r" % item)
            out[name.strip().upper()] = protocol.strip().upper()
        return out

    def listener_value(self, listener: str, name: str, mechanism: str | None = None) -> Any:
        """A property as one listener sees it: listener.name.<listener>.[<mechanism>.]<name> over
        the broker-wide value, as Kafka's per-listener overrides."""
        prefix = "listener.name.%s." % listener.lower()
        keys = [prefix + mechanism.lower() + "." + name] if mechanism else []
        keys.append(prefix + name)
        for key in keys:
            for layer in (self.dynamic, self.values):
                if key in layer:
                    prop = PROPS.get(name)
                    return _parse(prop, layer[key]) if prop else layer[key]
        return self.get(name)

    @property
    def log_retention_ms(self) -> int:
        if self.get("log.retention.ms") is not None:
            return int(self.get("log.retention.ms"))
        if self.get("log.retention.minutes") is not None:
            return int(self.get("log.retention.minutes")) * 60_000
        return int(self.get("log.retention.hours")) * 3_600_000

    @property
    def log_roll_ms(self) -> int:
        if self.get("log.roll.ms") is not None:
            return int(self.get("log.roll.ms"))
        return int(self.get("log.roll.hours")) * 3_600_000

    @property
    def log_flush_interval_ms(self) -> int:
        value = self.get("log.flush.interval.ms")
        return int(value) if value is not None else int(self.get("log.flush.scheduler.interval.ms"))


def help_text() -> str:
    lines = ["Configuration properties (set in the properties file or with --override key=value):", ""]
    for p in _PROPS:
        lines.append("  %-44s %s (default: %s)" % (p.name, p.doc, default_text(p)))
    return "\n".join(lines)


def areas() -> list[tuple[str, list[Prop]]]:
    """The properties by area (AREAS), in the order of their definitions."""
    starts = dict(AREAS)
    missing = [name for name in starts if name not in PROPS]
    if missing or _PROPS[0].name not in starts:
        raise ValueError("AREAS must start at defined properties, the first at %s: %s" % (_PROPS[0].name, missing))
    out: list[tuple[str, list[Prop]]] = []
    for prop in _PROPS:
        if prop.name in starts:
            out.append((starts[prop.name], []))
        out[-1][1].append(prop)
    return out


def default_text(prop: Prop) -> str:
    """A default as a properties file spells it (Java's booleans, lists comma-separated)."""
    value = prop.default
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(value)
    return str(value) if value != "" else '""'


def _cell(text: str, code: bool = False) -> str:
    """Table cell text: `|` would end the cell; outside a code span `<...>` would be read as an HTML tag."""
    text = text.replace("|", "\\|")
    return ("`%s`" % text) if code else text.replace("<", "&lt;").replace(">", "&gt;")


MARKDOWN_INTRO = """\
# Configuration reference

Every property the broker reads, with its type, default and meaning, by area. The names and
defaults are Kafka's; a description that says "not in Kafka" marks this broker's own. Set them in
a `server.properties` file, with `KAFKA_*` environment variables (`KAFKA_LOG_RETENTION_MS` is
`log.retention.ms`, see [docker.md](docker.md)) or with `--override key=value`; each wins over the
one before. `python -m broker --help` prints the same list.

Every `ssl.*`, `sasl.*` and `connections.*` property may also be set for one listener as
`listener.name.<listener>.<property>` (a JAAS entry per mechanism:
`listener.name.<listener>.<mechanism>.sasl.jaas.config`); see [security.md](security.md).
Topic configs (`retention.ms`, `cleanup.policy`, ...) take their defaults from the `log.*`
properties named in their descriptions.

This page is generated from `broker/config.py`; do not edit it. After changing a property:
`python -m broker.config --markdown > docs/configuration.md` (tests/docs/test_docs.py checks it).
"""


def markdown() -> str:
    """docs/configuration.md: the properties by area as Markdown tables."""
    sections = areas()
    lines = [MARKDOWN_INTRO]
    lines += ["- [%s](#%s)" % (title, _anchor(title)) for title, _ in sections]
    for title, props in sections:
        lines += ["", "## " + title, "", "| property | type | default | description |", "|---|---|---|---|"]
        lines += ["| `%s` | %s | %s | %s |" % (p.name, p.type, _cell(default_text(p), code=True), _cell(p.doc))
                  for p in props]
    return "\n".join(lines) + "\n"


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation dropped, spaces made hyphens."""
    return re.sub(r"[^a-z0-9 _-]", "", title.lower()).replace(" ", "-")


if __name__ == "__main__":
    import sys

    if sys.argv[1:] != ["--markdown"]:
        sys.exit("usage: python -m broker.config --markdown > docs/configuration.md")
    sys.stdout.write(markdown())
