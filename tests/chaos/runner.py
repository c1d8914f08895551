"""One fault run, start to verdict: a ProcessCluster on its own etcd, the workload's topics, the
workers and the nemesis for `duration` seconds, every fault healed, the workers finished, a final
read of every partition, the cluster stopped and the replicas' segment files compared, then the
checker over the history. Everything drawn at random comes from `RunConfig.seed`: the fault
schedule, the producers' partitions and transactions, the members' lifetimes and acknowledgement
types (what the machine's timing makes of them differs between runs; the history records it).

tests/chaos/test_chaos.py runs short ones; `bench/chaos.py --seed N --duration S` long ones.
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from protocol import messages as M
from tests.chaos.checker import Violation, check, summary
from tests.chaos.history import History, Kind
from tests.chaos.nemesis import NETWORK_FAULTS, Fault, Nemesis, describe, schedule
from tests.chaos.network import Network
from tests.chaos.workload import GroupMember, IdempotentProducer, ShareMember, TransactionalProducer, Worker
from tests.cluster.harness import ETCD_MEMBER, ProcessCluster, member_name
from tests.cluster.nodes import call, create_topic, leaders, metadata, start_cluster, wait_leaders, wait_live
from tests.harness import wait_for

IDEMPOTENT_TOPIC = "chaos-idempotent"
ALTER_PARTITION_REASSIGNMENTS = 45
TXN_TOPIC = "chaos-txn"
# group and share timings short enough for a run of seconds (Kafka's defaults stay the defaults)
OVERRIDES = {
    "group.consumer.heartbeat.interval.ms": "500",
    "group.consumer.min.heartbeat.interval.ms": "500",
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.session.timeout.ms": "6000",
    "group.share.min.session.timeout.ms": "1000",
    "group.share.record.lock.duration.ms": "5000",
    "group.share.min.record.lock.duration.ms": "1000",
}
SAFE_WITH_ONE_REPLICA = (Fault.KILL, Fault.PAUSE, Fault.ETCD_KILL, Fault.ETCD_PAUSE)
CLIENTS = "clients"  # the network member of the workload's clients and the runner


@dataclass(frozen=True)
class RunConfig:
    seed: int
    duration: float = 12.0  # seconds of workload under faults
    faults: tuple[Fault, ...] = SAFE_WITH_ONE_REPLICA
    nodes: int = 3
    replication_factor: int = 1
    min_insync_replicas: int = 1
    partitions: int = 3  # of each workload topic
    producers: int = 2  # idempotent ones; one transactional producer besides
    members: int = 2  # of each group: classic, KIP-848, share
    rate: float = 30.0  # records per second of each idempotent producer
    drain_timeout: float = 30.0  # for producers to flush and members to leave, after the faults
    final_timeout: float = 30.0  # for the final read
    client_debug: bool = False  # each client's librdkafka debug log in <base>/clients/
    etcd_members: int = 1  # several: an etcd cluster, whose members the etcd faults hit one at a time


@dataclass
class RunResult:
    config: RunConfig
    history_path: Path
    violations: list[Violation]
    counts: dict[str, int]
    faults_done: int
    seconds: dict[str, float] = field(default_factory=dict)
    stuck: list[str] = field(default_factory=list)  # workers that did not finish in time
    worker_errors: list[str] = field(default_factory=list)
    # (producer, topic, partition) -> (sends without an acknowledgement or failure, when the first was sent)
    unanswered: dict[tuple[str, str, int], tuple[int, float]] = field(default_factory=dict)
    unhealthy: list[str] = field(default_factory=list)  # the cluster not back to every node live after the faults

    def report(self) -> str:
        lines = ["seed %d: %d faults, %s" % (self.config.seed, self.faults_done,
                                               ", ".join("%s %d" % kv for kv in self.counts.items())),
                 "phases: " + ", ".join("%s %.1f s" % kv for kv in self.seconds.items()),
                 "history: %s" % self.history_path]
        lines += ["cluster not recovered: %s" % s for s in self.unhealthy]
        lines += ["stuck worker: %s" % s for s in self.stuck]
        lines += ["no answer to %d sends of %s to %s-%d (the first %.1f s after the run began)" % (n, c, t, p, at)
                  for (c, t, p), (n, at) in sorted(self.unanswered.items())]
        lines += ["worker error: %s" % s for s in self.worker_errors]
        lines += [str(v) for v in self.violations[:20]]
        if len(self.violations) > 20:
            lines.append("... and %d more violations" % (len(self.violations) - 20))
        return "\n".join(lines)


def run(config: RunConfig, base: Path) -> RunResult:
    """The run; with a network fault among its faults, in a network of its own (the brokers and
    etcd each in a namespace, this thread and the clients it starts in a "clients" one), which is
    removed afterwards."""
    if not NETWORK_FAULTS & set(config.faults):
        return _run(config, base, None)
    members = [member_name(n) for n in range(1, config.nodes + 1)] + [ETCD_MEMBER, CLIENTS]
    with Network(members) as network, network.entered(CLIENTS):
        return _run(config, base, network)


def _run(config: RunConfig, base: Path, network: Network | None) -> RunResult:
    base.mkdir(parents=True, exist_ok=True)
    history = History(base / "history.jsonl")
    seconds: dict[str, float] = {}
    began = time.monotonic()
    overrides = {**OVERRIDES, "min.insync.replicas": str(config.min_insync_replicas)}
    cluster = start_cluster(base / "cluster", config.nodes, overrides, network, etcd_members=config.etcd_members)
    nemesis: Nemesis | None = None
    workers: list[Worker] = []
    stuck: list[str] = []
    unhealthy: list[str] = []
    try:
        create_topics(cluster, config)
        seconds["start"] = time.monotonic() - began
        steps = schedule(config.seed, config.duration, config.faults, sorted(cluster.nodes), config.partitions,
                         etcd_members=config.etcd_members)
        history.add(Kind.RUN, "runner", op="begin", detail={"config": _jsonable(asdict(config)),
                                                             "schedule": [asdict(s) for s in steps]})
        print("seed %d, schedule:\n%s" % (config.seed, describe(steps)))
        workers = make_workers(cluster, history, config)
        for worker in workers:
            worker.start()
        nemesis = Nemesis(cluster, history, steps, lambda p: _leader_of(cluster, p), TopicReassigner(cluster))
        t0 = time.monotonic()
        nemesis.start(t0)
        time.sleep(max(0.0, t0 + config.duration - time.monotonic()))  # the run's length, not a wait on a condition
        nemesis.stop()
        history.add(Kind.RUN, "runner", op="healed", detail=None)
        try:
            wait_live(cluster, timeout=30)
            wait_controller(cluster, timeout=30)
        except TimeoutError as e:  # the cluster did not recover: reported, and the run goes on to its verdict
            unhealthy.append(str(e))
            history.add(Kind.RUN, "runner", op="not live", detail=str(e))
        seconds["faults"] = time.monotonic() - t0
        t0 = time.monotonic()
        stuck = finish(workers, config.drain_timeout)
        seconds["drain"] = time.monotonic() - t0
        t0 = time.monotonic()
        final_read(cluster, history, config)
        seconds["final read"] = time.monotonic() - t0
    except BaseException:
        print(cluster.logs())
        raise
    finally:
        for worker in workers:
            worker.stop()
        if nemesis is not None:
            nemesis.stopping.set()
            nemesis.heal_all()
        cluster.stop()
    for event in replica_logs(cluster):
        history.append(event)
    history.add(Kind.RUN, "runner", op="end", detail=None)
    history.close()
    events = history.events()
    seconds["total"] = time.monotonic() - began
    return RunResult(config, history.path or base, check(events), summary(events),
                     nemesis.done if nemesis else 0, seconds, stuck, [e for w in workers for e in w.errors],
                     unanswered(events), unhealthy)


def unanswered(events: list[Any]) -> dict[tuple[str, str, int], tuple[int, float]]:
    """Sends that got neither an acknowledgement nor a failure by the end: a partition a producer
    could not write to (not a violation: the checker judges only what was acknowledged)."""
    answered = {e["value"] for e in events if e.kind in (Kind.ACK, Kind.SEND_FAIL)}
    began = next((e.t for e in events if e.kind is Kind.RUN), 0.0)
    found: dict[tuple[str, str, int], tuple[int, float]] = {}
    for e in events:
        if e.kind is Kind.SEND and e.get("txn") is None and e["value"] not in answered:
            key = (e.client, str(e["topic"]), int(e["partition"]))
            n, first = found.get(key, (0, e.t - began))
            found[key] = (n + 1, first)
    return found


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def create_topics(cluster: ProcessCluster, config: RunConfig) -> None:
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    topics = [NewTopic(t, config.partitions, config.replication_factor) for t in (IDEMPOTENT_TOPIC, TXN_TOPIC)]
    for future in admin.create_topics(topics, operation_timeout=20).values():
        future.result(30)
    for topic in (IDEMPOTENT_TOPIC, TXN_TOPIC):
        wait_leaders(cluster, topic, lambda ls: len(ls) == config.partitions and min(ls.values()) >= 0)


def wait_controller(cluster: ProcessCluster, timeout: float) -> None:
    """Until a metadata change goes through: CreateTopics of a new topic, sent to each node in turn
    (stale images can list every node live while no node is the active controller)."""
    name = "chaos-probe-%d" % time.monotonic_ns()
    ports = [p.port for p in cluster.nodes.values()]
    tries = iter(range(10**6))

    def created() -> bool:
        try:
            code, _ = create_topic(ports[next(tries) % len(ports)], name, 1, timeout=2)
        except OSError:
            return False
        return code in (0, 36)  # created, or TOPIC_ALREADY_EXISTS (an earlier try made it)

    wait_for(created, timeout, interval=0.2, what="an active controller (CreateTopics %s)" % name)


class TopicReassigner:
    """The nemesis' reassignments of the idempotent topic's partitions, sent to a running node
    (which forwards them to the controller)."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.cluster = cluster

    def _ports(self) -> list[int]:
        return [p.port for p in self.cluster.nodes.values() if p.proc is not None and p.proc.poll() is None]

    def replicas(self, partition: int) -> tuple[int, list[int]]:
        for port in self._ports():
            try:
                found = metadata(port, [IDEMPOTENT_TOPIC]).topics[0].partitions
            except (OSError, AssertionError):
                continue
            for p in found:
                if p.partition_index == partition:
                    return p.leader_id, list(p.replica_nodes)
        raise RuntimeError("no node answered the metadata of %s-%d" % (IDEMPOTENT_TOPIC, partition))

    def reassign(self, partition: int, replicas: list[int]) -> None:
        R = M.AlterPartitionReassignmentsRequest
        request = R(timeout_ms=10000, allow_replication_factor_change=True, topics=[R.ReassignableTopic(
            name=IDEMPOTENT_TOPIC, partitions=[R.ReassignablePartition(
                partition_index=partition, replicas=replicas)])])
        error = "no node running"
        for port in self._ports():
            try:
                response = call(port, ALTER_PARTITION_REASSIGNMENTS, 0, request, timeout=15)
            except (OSError, AssertionError) as e:
                error = str(e)
                continue
            answer = response.responses[0].partitions[0] if not response.error_code else response
            if not answer.error_code:
                return
            error = "error %d: %s" % (answer.error_code, answer.error_message)
        raise RuntimeError("reassigning %s-%d to %s failed: %s" % (IDEMPOTENT_TOPIC, partition, replicas, error))


