"""Share-group hand-over after a leave, side by side, alternating: our broker (every heartbeat
answered at once, as Kafka does), ours with held share heartbeats (group.heartbeat.hold.ms=-1),
another checkout's broker (`ours@DIR`) and librdkafka's mock cluster, all at the default share
heartbeat interval (5 s).

Two confluent-kafka ShareConsumers share a 2-partition topic; once each reads its own partition,
B closes (a clean leave) and records keep arriving on B's partition every 20 ms; reported: the
time from B's leave to A's first record of B's partition.

    flock /work/notes/bench.lock python bench/share_handover.py [--repeat 3] [--targets ours,ours-hold,mock]
    flock /work/notes/bench.lock python bench/share_handover.py --targets ours@../main,ours,mock

Prints one JSON object (also written to bench/results/share_handover.json).
"""

from __future__ import annotations

import argparse
import json
import statistics
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
import share_groups  # noqa: E402
from confluent_kafka import Producer, ShareConsumer  # noqa: E402

LIMIT_S = 30.0
SETTLE_S = 6.0  # more than the default share heartbeat interval (5 s)


def handover(bootstrap: str, topic: str, group: str) -> float | None:
    """Seconds from B's leave to A's first record of B's partition (None: not within the limit)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0})
    stop = threading.Event()

    def feed() -> None:
        while not stop.is_set():
            for p in (0, 1):
                producer.produce(topic, value=b"x", partition=p)
            producer.poll(0)
            stop.wait(0.02)
        producer.flush(5)

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    a = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    b = ShareConsumer({"bootstrap.servers": bootstrap, "group.id": group})
    try:
        a.subscribe([topic])
        b.subscribe([topic])
        seen: dict[str, set[int]] = {"a": set(), "b": set()}
        joined = time.monotonic()
        deadline = joined + LIMIT_S
        settled_since = None
        # until A has heartbeated since B joined (it was told its one partition; before that it may
        # still fetch both, B taking every record of the second) and each reads only its own
        while time.monotonic() < deadline or time.monotonic() < joined + SETTLE_S:
            for name, c in (("a", a), ("b", b)):
                got = {int(m.partition() or 0) for m in c.poll(0.05) if m.error() is None}
                if got:
                    seen[name] |= got
            if len(seen["a"]) == 1 and len(seen["b"]) == 1 and seen["a"] != seen["b"]:
                settled_since = settled_since or time.monotonic()
                if time.monotonic() - settled_since > 1.0 and time.monotonic() > joined + SETTLE_S:
                    break
            else:
                seen = {"a": set(), "b": set()} if len(seen["a"]) > 1 or len(seen["b"]) > 1 else seen
                settled_since = None
        else:
            return None
        orphan = next(iter(seen["b"]))
        b.close()
        left = time.perf_counter()
        deadline = time.monotonic() + LIMIT_S
        while time.monotonic() < deadline:
            if any(m.error() is None and int(m.partition() or 0) == orphan for m in a.poll(0.02)):
                return round(time.perf_counter() - left, 3)
        return None
    finally:
        stop.set()
        feeder.join(10)
        try:
            a.close()
        except Exception:
            pass


def run_once(target_name: str) -> float | None:
    topic, group = "handover-%s" % uuid.uuid4().hex[:8], "g-%s" % uuid.uuid4().hex[:8]
    if target_name == "mock":
        target = share_groups.start_mock([topic])
    else:
        props = {"group.heartbeat.hold.ms": "-1"} if target_name == "ours-hold" else {}
        repo = Path(target_name[len("ours@"):]).resolve() if target_name.startswith("ours@") else ROOT
        peer = peers.start_ours(props, repo=repo)
        target = share_groups.Target(target_name, peer.bootstrap, peer.pid, peer.stop, group_configs=True)
    try:
        if target.group_configs:
            share_groups.prepare(target, topic, group, 0, 1, share=True)
        return handover(target.bootstrap, topic, group)
    finally:
        target.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--targets", default="ours,ours-hold,mock",
                        help="ours, ours-hold (group.heartbeat.hold.ms=-1), ours@DIR (another checkout), mock")
    args = parser.parse_args()
    names = [n for n in args.targets.split(",") if n]
    runs: dict[str, list[float | None]] = {n: [] for n in names}
    for _ in range(args.repeat):
        for name in names:  # alternating, so that all see the same machine load
            runs[name].append(run_once(name))
            print(name, runs[name][-1], file=sys.stderr, flush=True)
    results: dict[str, Any] = {}
    for name in names:
        done = [r for r in runs[name] if r is not None]
        results[name] = {"runs_s": runs[name], "median_s": round(statistics.median(done), 3) if done else None}
    text = json.dumps(results, indent=2)
    print(text)
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "share_handover.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
