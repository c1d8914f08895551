"""Cluster mode on etcd (issue 22), measured: what three broker processes buy over one, and how
long a cluster is without a controller after kill -9 of the controller's process.

    python bench/cluster.py [--parts throughput,failover] [--rounds 3] [--producers 4] [--messages 20000]
                            [--size 100] [--partitions 6] [--batch-messages 1] [--leases 3000,1000] [--kills 2]
                            [--session-timeout-ms 3000] [--modes one,cluster_1,cluster_3] [--json PATH]

Throughput, in rounds alternating the order of the modes, each on fresh processes and data:

- `one`: one `python -m broker` process, no etcd (today's broker);
- `cluster_1`: an etcd member and one broker process with `etcd.endpoints`: the same process
  serving the same partitions in cluster mode, which isolates what cluster mode costs a request;
- `cluster_3`: an etcd member and three broker processes with `etcd.endpoints` (tests/cluster/harness.py's
  ProcessCluster, its settings: heartbeats every 0.5 s, 2 s lease), the topic's partitions led by
  all three nodes.

The same load on every mode: `--producers` confluent-kafka producer processes (idempotent, acks=all,
linger.ms=0, `--batch-messages` records per batch: many small Produce requests), each sending
`--messages` records of `--size` bytes round-robin over `--partitions` partitions after a
warm-up record per partition (connections, producer id, metadata), all starting together.
records/s runs from the first timed send to the last delivery report, over every producer; CPU
(user+system from /proc/<pid>/stat) is taken between the moment all producers are warm and the
last one exits: of the broker processes (per record; also less what they spend idle, measured
over `--idle-s` before the load), of etcd (separately), of the producers (as they report it)
and of everything else on the machine (from /proc/stat, as cores). records_per_request is the
producers' own count of Produce requests (librdkafka statistics).

Failover, per `--leases` value of `etcd.lease.timeout.ms`, `--rounds` fresh clusters of three
with `--kills` kills each (the controller then is whichever node won): records are produced to
a topic led by all nodes (acks=all), then the controller's process gets SIGKILL and, from the
signal on, threads poll etcd's controller key (gone, then held by another node), each survivor's
Metadata (its controller id; the killed node no longer listed: fenced) and CreateTopics through
one survivor (a new topic, retried every 20 ms until it succeeds). The killed node is then
started again: until it listens, until Metadata on a survivor lists it again (unfenced), until
it leads its partitions again, and until it answers ListOffsets for them with every acknowledged
record below the high watermark.

Prints a table of medians (min-max) and the brokers' warnings and errors; `--json PATH` writes
every round. Needs etcd (Debian's etcd-server, /usr/bin/etcd or ETCD_BIN). BENCH_QUICK=1 (as
`make bench` passes it in quick mode) runs one round, fewer records, one kill per lease.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import re
import select
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from broker.testing.etcd import EtcdMember, etcd_available  # noqa: E402
from protocol import messages as M  # noqa: E402
from tests.cluster.harness import ProcessCluster  # noqa: E402
from tests.harness import BrokerProcess, RawClient  # noqa: E402

METADATA, LIST_OFFSETS, CREATE_TOPICS = 3, 2, 19
TOPIC_ALREADY_EXISTS = 36
MODES = ("one", "cluster_1", "cluster_3")
CLK_TCK = os.sysconf("SC_CLK_TCK")

PRODUCER = r"""
import json, os, sys, time
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
partitions, count, size, per_batch, linger = map(int, sys.argv[3:8])
stats = [{}]
def on_stats(text):  # Produce requests sent so far, over every broker
    stats[0] = {"produce_requests": sum(b["req"].get("Produce", 0) for b in json.loads(text)["brokers"].values())}
p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": linger,
              "batch.num.messages": per_batch, "queue.buffering.max.messages": 1000000,
              "statistics.interval.ms": 100, "stats_cb": on_stats})
failed = []
def report(err, msg):
    if err is not None:
        failed.append(str(err))
value = b"x" * size
for i in range(partitions):  # warm-up: a connection to every leader, the producer id, the metadata
    p.produce(topic, value, partition=i, on_delivery=report)
