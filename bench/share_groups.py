"""Share groups (KIP-932) side by side: librdkafka's mock cluster, our broker's share group, and
our broker's classic consumer group on the same data (issue 10's bars).

For each record size (100 B and 1 KB): a 2-partition topic holding N records (50,000 of 100 B,
8,333 of 1 KB: the mock keeps only about 5 MB per partition and drops what is older); 4 consumers in
threads of this process read them all, share consumers with implicit acknowledgement
(confluent-kafka's ShareConsumer, librdkafka 2.16), classic ones with group.protocol=classic
(only 2 of the 4 get a partition). Reported: records/s from the first record received to the last, the
whole time from subscribe, and the broker process's CPU seconds per record (utime+stime from
/proc). Then the redelivery delay after a lock expiry (on a topic of one partition; the mock's of
two): member A takes records and stops (keeping its session), member B gets them once the lock
runs out; delay = B's receipt - A's receipt - the lock duration.

The mock's share groups read from the latest offset by default, and the shared mock_cluster.py has
no switch for it: this script starts the mock itself (ctypes, the librdkafka bundled with
confluent-kafka) with share auto.offset.reset=earliest and the same lock duration.

    flock /work/notes/bench.lock python bench/share_groups.py [--records 50000] [--repeat 3] [--repo DIR]

With 50,000 records the rate from first to last record spans a few tens of milliseconds on our
broker and swings between runs; `--targets ours_share,ours_classic --records 500000` (our broker
only: the mock would drop most of it) measures the share/classic ratio at a steady state.

Prints one JSON object (also written to bench/results/share_groups.json).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402
from confluent_kafka import Consumer, Producer, ShareConsumer  # noqa: E402
from kafka import KafkaAdminClient  # noqa: E402
from kafka.admin import ConfigResource, ConfigResourceType, NewTopic  # noqa: E402

LOCK_MS = 2000
CONSUMERS = 4
PARTITIONS = 2
CLK_TCK = os.sysconf("SC_CLK_TCK")
TARGETS = ("mock", "ours_share", "ours_classic")

MOCK_SCRIPT = r'''
import ctypes, glob, os, signal, sys, threading, importlib.util
spec = importlib.util.find_spec("confluent_kafka")
site = os.path.dirname(os.path.dirname(spec.origin))
lib = ctypes.CDLL(glob.glob(os.path.join(site, "confluent_kafka.libs", "librdkafka*.so*"))[0])
lib.rd_kafka_conf_new.restype = ctypes.c_void_p
lib.rd_kafka_new.restype = ctypes.c_void_p
lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
lib.rd_kafka_mock_topic_create.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int, ctypes.c_int]
lib.rd_kafka_mock_sharegroup_set_auto_offset_reset.argtypes = [ctypes.c_void_p, ctypes.c_int]
lib.rd_kafka_mock_sharegroup_set_record_lock_duration.argtypes = [ctypes.c_void_p, ctypes.c_int]
errstr = ctypes.create_string_buffer(512)
rk = lib.rd_kafka_new(0, lib.rd_kafka_conf_new(), errstr, 512)
mc = lib.rd_kafka_mock_cluster_new(rk, 1)
lib.rd_kafka_mock_sharegroup_set_auto_offset_reset(mc, 1)
lib.rd_kafka_mock_sharegroup_set_record_lock_duration(mc, int(sys.argv[1]))
for name in sys.argv[2:]:
    lib.rd_kafka_mock_topic_create(mc, name.encode(), 2, 1)
print("BOOTSTRAP=" + lib.rd_kafka_mock_cluster_bootstraps(mc).decode(), flush=True)
stop = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: stop.set())
stop.wait(1800)
'''


def cpu_seconds(pid: int) -> float:
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


class Target:
    def __init__(self, name: str, bootstrap: str, pid: int, stop: Any, group_configs: bool) -> None:
        self.name, self.bootstrap, self.pid, self.stop, self.group_configs = name, bootstrap, pid, stop, group_configs


def start_mock(topics: list[str]) -> Target:
    proc = subprocess.Popen([sys.executable, "-c", MOCK_SCRIPT, str(LOCK_MS), *topics], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, preexec_fn=peers._die_with_parent)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode().strip()
    assert line.startswith("BOOTSTRAP="), line

    def stop() -> None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()

    return Target("mock", line.split("=", 1)[1], proc.pid, stop, group_configs=False)


def start_ours(repo: Path = ROOT) -> Target:
    peer = peers.start_ours({"group.share.min.record.lock.duration.ms": "1000",
                             "group.share.heartbeat.interval.ms": "1000",
                             "group.share.min.heartbeat.interval.ms": "1000",
                             "group.initial.rebalance.delay.ms": "0"}, repo=repo)
    return Target("ours", peer.bootstrap, peer.pid, peer.stop, group_configs=True)


def prepare(target: Target, topic: str, group: str, n: int, size: int, share: bool,
            partitions: int = PARTITIONS) -> None:
    if target.group_configs:
        admin = KafkaAdminClient(bootstrap_servers=target.bootstrap)
        try:
            admin.create_topics([NewTopic(topic, partitions, 1)])
            if share:
                admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group, configs={
                    "share.auto.offset.reset": "earliest", "share.record.lock.duration.ms": str(LOCK_MS)})],
                    incremental=True)
        finally:
            admin.close()
    p = Producer({"bootstrap.servers": target.bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1_000_000})
    value = b"x" * size
    for i in range(n):
        while True:
            try:
                p.produce(topic, value=value, partition=i % partitions)
                break
            except BufferError:
                p.poll(0.05)
    assert p.flush(60) == 0


def consume(target: Target, topic: str, group: str, n: int, share: bool, limit: float = 60.0) -> dict[str, Any]:
    seen = [0] * CONSUMERS
    first: list[float] = []
    last = [0.0]
    done = threading.Event()
    if share:
        members: list[Any] = [ShareConsumer({"bootstrap.servers": target.bootstrap, "group.id": group})
                              for _ in range(CONSUMERS)]
    else:
        members = [Consumer({"bootstrap.servers": target.bootstrap, "group.id": group, "group.protocol": "classic",
                             "auto.offset.reset": "earliest", "enable.auto.commit": True})
                   for _ in range(CONSUMERS)]

    def run(i: int) -> None:
        c = members[i]
        while not done.is_set():
            if share:
                got = [m for m in c.poll(0.1) if m.error() is None]
            else:
                got = [m for m in c.consume(500, 0.1) if m.error() is None]
            if got:
                now = time.perf_counter()
                if not first:
                    first.append(now)
                last[0] = max(last[0], now)
                seen[i] += len(got)
        # closed on the thread that polled it: a close from another thread has hung for minutes
        try:
            c.close()
        except Exception:
            pass

    cpu0 = cpu_seconds(target.pid)
    t0 = time.perf_counter()
    for c in members:
        c.subscribe([topic])
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(CONSUMERS)]
    for t in threads:
        t.start()
    deadline = t0 + limit
    while sum(seen) < n and time.perf_counter() < deadline:
        time.sleep(0.01)
    t_end = time.perf_counter()
    cpu = cpu_seconds(target.pid) - cpu0
    done.set()
    for t in threads:
        t.join(30)
    hung = sum(t.is_alive() for t in threads)
    if hung:
        print("%d consumer(s) still closing after 30 s, left behind" % hung, file=sys.stderr, flush=True)
    total = sum(seen)
    span = last[0] - first[0] if first and last[0] > first[0] else None
    return {"records": total, "complete": total >= n, "per_member": seen,
            "records_per_s": round(total / span) if span else None,
            "from_subscribe_s": round(t_end - t0, 3),
            "records_per_s_from_subscribe": round(total / (t_end - t0)),
            "broker_cpu_us_per_record": round(cpu / max(total, 1) * 1e6, 2)}


def redelivery_delay(target: Target, topic: str, group: str) -> float | None:
    """Member A takes records and stops; B gets them after the lock: B's time - A's - lock (ms)."""
    a = ShareConsumer({"bootstrap.servers": target.bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
    b = ShareConsumer({"bootstrap.servers": target.bootstrap, "group.id": group,
                       "share.acknowledgement.mode": "explicit"})
    try:
        a.subscribe([topic])
        taken: set[tuple[int, int]] = set()
        t_a = None
        deadline = time.monotonic() + 30
        while not taken and time.monotonic() < deadline:
            got = [m for m in a.poll(0.2) if m.error() is None]
            if got:
                t_a = time.perf_counter()
                taken = {(int(m.partition() or 0), int(m.offset() or 0)) for m in got}
        if t_a is None:
            return None
        b.subscribe([topic])
        deadline = time.monotonic() + 30 + LOCK_MS / 1000
        while time.monotonic() < deadline:
            for m in b.poll(0.05):
                if m.error() is None:
                    b.acknowledge(m)
                    if (int(m.partition() or 0), int(m.offset() or 0)) in taken:
                        return round((time.perf_counter() - t_a) * 1000 - LOCK_MS, 1)
        return None
    finally:
        for c in (a, b):
            try:
                c.close()
            except Exception:
                pass


def median(values: list[Any]) -> Any:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 2) if values else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--sizes", default="100,1024")
    ap.add_argument("--targets", default=",".join(TARGETS), help="a subset of %s" % ",".join(TARGETS))
    ap.add_argument("--repo", type=Path, default=ROOT, help="the checkout whose broker runs (to compare versions)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    targets = [t for t in args.targets.split(",") if t]
    assert set(targets) <= set(TARGETS), targets
    results: dict[str, Any] = {"repo": str(args.repo), "records": args.records, "consumers": CONSUMERS, "partitions": PARTITIONS,
                               "lock_ms": LOCK_MS, "runs": []}
    for run in range(args.repeat):
        for size in sizes:
            n = args.records if size <= 100 else args.records // 6  # the mock keeps about 5 MB a partition
            tag = "%d-%d-%s" % (size, run, uuid.uuid4().hex[:6])
            # alternate the order of the brokers between runs
            order = [t for t in TARGETS if t in targets]
            order = order if run % 2 == 0 else order[::-1]
            for which in order:
                topic, group = "bench-%s-%s" % (which, tag), "g-%s-%s" % (which, tag)
                target = start_mock([topic]) if which == "mock" else start_ours(args.repo)
                try:
                    prepare(target, topic, group, n, size, share=which != "ours_classic")
                    r = consume(target, topic, group, n, share=which != "ours_classic")
                    r.update(target=which, size=size, run=run)
                    if which != "ours_classic":
                        dtopic = topic + "-redelivery"
                        if which == "mock":
                            target.stop()
                            target = start_mock([dtopic])
                        # ours: one partition, which both members get (Kafka's first ShareFetch
                        # answers A with one partition, which B might not be assigned); the mock
                        # assigns a partition to one member only and answers A with both
                        prepare(target, dtopic, group + "-r", 100, size, share=True,
                                partitions=PARTITIONS if which == "mock" else 1)
                        r["redelivery_delay_ms"] = redelivery_delay(target, dtopic, group + "-r")
                    results["runs"].append(r)
                    print(json.dumps(r), file=sys.stderr, flush=True)
                finally:
                    target.stop()
    summary = {}
    for size in sizes:
        for which in targets:
            rs = [r for r in results["runs"] if r["size"] == size and r["target"] == which]
            summary["%s_%dB" % (which, size)] = {
                "records_per_s": median([r["records_per_s"] for r in rs]),
                "records_per_s_from_subscribe": median([r["records_per_s_from_subscribe"] for r in rs]),
                "broker_cpu_us_per_record": median([r["broker_cpu_us_per_record"] for r in rs]),
                "redelivery_delay_ms": median([r.get("redelivery_delay_ms") for r in rs]),
                "complete": all(r["complete"] for r in rs),
            }
        # the bars (issue 10): share >= the mock's rate and >= half of our classic group's
        share = summary.get("ours_share_%dB" % size, {}).get("records_per_s")
        for other in ("mock", "ours_classic"):
            rate = summary.get("%s_%dB" % (other, size), {}).get("records_per_s")
            if share and rate:
                summary["ours_share_%dB" % size]["x_" + other] = round(share / rate, 2)
    results["summary"] = summary
    out = json.dumps(results, indent=1)
    (ROOT / "bench" / "results").mkdir(exist_ok=True)
    (ROOT / "bench" / "results" / "share_groups.json").write_text(out)
    print(out)


if __name__ == "__main__":
    main()