def _leader_of(cluster: ProcessCluster, partition: int) -> int:
    for process in cluster.nodes.values():
        if process.proc is None or process.proc.poll() is not None:
            continue
        try:
            return leaders(process.port, IDEMPOTENT_TOPIC).get(partition, -1)
        except (OSError, AssertionError):
            continue
    return -1


def make_workers(cluster: ProcessCluster, history: History, config: RunConfig) -> list[Worker]:
    both = [IDEMPOTENT_TOPIC, TXN_TOPIC]
    seed, bootstrap = config.seed, cluster.bootstrap
    workers: list[Worker] = [IdempotentProducer("idem%d" % i, bootstrap, history, seed, IDEMPOTENT_TOPIC,
                                                config.partitions, rate=config.rate)
                             for i in range(config.producers)]
    workers.append(TransactionalProducer("txn0", bootstrap, history, seed, TXN_TOPIC, config.partitions))
    for i in range(config.members):
        workers.append(GroupMember("classic%d" % i, bootstrap, history, seed, "chaos-classic", "classic", both))
        workers.append(GroupMember("kip848-%d" % i, bootstrap, history, seed, "chaos-kip848", "consumer", both))
        workers.append(ShareMember("share%d" % i, bootstrap, history, seed, "chaos-share", both))
    set_share_offset_reset(cluster, "chaos-share")
    if config.client_debug:
        for worker in workers:
            worker.debug_dir = cluster.base.parent / "clients"
    return workers