warm_left = p.flush(60)
p.poll(0.25)
warm = stats[0].get("produce_requests", 0)
print("ready", flush=True)
sys.stdin.readline()  # everyone starts together
cpu0, start = sum(os.times()[:2]), time.monotonic()
for i in range(count):
    while True:
        try:
            p.produce(topic, value, partition=i % partitions, on_delivery=report)
            break
        except BufferError:
            p.poll(0.005)
left = p.flush(120)
end = time.monotonic()
cpu = sum(os.times()[:2]) - cpu0
p.poll(0.25)
print(json.dumps({"start": start, "end": end, "undelivered": left + warm_left, "failed": len(failed),
                  "first_error": failed[:1], "cpu_s": cpu,
                  "produce_requests": stats[0].get("produce_requests", 0) - warm}), flush=True)
"""


def log(msg: str) -> None:
    print("[cluster %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------ processes


def cpu_seconds(pid: int | None) -> float:
    if pid is None:
        return 0.0
    try:
        fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def machine_busy_seconds() -> float:
    """CPU seconds the whole machine spent outside idle and iowait (the first line of /proc/stat)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLK_TCK


def new_cluster_id() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class Brokers:
    """The broker processes of one mode (and etcd's, in a cluster), started fresh in `workdir`."""

    def __init__(self, mode: str, workdir: Path, overrides: dict[str, str] | None = None) -> None:
        self.mode = mode
        self.cluster_id = new_cluster_id()
        self.cluster: ProcessCluster | None = None
        self.etcd: EtcdMember | None = None
        props = {"cluster.id": self.cluster_id, **(overrides or {})}
        if mode == "one":
            (workdir / "one").mkdir(parents=True)
            self.nodes = {1: BrokerProcess(workdir / "one" / "data", overrides=props)}
        else:
            self.cluster = ProcessCluster(workdir, int(mode.rsplit("_", 1)[1]), props)
            self.nodes = self.cluster.nodes
            self.etcd = self.cluster.etcd

    def start(self) -> Brokers:
        if self.cluster is not None:
            self.cluster.start()
        else:
            self.nodes[1].start(timeout=40)
        wait_for(lambda: all(len(metadata(p).brokers) == len(self.nodes) for p in self.nodes.values()), 60,
                 "every node registered and unfenced")
        return self

    @property
    def bootstrap(self) -> str:
        return ",".join(p.bootstrap for p in self.nodes.values())

    def alive(self, node: int) -> bool:
        proc = self.nodes[node].proc
        return proc is not None and proc.poll() is None

    def pids(self) -> list[int]:
        return [p.proc.pid for n, p in self.nodes.items() if p.proc is not None and self.alive(n)]

    def sigkill(self, node: int) -> Marks:
        """kill -9 of `node`'s process; the marks count from the signal."""
        proc = self.nodes[node].proc
        assert proc is not None
        marks = Marks()
        os.kill(proc.pid, signal.SIGKILL)
        return marks

    def reap(self, node: int) -> None:
        """Wait for a killed node's process and close its log."""
        proc = self.nodes[node].proc
        assert proc is not None
        proc.wait(10)
        self.nodes[node].stop(timeout=0.05)

    def controller_key(self) -> bytes:
        return ("/kafka/%s/controller" % self.cluster_id).encode()

    def stop(self, timeout: float = 5.0) -> dict[str, Any]:
        """SIGTERM to every broker at once; those not gone within `timeout` get SIGKILL."""
        began = time.monotonic()
        running = [n for n in self.nodes if self.alive(n)]
        for n in running:
            self.nodes[n].proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        slow = []
        for n in running:
            proc = self.nodes[n].proc
            assert proc is not None
            try:
                proc.wait(max(0.05, began + timeout - time.monotonic()))
            except subprocess.TimeoutExpired:
                slow.append(n)
            self.nodes[n].stop(timeout=0.05)  # closes its log; kills it if it is still there
        if self.etcd is not None:
            self.etcd.stop()
        return {"stop_s": round(time.monotonic() - began, 2), "killed_after_sigterm": slow}

    def problems(self) -> list[str]:
        """The brokers' warnings, errors and tracebacks, each message once with its count."""
        seen: Counter[str] = Counter()
        for n, p in self.nodes.items():
            for line in p.output().splitlines():
                m = re.match(r"\S+ \[(warning|error|critical)\s*\] (.*)", line)
                if m is not None:
                    seen["node %d %s: %s" % (n, m.group(1), m.group(2)[:160].rstrip())] += 1
                elif line.startswith("Traceback") or "Error:" in line and not line.startswith("20"):
                    seen["node %d: %s" % (n, line[:160])] += 1
        return ["%s (x%d)" % (k, c) if c > 1 else k for k, c in seen.items()]


