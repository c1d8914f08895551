"""KIP-848 hand-over with members that commit: how long after one member leaves (or joins) do the
members own every partition again? Ours and librdkafka's mock cluster side by side, in one run,
alternating.

Three confluent-kafka consumers (group.protocol=consumer, default settings otherwise) share a
6-partition topic a producer keeps writing to; each commits synchronously after every record it
reads. Once every partition is owned by exactly one member:
- leave: one member close()s; the time from then until the two others own every partition (no
  overlap) is the hand-over;
- join: a fourth member subscribes; the time until all four own a share of the partitions (no
  overlap, every partition owned) is the hand-over (the others revoke for it first).
Each broker runs with its default heartbeat interval (ours: Kafka's 5000 ms; the mock: 3000 ms).

    python bench/kip848_handover.py [--repeat 5] [--peers ours,mock] [--protocol classic]
    python bench/kip848_handover.py --peers ours@../main,ours,mock --scenarios leave,join

Peers: `ours` (this checkout), `ours@DIR` (the broker of the checkout in DIR: to compare two
versions), `ours-hold` (this checkout with group.heartbeat.hold.ms=-1), `mock`. `--protocol
classic` runs the same with classic members (JoinGroup/SyncGroup/Heartbeat, the client's own
heartbeat interval, 3 s in librdkafka) for comparison.

Prints one JSON object: per peer and scenario the hand-over times (s), their median and max, and
how long the leaving member's close() took.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer, KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

sys.path.insert(0, str(ROOT / "bench"))
from peers import Peer, start_mock, start_ours  # noqa: E402

MEMBERS = 3
PARTITIONS = 6
TIMEOUT = 60.0


def create_topic(peer: Peer, topic: str) -> None:
    if peer.control is not None:  # the mock has no CreateTopics: its control port makes topics
        host, port = peer.control.rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(b"CREATE %s %d\n" % (topic.encode(), PARTITIONS))
            assert s.recv(100).startswith(b"OK"), "mock refused the topic"
        return
    admin = AdminClient({"bootstrap.servers": peer.bootstrap})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)


class Member:
    def __init__(self, bootstrap: str, group: str, topic: str, protocol: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "group.protocol": protocol,
                                  "enable.auto.commit": False, "auto.offset.reset": "latest"})
        self.consumer.subscribe([topic])
        self.owned: frozenset[int] = frozenset()
        self.commits = 0
        self.running = True
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def loop(self) -> None:
        while self.running:
            msg = self.consumer.poll(0.05)
            if msg is not None and msg.error() is None:
                try:
                    self.consumer.commit(message=msg, asynchronous=False)
                    self.commits += 1
                except KafkaException:
                    pass  # a partition moving away mid-commit: the next record commits again
            self.owned = frozenset(tp.partition for tp in self.consumer.assignment())

    def stop_polling(self) -> None:
        self.running = False
        self.thread.join(10)


def covered(members: list[Member]) -> bool:
    sets = [m.owned for m in members]
    return all(sets) and sum(len(s) for s in sets) == PARTITIONS and frozenset().union(*sets) == set(
        range(PARTITIONS))


def wait_until(predicate: Any, timeout: float = TIMEOUT) -> float | None:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout:
        if predicate():
            return time.perf_counter() - start
        time.sleep(0.002)
    return None


def run_once(peer: Peer, protocol: str, scenario: str) -> dict[str, Any]:
    topic = "handover-" + uuid.uuid4().hex[:8]
    create_topic(peer, topic)
    producing = True
    producer = Producer({"bootstrap.servers": peer.bootstrap, "linger.ms": 5})

    def produce() -> None:
        i = 0
        while producing:
            producer.produce(topic, b"%d" % i, partition=i % PARTITIONS)
            producer.poll(0)
            i += 1
            time.sleep(0.002)  # ~500 records/s over the partitions: every member commits all the time
        producer.flush(10)

    writer = threading.Thread(target=produce, daemon=True)
    writer.start()
    group = "handover-" + uuid.uuid4().hex[:8]
    members = [Member(peer.bootstrap, group, topic, protocol) for _ in range(MEMBERS)]
    try:
        if wait_until(lambda: covered(members)) is None:
            return {"error": "the group never covered the topic"}
        time.sleep(1.0)  # steady: committing, heartbeats at their pace
        if scenario == "join":
            t0 = time.perf_counter()
            members.append(Member(peer.bootstrap, group, topic, protocol))
            handover = wait_until(lambda: covered(members))
            return {"handover_s": None if handover is None else round(handover, 3),
                    "commits": sum(m.commits for m in members)}
        leaving, staying = members[-1], members[:-1]
        leaving.stop_polling()
        t0 = time.perf_counter()
        leaving.consumer.close()
        closed = time.perf_counter() - t0
        handover = wait_until(lambda: covered(staying))
        result = {"handover_s": None if handover is None else round(closed + handover, 3),
                  "close_s": round(closed, 3), "commits": sum(m.commits for m in members)}
        return result
    finally:
        producing = False
        writer.join(10)
        for m in members:
            if m.running:
                m.stop_polling()
                m.consumer.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--peers", default="ours,mock")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="ours only")
    ap.add_argument("--protocol", default="consumer", choices=["consumer", "classic"])
    ap.add_argument("--scenarios", default="leave", help="leave, join or both (leave,join)")
    a = ap.parse_args()
    names = [n for n in a.peers.split(",") if n]
    scenarios = [s for s in a.scenarios.split(",") if s]
    peers: dict[str, Peer] = {}
    out: dict[str, Any] = {"members": MEMBERS, "partitions": PARTITIONS, "repeat": a.repeat,
                           "protocol": a.protocol, "peers": {}}
    overrides = dict(kv.split("=", 1) for kv in a.override)
    try:
        for name in names:
            if name == "ours":
                peers[name] = start_ours(overrides)
            elif name == "ours-hold":
                peers[name] = start_ours({**overrides, "group.heartbeat.hold.ms": "-1"})
            elif name.startswith("ours@"):  # another checkout's broker
                peers[name] = start_ours(overrides, repo=Path(name[len("ours@"):]).resolve())
            elif name == "mock":
                peers[name] = start_mock(duration=3600)
        runs: dict[str, list[dict[str, Any]]] = {"%s/%s" % (n, s): [] for n in peers for s in scenarios}
        for _ in range(a.repeat):
            for scenario in scenarios:
                for name, peer in peers.items():  # alternating, so all see the same machine load
                    key = "%s/%s" % (name, scenario)
                    runs[key].append(run_once(peer, a.protocol, scenario))
                    print(key, runs[key][-1], file=sys.stderr, flush=True)
        for name, results in runs.items():
            times = [r["handover_s"] for r in results if r.get("handover_s") is not None]
            out["peers"][name] = {
                "handover_s": times,
                "handover_median_s": round(statistics.median(times), 3) if times else None,
                "handover_max_s": max(times) if times else None,
                "close_median_s": round(statistics.median(r["close_s"] for r in results if "close_s" in r), 3)
                if any("close_s" in r for r in results) else None,
                "errors": [r["error"] for r in results if "error" in r],
                "info": peers[name.rsplit("/", 1)[0]].info,
            }
    finally:
        for peer in peers.values():
            peer.stop()
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