def set_share_offset_reset(cluster: ProcessCluster, group: str) -> None:
    """share.auto.offset.reset=earliest, so the share group sees the run from its first record."""
    from kafka import KafkaAdminClient
    from kafka.admin import ConfigResource, ConfigResourceType

    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group,
                                            configs={"share.auto.offset.reset": "earliest"})], incremental=True)
    finally:
        admin.close()


def finish(workers: list[Worker], timeout: float) -> list[str]:
    """Stop every worker and wait for them together; the names of those still running after `timeout`."""
    for worker in workers:
        worker.stop()
    deadline = time.monotonic() + timeout
    return [w.name for w in workers if not w.join(max(0.0, deadline - time.monotonic()))]


def final_read(cluster: ProcessCluster, history: History, config: RunConfig) -> None:
    """Every partition of the workload's topics from its start to its end (the idempotent topic
    read_uncommitted to its high watermark, the transactional one read_committed to its last
    stable offset), as they are once every fault is healed and every producer finished."""
    for topic, isolation in ((IDEMPOTENT_TOPIC, "read_uncommitted"), (TXN_TOPIC, "read_committed")):
        _read_topic(cluster, history, topic, isolation, config)


def _read_topic(cluster: ProcessCluster, history: History, topic: str, isolation: str, config: RunConfig) -> None:
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": "chaos-final-reader",
                         "enable.auto.commit": False, "isolation.level": isolation, "enable.partition.eof": True,
                         "client.id": "final", "log_level": 2})
    try:
        ends: dict[int, int] = {}

        def known() -> bool:
            for p in range(config.partitions):
                if p not in ends:
                    try:
                        ends[p] = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=2)[1]
                    except Exception:
                        continue
            return len(ends) == config.partitions

        try:
            wait_for(known, config.final_timeout, interval=0.2, what="the ends of %s" % topic)
        except TimeoutError:  # a partition nobody answers for: its final read is incomplete, the run unjudged
            pass
        position = dict.fromkeys(ends, 0)
        deadline = time.monotonic() + config.final_timeout
        done = {p for p, end in ends.items() if end == 0}
        if ends:
            consumer.assign([TopicPartition(topic, p, 0) for p in ends])
        while len(done) < len(ends) and time.monotonic() < deadline:
            received: list[Any] = consumer.consume(500, 0.5)  # Message's getters are Optional in the stubs
            for msg in received:
                p = msg.partition()
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF and msg.offset() >= ends[p]:
                        position[p] = max(position[p], msg.offset())
                        done.add(p)
                    continue
                history.add(Kind.FINAL_READ, "final", topic=topic, partition=p, offset=msg.offset(),
                            value=msg.value().decode(), isolation=isolation)
                position[p] = msg.offset() + 1
                if position[p] >= ends[p]:
                    done.add(p)
        for p in range(config.partitions):
            history.add(Kind.FINAL_END, "final", topic=topic, partition=p, isolation=isolation,
                        position=position.get(p, 0), high_watermark=ends.get(p, "unknown"), complete=p in done)
    finally:
        consumer.close()