def wait_for(predicate: Callable[[], Any], timeout: float, what: str, interval: float = 0.02) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            value = predicate()
        except (OSError, ConnectionError):
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError("%s: not within %.0f s" % (what, timeout))
        time.sleep(interval)


# ------------------------------------------------------------------------------------ raw calls


def metadata(node: BrokerProcess, topics: list[str] | None = None, client: RawClient | None = None) -> Any:
    c = client or RawClient(node.port, "bench-cluster")
    try:
        request = M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(name=t) for t in topics or []],
                                    allow_auto_topic_creation=False)
        return c.call(METADATA, 12, request)
    finally:
        if client is None:
            c.close()


def create_topic(client: RawClient, name: str, partitions: int, timeout_ms: int = 10000, factor: int = 1,
                 configs: dict[str, str] | None = None) -> int:
    """CreateTopics through `client`'s node; the topic's error code."""
    R = M.CreateTopicsRequest
    request = R(topics=[R.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=factor,
        configs=[R.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()])],
        timeout_ms=timeout_ms, validate_only=False)
    return int(client.call(CREATE_TOPICS, 7, request).topics[0].error_code)


def leaders(node: BrokerProcess, topic: str) -> dict[int, int]:
    """partition -> leader as `node` sees it (empty while the topic is unknown there)."""
    response = metadata(node, [topic])
    found = [t for t in response.topics if t.name == topic and t.error_code == 0]
    return {p.partition_index: p.leader_id for p in found[0].partitions} if found else {}


def make_topic(brokers: Brokers, name: str, partitions: int, factor: int = 1,
               configs: dict[str, str] | None = None) -> dict[int, int]:
    """Create `name` through the first node; once every node knows every partition's leader, the leaders."""
    first = next(iter(brokers.nodes.values()))
    c = RawClient(first.port, "bench-cluster")
    try:
        code = create_topic(c, name, partitions, factor=factor, configs=configs)
    finally:
        c.close()
    if code != 0:
        raise RuntimeError("CreateTopics %s: error %d" % (name, code))

    def agreed() -> dict[int, int] | None:
        seen = [leaders(p, name) for p in brokers.nodes.values()]
        full = all(len(s) == partitions and min(s.values()) >= 0 for s in seen)
        return seen[0] if full and all(s == seen[0] for s in seen) else None

    return dict(wait_for(agreed, 30, "topic %s led everywhere" % name))


def high_watermarks(node: BrokerProcess, topic: str, partitions: list[int]) -> dict[int, int] | None:
    """ListOffsets (latest) of `partitions` answered by `node`; None unless every one is answered."""
    R = M.ListOffsetsRequest
    request = R(replica_id=-1, isolation_level=0, topics=[R.ListOffsetsTopic(
        name=topic, partitions=[R.ListOffsetsPartition(partition_index=p, current_leader_epoch=-1, timestamp=-1)
                                for p in partitions])])
    c = RawClient(node.port, "bench-cluster")
    try:
        answer = c.call(LIST_OFFSETS, 7, request)
    finally:
        c.close()
    found = {p.partition_index: p.offset for t in answer.topics for p in t.partitions if p.error_code == 0}
    return found if len(found) == len(partitions) else None


# ------------------------------------------------------------------------------------ throughput


