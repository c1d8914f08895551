"""Does a second broker process buy throughput? The prototype of docs/scaling.md, measured.

    python bench/process_cluster.py [--rounds 3] [--producers 4] [--messages 200000] [--size 100]
                                    [--linger-ms 0]

Three ways to serve the same topic (8 partitions), in turns, each driven by the same load:
`--producers` confluent-kafka producer processes (acks=all, `--linger-ms`), each sending
`--messages` records of `--size` bytes spread over every partition.

- `one`: one broker process, one node (today's broker).
- `simulated_2`: one process answering as two nodes (simulated.brokers=2): the clients' view of
  a two-broker cluster, with one process's single core behind it.
- `processes_2`: two processes, one per node (simulated.brokers=2, simulated.process.node=0/1,
  broker/testing/process_cluster.py): each leads half the partitions on its own core.

Prints one JSON object: per mode and round the produce throughput (MB/s, all producers from the
first send to the last delivery report) and the brokers' CPU seconds (user+system, from /proc)
per MB, then medians. The defaults (100 B records, linger 0) make many small requests, the
load where the broker's CPU, not the network copy, is the limit. On a 2-core machine the producers compete with the brokers for the cores,
so the ceiling is the machine, not the design; the ratio of `processes_2` to `one` is the figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peers import HOST, REPO, Peer, _spawn, _wait_ready, free_port  # noqa: E402

TOPIC = "scale"
PARTITIONS = 8
CLUSTER_ID = "cHJvY2Vzcy1jbHVzdGVyAA"
MODES = ("one", "simulated_2", "processes_2")

PRODUCER = r"""
import sys, time
from confluent_kafka import Producer
bootstrap, topic, partitions, count, size, linger, per_batch = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
p = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": linger, "batch.num.messages": per_batch, "batch.size": 262144,
              "queue.buffering.max.messages": 1000000})
failed = []
value = b"x" * size
p.produce(topic, value, partition=0)
p.flush(30)
start = time.monotonic()
for i in range(count):
    while True:
        try:
            p.produce(topic, value, partition=i % partitions,
                      on_delivery=lambda e, m: failed.append(e) if e is not None else None)
            break
        except BufferError:
            p.poll(0.01)
left = p.flush(120)
print(start, time.monotonic(), left, len(failed), failed[:1])
"""


def cpu_seconds(pid: int) -> float:
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def start_brokers(mode: str, workdir: Path) -> list[Peer]:
    port = free_port()
    while port + 1 > 65535 or not _port_free(port + 1):
        port = free_port()
    base = {"listeners": "PLAINTEXT://%s:%d" % (HOST, port), "cluster.id": CLUSTER_ID, "log.level": "WARNING",
            "group.initial.rebalance.delay.ms": "0"}
    nodes: list[dict[str, str]]
    if mode == "one":
        nodes = [{}]
    elif mode == "simulated_2":
        nodes = [{"simulated.brokers": "2"}]
    else:
        controller = str(workdir / "node0")
        nodes = [{"simulated.brokers": "2", "simulated.process.node": str(k), "simulated.controller.log.dir": controller}
                 for k in range(2)]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    peers = []
    for k, extra in enumerate(nodes):
        props = {**base, **extra, "log.dirs": str(workdir / ("node%d" % k))}
        argv = [sys.executable, "-m", "broker"]
        for key, value in props.items():
            argv += ["--override", "%s=%s" % (key, value)]
        name = "%s-node%d" % (mode, k)
        proc, log_path = _spawn(name, argv, workdir, env)
        peer = Peer(name, "%s:%d" % (HOST, port + k), proc, workdir, log_path)
        peers.append(peer)
        _wait_ready(peer, HOST, port + k, 60.0)
    return peers


def _port_free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def create_topic(bootstraps: list[str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstraps[0]})
    for future in admin.create_topics([NewTopic(TOPIC, PARTITIONS, 1)]).values():
        future.result(30)
    deadline = time.monotonic() + 30
    for bootstrap in bootstraps:  # every process knows every partition's leader
        while not _ready(AdminClient({"bootstrap.servers": bootstrap}), bootstrap):
            if time.monotonic() > deadline:
                raise RuntimeError("topic %s not ready on %s" % (TOPIC, bootstrap))
            time.sleep(0.05)


def _ready(admin: AdminClient, bootstrap: str) -> bool:
    topic = admin.list_topics(TOPIC, timeout=10).topics.get(TOPIC)
    return topic is not None and topic.error is None and len(topic.partitions) == PARTITIONS \
        and all(p.leader >= 0 for p in topic.partitions.values())


def one_round(mode: str, producers: int, messages: int, size: int, linger_ms: int, per_batch: int) -> dict[str, Any]:
    workdir = Path(tempfile.mkdtemp(prefix="bench-process-cluster-"))
    peers = start_brokers(mode, workdir)
    try:
        bootstrap = peers[0].bootstrap
        create_topic([p.bootstrap for p in peers])
        cpu_before = sum(cpu_seconds(p.pid) for p in peers)
        procs = [subprocess.Popen([sys.executable, "-c", PRODUCER, bootstrap, TOPIC, str(PARTITIONS), str(messages),
                                   str(size), str(linger_ms), str(per_batch)], stdout=subprocess.PIPE, text=True) for _ in range(producers)]
        outputs = [p.communicate(timeout=600)[0].split() for p in procs]
        cpu = sum(cpu_seconds(p.pid) for p in peers) - cpu_before
        starts, ends = [float(o[0]) for o in outputs], [float(o[1]) for o in outputs]
        undelivered = sum(int(o[2]) + int(o[3]) for o in outputs)
        mb = producers * messages * size / 1e6
        elapsed = max(ends) - min(starts)
        return {"mb_per_s": round(mb / elapsed, 1), "broker_cpu_s_per_mb": round(cpu / mb, 4),
                "elapsed_s": round(elapsed, 2), "undelivered": undelivered}
    finally:
        for peer in reversed(peers):
            peer.stop()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--producers", type=int, default=4)
    parser.add_argument("--messages", type=int, default=200000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--linger-ms", type=int, default=0)
    parser.add_argument("--batch-messages", type=int, default=1, help="librdkafka batch.num.messages")
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args()
    modes = args.modes.split(",")
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    for r in range(args.rounds):
        for mode in modes if r % 2 == 0 else list(reversed(modes)):  # alternate the order
            runs[mode].append(one_round(mode, args.producers, args.messages, args.size, args.linger_ms, args.batch_messages))
            print(mode, runs[mode][-1], file=sys.stderr)
    medians = {m: {k: statistics.median(r[k] for r in rs) for k in ("mb_per_s", "broker_cpu_s_per_mb")}
               for m, rs in runs.items()}
    print(json.dumps({"args": vars(args), "cores": os.cpu_count(), "runs": runs, "median": medians}, indent=1))


if __name__ == "__main__":
    main()