# the replicas' segment files ---------------------------------------------------------------------
BATCH_HEAD = struct.Struct(">qi")  # base offset, batch length (what follows it)
LAST_OFFSET_DELTA = 23  # position in a batch of v2 of its last offset delta (int32)


def segment_batches(path: Path) -> Iterator[tuple[int, int, str]]:
    """(base offset, last offset, digest of its bytes) of each whole batch of a .log file; a torn
    tail ends it."""
    data = path.read_bytes()
    at = 0
    while at + BATCH_HEAD.size <= len(data):
        base, length = BATCH_HEAD.unpack_from(data, at)
        size = BATCH_HEAD.size + length
        if length <= 0 or at + size > len(data):
            return
        batch = data[at:at + size]
        (delta,) = struct.unpack_from(">i", batch, LAST_OFFSET_DELTA)
        yield base, base + delta, hashlib.blake2b(batch, digest_size=8).hexdigest()
        at += size


def replica_logs(cluster: ProcessCluster) -> Iterator[Any]:
    """A replica_log event per partition directory of the workload's topics on each node."""
    from tests.chaos.history import event

    for node, process in sorted(cluster.nodes.items()):
        for directory in sorted(process.data_dir.glob("chaos-*-*")):
            topic, _, partition = directory.name.rpartition("-")
            if topic not in (IDEMPOTENT_TOPIC, TXN_TOPIC) or not partition.isdigit():
                continue
            batches = [b for log in sorted(directory.glob("*.log")) for b in segment_batches(log)]
            start = batches[0][0] if batches else 0
            end = batches[-1][1] + 1 if batches else 0
            yield event(Kind.REPLICA_LOG, "runner", node=node, topic=topic, partition=int(partition), start=start,
                        end=end, batches=[list(b) for b in batches])