def throughput_round(mode: str, a: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-"))
    brokers = Brokers(mode, workdir)
    out: dict[str, Any] = {"mode": mode}
    try:
        brokers.start()
        placement = make_topic(brokers, "load", a.partitions)
        out["partitions_per_leader"] = dict(sorted(Counter(placement.values()).items()))
        out.update(produce_load(brokers, "load", a))
    finally:
        out["problems"] = brokers.problems()
        out.update(brokers.stop())
        shutil.rmtree(workdir, ignore_errors=True)
    return out


def produce_load(brokers: Brokers, topic: str, a: argparse.Namespace, linger_ms: int = 0) -> dict[str, Any]:
    """`a.producers` producer processes, warm, then `a.messages` records each to `topic` (acks=all) all at
    once: records/s and the CPU of the brokers, etcd, the producers and the rest of the machine."""
    out: dict[str, Any] = {}
    producers: list[subprocess.Popen[str]] = []
    try:
        argv = [sys.executable, "-c", PRODUCER, brokers.bootstrap, topic, str(a.partitions), str(a.messages),
                str(a.size), str(a.batch_messages), str(linger_ms)]
        producers = [subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
                     for _ in range(a.producers)]
        for p in producers:  # every producer warm
            assert p.stdout is not None
            ready, _, _ = select.select([p.stdout], [], [], 60)
            if not ready or p.stdout.readline().strip() != "ready":
                raise RuntimeError("a producer did not warm up")
        broker_pids, etcd_pid = brokers.pids(), brokers.etcd.pid if brokers.etcd else None
        idle0 = sum(cpu_seconds(pid) for pid in broker_pids), cpu_seconds(etcd_pid), time.monotonic()
        time.sleep(a.idle_s)  # what the processes cost without load: heartbeats, leases, watches, timers
        idle1 = sum(cpu_seconds(pid) for pid in broker_pids), cpu_seconds(etcd_pid), time.monotonic()
        idle_cores = (idle1[0] - idle0[0]) / (idle1[2] - idle0[2]), (idle1[1] - idle0[1]) / (idle1[2] - idle0[2])
        cpu0 = sum(cpu_seconds(pid) for pid in broker_pids), cpu_seconds(etcd_pid), machine_busy_seconds()
        t0 = time.monotonic()
        for p in producers:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()  # communicate() closes it
        reports = [json.loads(p.communicate(timeout=a.round_timeout)[0].splitlines()[-1]) for p in producers]
        cpu1 = sum(cpu_seconds(pid) for pid in broker_pids), cpu_seconds(etcd_pid), machine_busy_seconds()
        window = time.monotonic() - t0
        records = a.producers * a.messages
        elapsed = max(r["end"] for r in reports) - min(r["start"] for r in reports)
        producers_cpu = sum(r["cpu_s"] for r in reports)
        broker_cpu, etcd_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1]
        requests = sum(r["produce_requests"] for r in reports)
        out.update({
            "records_per_s": round(records / elapsed), "elapsed_s": round(elapsed, 2),
            "records_per_request": round(records / requests, 2) if requests else None,
            "broker_cpu_us_per_record": round(broker_cpu / records * 1e6, 1),
            "etcd_cpu_us_per_record": round(etcd_cpu / records * 1e6, 2),
            "producers_cpu_us_per_record": round(producers_cpu / records * 1e6, 1),
            "broker_cpu_us_per_record_less_idle": round((broker_cpu - idle_cores[0] * window) / records * 1e6, 1),
            "broker_cores": round(broker_cpu / window, 2), "etcd_cores": round(etcd_cpu / window, 3),
            "broker_idle_cores": round(idle_cores[0], 3), "etcd_idle_cores": round(idle_cores[1], 3),
            "producer_cores": round(producers_cpu / window, 2),
            "other_cores": round(max(0.0, cpu1[2] - cpu0[2] - broker_cpu - etcd_cpu - producers_cpu) / window, 2),
            "undelivered": sum(r["undelivered"] for r in reports), "failed": sum(r["failed"] for r in reports),
            "first_error": next((r["first_error"] for r in reports if r["first_error"]), None),
        })
    finally:
        for p in producers:
            reap(p)
    return out


# ------------------------------------------------------------------------------------ failover


class Conn:
    """A RawClient to one node, opened again after a failed call (its answers may be out of step)."""

    def __init__(self, node: BrokerProcess) -> None:
        self.node = node
        self.client: RawClient | None = None

    def call(self, fn: Callable[[RawClient], Any]) -> Any:
        if self.client is None:
            self.client = RawClient(self.node.port, "bench-failover")
            self.client.sock.settimeout(5)
        try:
            return fn(self.client)
        except (OSError, ConnectionError, AssertionError):
            self.close()
            raise ConnectionError("call failed") from None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


class Marks:
    """Seconds from a start to the first time each named event was seen (thread-safe)."""

    def __init__(self) -> None:
        self.t0 = time.monotonic()
        self.seen: dict[str, float] = {}
        self.lock = threading.Lock()

    def mark(self, name: str) -> None:
        with self.lock:
            self.seen.setdefault(name, round(time.monotonic() - self.t0, 3))

    def has(self, *names: str) -> bool:
        with self.lock:
            return all(n in self.seen for n in names)


def etcd_get(url: str, key: bytes) -> dict[str, Any] | None:
    """The JSON value of `key` (via etcd's v3 JSON gateway), None when absent."""
    body = json.dumps({"key": base64.b64encode(key).decode()}).encode()
    request = urllib.request.Request(url + "/v3/kv/range", body, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=2) as r:
        kvs = json.loads(r.read()).get("kvs") or []
    return json.loads(base64.b64decode(kvs[0]["value"])) if kvs else None


def poll_until(deadline: float, done: Callable[[], bool], step: Callable[[], None], interval: float = 0.01) -> None:
    while not done() and time.monotonic() < deadline:
        try:
            step()
        except (OSError, ConnectionError, ValueError):
            pass
        time.sleep(interval)


def kill_controller(brokers: Brokers, a: argparse.Namespace) -> dict[str, Any]:
    """kill -9 of the controller; when the others see a new one, when CreateTopics works again,
    when the killed node is fenced."""
    assert brokers.etcd is not None
    url, key = brokers.etcd.client_url, brokers.controller_key()
    holder = etcd_get(url, key)
    assert holder is not None
    victim, epoch = int(holder["node_id"]), int(holder["epoch"])
    survivors = [n for n in brokers.nodes if n != victim]
    out: dict[str, Any] = {"killed": victim, "epoch": epoch}
    create_errors: Counter[int] = Counter()
    new_controllers: set[int] = set()
    clients = {n: Conn(brokers.nodes[n]) for n in survivors}
    admin = Conn(brokers.nodes[survivors[0]])
    marks = brokers.sigkill(victim)
    deadline = marks.t0 + a.failover_timeout

    def etcd_step() -> None:
        now = etcd_get(url, key)
        if now is None:
            marks.mark("etcd_key_gone")
        elif int(now["node_id"]) != victim:
            marks.mark("etcd_key_gone")  # deleted, then taken between two polls
            marks.mark("etcd_new_controller")
            new_controllers.add(int(now["node_id"]))

    def metadata_step(node: int) -> Callable[[], None]:
        def step() -> None:
            response = clients[node].call(lambda c: metadata(brokers.nodes[node], client=c))
            if response.controller_id not in (-1, victim):
                marks.mark("metadata_controller_%d" % node)
            if victim not in {b.node_id for b in response.brokers}:
                marks.mark("fenced_%d" % node)
        return step

    topic = "after-kill-%s" % uuid.uuid4().hex[:8]

    def create_step() -> None:
        code = admin.call(lambda c: create_topic(c, topic, 1, timeout_ms=5000))
        if code in (0, TOPIC_ALREADY_EXISTS):  # exists: an earlier try was applied but answered late
            marks.mark("create_topics")
        else:
            create_errors[code] += 1
            time.sleep(0.01)

    threads = [threading.Thread(target=poll_until, args=(
        deadline, lambda: marks.has("etcd_new_controller"), etcd_step))]
    threads += [threading.Thread(target=poll_until, args=(
        deadline, lambda n=n: marks.has("metadata_controller_%d" % n, "fenced_%d" % n), metadata_step(n)))
        for n in survivors]
    threads.append(threading.Thread(target=poll_until, args=(deadline, lambda: marks.has("create_topics"), create_step)))
    for t in threads:
        t.start()
    brokers.reap(victim)
    for t in threads:
        t.join()
    for c in [*clients.values(), admin]:
        c.close()
    seen = marks.seen
    new_seen = [seen[k] for k in seen if k.startswith("metadata_controller_")]
    fenced_seen = [seen[k] for k in seen if k.startswith("fenced_")]
    out.update({
        "etcd_key_gone_s": seen.get("etcd_key_gone"), "etcd_new_controller_s": seen.get("etcd_new_controller"),
        "metadata_first_survivor_s": min(new_seen, default=None),
        "metadata_all_survivors_s": max(new_seen) if len(new_seen) == len(survivors) else None,
        "create_topics_s": seen.get("create_topics"),
        "fenced_all_survivors_s": max(fenced_seen) if len(fenced_seen) == len(survivors) else None,
        "new_controller": sorted(new_controllers), "create_topics_errors": dict(create_errors),
    })
    return out


def restart_node(brokers: Brokers, node: int, topic: str, placement: dict[int, int], acked: dict[int, int],
                 a: argparse.Namespace) -> dict[str, Any]:
    """Start `node` again: until it listens, is listed again, leads its partitions again and
    answers ListOffsets for them with every acknowledged record below the high watermark."""
    survivor = brokers.nodes[next(n for n in brokers.nodes if n != node)]
    mine = sorted(p for p, leader in placement.items() if leader == node)
    began = time.monotonic()
    brokers.nodes[node].start(timeout=40)
    out: dict[str, Any] = {"restart_listening_s": round(time.monotonic() - began, 3)}
    deadline = began + a.failover_timeout + 30

    def step() -> None:
        response = metadata(survivor, [topic])
        if node in {b.node_id for b in response.brokers}:
            out.setdefault("restart_unfenced_s", round(time.monotonic() - began, 3))
        led = {p.partition_index: p.leader_id for t in response.topics if t.name == topic for p in t.partitions}
        if mine and all(led.get(p) == node for p in mine):
            out.setdefault("restart_leading_s", round(time.monotonic() - began, 3))
        if "restart_serving_s" not in out:
            hw = high_watermarks(brokers.nodes[node], topic, mine)
            if hw is not None:
                out["restart_serving_s"] = round(time.monotonic() - began, 3)
                out["acked_records_kept"] = all(hw[p] >= acked.get(p, 0) for p in mine)

    poll_until(deadline, lambda: all(k in out for k in ("restart_unfenced_s", "restart_leading_s",
                                                       "restart_serving_s")), step, 0.02)
    return out


def produce_acked(bootstrap: str, topic: str, partitions: int, per_partition: int, acked: dict[int, int]) -> None:
    """`per_partition` records to each partition, acks=all; counts what was acknowledged."""
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5})

    def report(err: Any, msg: Any) -> None:
        if err is None:
            acked[msg.partition()] = acked.get(msg.partition(), 0) + 1

    for i in range(per_partition * partitions):
        p.produce(topic, b"r%d" % i, partition=i % partitions, on_delivery=report)
    if p.flush(60):
        raise RuntimeError("records not delivered to %s" % topic)


def failover_round(lease_ms: int, a: argparse.Namespace) -> list[dict[str, Any]]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-cluster-failover-"))
    brokers = Brokers("cluster_3", workdir, {
        "etcd.lease.timeout.ms": str(lease_ms), "broker.session.timeout.ms": str(a.session_timeout_ms),
        "broker.heartbeat.interval.ms": str(a.heartbeat_interval_ms)})
    kills: list[dict[str, Any]] = []
    try:
        brokers.start()
        placement = make_topic(brokers, "kept", a.partitions)
        acked: dict[int, int] = {}
        for k in range(a.kills):
            produce_acked(brokers.bootstrap, "kept", a.partitions, 100, acked)
            wait_for(lambda: controller_agreed(brokers), 30, "every node and etcd agree on the controller")
            result = {"lease_ms": lease_ms, **kill_controller(brokers, a)}
            result["fenced_before_restart"] = result["fenced_all_survivors_s"] is not None
            result.update(restart_node(brokers, result["killed"], "kept", placement, acked, a))
            kills.append(result)
            log("lease %d ms, kill %d: %s" % (lease_ms, k + 1, brief(result)))
            wait_for(lambda: all(len(metadata(p).brokers) == len(brokers.nodes) for p in brokers.nodes.values()),
                     30, "every node back")
    finally:
        problems = brokers.problems()
        stopped = brokers.stop()
        if kills:
            kills[-1].update({"problems": problems, **stopped})
        shutil.rmtree(workdir, ignore_errors=True)
    return kills


def controller_agreed(brokers: Brokers) -> bool:
    assert brokers.etcd is not None
    holder = etcd_get(brokers.etcd.client_url, brokers.controller_key())
    if holder is None:
        return False
    return all(metadata(p).controller_id == holder["node_id"] for p in brokers.nodes.values())


# ------------------------------------------------------------------------------------ report

FAILOVER_KEYS = ("etcd_key_gone_s", "etcd_new_controller_s", "metadata_first_survivor_s", "metadata_all_survivors_s",
                 "create_topics_s", "fenced_all_survivors_s", "restart_listening_s", "restart_unfenced_s",
                 "restart_leading_s", "restart_serving_s")
EXPECTED_AFTER_KILL = "brokers fenced: no heartbeat within the session timeout"  # the killed node
THROUGHPUT_KEYS = ("records_per_s", "records_per_request", "broker_cpu_us_per_record",
                   "broker_cpu_us_per_record_less_idle", "etcd_cpu_us_per_record", "producers_cpu_us_per_record",
                   "broker_cores", "etcd_cores", "producer_cores", "other_cores", "broker_idle_cores", "etcd_idle_cores")


def brief(result: dict[str, Any]) -> str:
    return " ".join("%s=%s" % (k, v) for k, v in result.items() if k not in ("problems",) and v not in (None, [], {}))


def spread(values: Sequence[float | None]) -> str:
    found = [v for v in values if v is not None]
    if not found:
        return "-"
    missing = len(values) - len(found)
    text = "%s (%s-%s)" % (fmt(statistics.median(found)), fmt(min(found)), fmt(max(found)))
    return text + (" [%d missing]" % missing if missing else "")


def fmt(v: float) -> str:
    return "%.0f" % v if abs(v) >= 100 else "%.3g" % v


def summary(report: dict[str, Any]) -> str:
    lines = []
    runs = report.get("throughput") or {}
    if runs:
        lines.append("throughput, medians (min-max) of %d rounds; %d producers x %d records of %d B, %d partitions"
                     % (report["args"]["rounds"], report["args"]["producers"], report["args"]["messages"],
                        report["args"]["size"], report["args"]["partitions"]))
        lines.append("%-36s %s" % ("", "".join("%-28s" % m for m in runs)))
        for key in THROUGHPUT_KEYS:
            lines.append("%-36s %s" % (key, "".join("%-28s" % spread([r.get(key) for r in rs]) for rs in runs.values())))
    fails = report.get("failover") or {}
    if fails:
        lines.append("")
        lines.append("failover after kill -9 of the controller, seconds, medians (min-max); broker.session.timeout.ms %d"
                     % report["args"]["session_timeout_ms"])
        lines.append("%-36s %s" % ("", "".join("%-28s" % ("lease %s ms" % lease) for lease in fails)))
        for key in FAILOVER_KEYS:
            lines.append("%-36s %s" % (key, "".join("%-28s" % spread([r.get(key) for r in rs]) for rs in fails.values())))
    for note in report.get("notes", []):
        lines.append("note: " + note)
    return "\n".join(lines)


def notes(report: dict[str, Any]) -> list[str]:
    out = []
    for mode, rs in (report.get("throughput") or {}).items():
        for r in rs:
            for k in ("undelivered", "failed", "error"):
                if r.get(k):
                    out.append("%s: %s %s %s" % (mode, k, r[k], r.get("first_error") or ""))
            if r.get("killed_after_sigterm"):
                out.append("%s: nodes %s still running 5 s after SIGTERM (killed)" % (mode, r["killed_after_sigterm"]))
            out += ["%s: %s" % (mode, p) for p in r.get("problems") or []]
    for lease, rs in (report.get("failover") or {}).items():
        for r in rs:
            if r.get("acked_records_kept") is False:
                out.append("lease %s: node %s lost acknowledged records" % (lease, r["killed"]))
            if r.get("error"):
                out.append("lease %s: %s" % (lease, r["error"]))
            if r.get("killed_after_sigterm"):
                out.append("lease %s: nodes %s still running 5 s after SIGTERM (killed)" % (lease, r["killed_after_sigterm"]))
            out += ["lease %s: %s" % (lease, p) for p in r.get("problems") or [] if EXPECTED_AFTER_KILL not in p]
    return list(dict.fromkeys(re.sub(r"\(x\d+\)$", "", n).strip() for n in out))


def start_report(ap: argparse.ArgumentParser, argv: Sequence[str] | None,
                 script: str) -> tuple[argparse.Namespace, dict[str, Any] | None]:
    """The arguments (and `--json`) and the report's head; no report (once said) without etcd."""
    ap.add_argument("--json", help="write every round as JSON here")
    a = ap.parse_args(argv)
    if not etcd_available():
        print("%s: skipped, no etcd (install etcd-server or set ETCD_BIN)" % script)
        return a, None
    return a, {"args": vars(a), "cores": os.cpu_count(), "loadavg_start": os.getloadavg(),
               "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def reap(proc: subprocess.Popen[str]) -> None:
    """Kill a child of ours (by its PID) that is still running."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)


def finish(report: dict[str, Any], began: float, json_path: str | None,
           summary: Callable[[dict[str, Any]], str], notes: Callable[[dict[str, Any]], list[str]]) -> int:
    """The run's end: its notes, the JSON (when asked for) and the printed summary."""
    report["loadavg_end"] = os.getloadavg()
    report["total_s"] = round(time.monotonic() - began, 1)
    report["notes"] = notes(report)
    if json_path:
        Path(json_path).write_text(json.dumps(report, indent=1) + "\n")
    print(summary(report))
    print("(%.0f s in all)" % report["total_s"])
    return 0


def load_arguments(ap: argparse.ArgumentParser, quick: bool, messages: int, partitions: int, idle_s: float) -> None:
    """The options of the rounds and of produce_load (but batch_messages)."""
    ap.add_argument("--rounds", type=int, default=1 if quick else 3)
    ap.add_argument("--producers", type=int, default=4)
    ap.add_argument("--messages", type=int, default=messages, help="records per producer")
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--partitions", type=int, default=partitions)
    ap.add_argument("--idle-s", type=float, default=idle_s, help="idle window before the load (CPU without load)")
    ap.add_argument("--round-timeout", type=float, default=180.0)


def main(argv: Sequence[str] | None = None) -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="throughput,failover")
    ap.add_argument("--modes", default=",".join(MODES))
    load_arguments(ap, quick, messages=5000 if quick else 20000, partitions=6, idle_s=2.0)
    ap.add_argument("--batch-messages", type=int, default=1, help="librdkafka batch.num.messages")
    ap.add_argument("--leases", default="3000,1000", help="etcd.lease.timeout.ms values of the failover part")
    ap.add_argument("--kills", type=int, default=1 if quick else 2, help="controller kills per cluster")
    ap.add_argument("--session-timeout-ms", type=int, default=3000, help="broker.session.timeout.ms (failover part)")
    ap.add_argument("--heartbeat-interval-ms", type=int, default=500, help="broker.heartbeat.interval.ms (failover)")
    ap.add_argument("--failover-timeout", type=float, default=30.0)
    a, report = start_report(ap, argv, "bench/cluster.py")
    if report is None:
        return 0
    parts = a.parts.split(",")
    began = time.monotonic()
    modes = a.modes.split(",")
    leases = [int(v) for v in a.leases.split(",")]
    if "throughput" in parts:
        runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
        for r in range(a.rounds):
            for mode in modes if r % 2 == 0 else list(reversed(modes)):  # alternate the order
                try:
                    runs[mode].append(throughput_round(mode, a))
                except Exception as exc:  # a failed round is reported, the others still run
                    runs[mode].append({"mode": mode, "error": repr(exc)})
                log("%s round %d: %s" % (mode, r + 1, brief(runs[mode][-1])))
        report["throughput"] = runs
    if "failover" in parts:
        fails: dict[int, list[dict[str, Any]]] = {lease: [] for lease in leases}
        for r in range(a.rounds):
            for lease in leases if r % 2 == 0 else list(reversed(leases)):
                try:
                    fails[lease] += failover_round(lease, a)
                except Exception as exc:
                    fails[lease].append({"lease_ms": lease, "error": repr(exc)})
                    log("lease %d ms: %r" % (lease, exc))
        report["failover"] = fails
    return finish(report, began, a.json, summary, notes)


if __name__ == "__main__":
    sys.exit(main())
