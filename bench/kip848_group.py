"""KIP-848 group timings against a broker subprocess (confluent-kafka, group.protocol=consumer).

As kbench's "group" test: 5 consumers subscribe to a 10-partition topic; time until every
member holds a non-empty assignment and together they cover every partition without overlap;
then one member close()s and the time until the other 4 cover every partition. Repeated for
each group.consumer.heartbeat.interval.ms given (Kafka's default is 5000).

    python bench/kip848_group.py [--intervals 5000,1000,500] [--repeat 3]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from confluent_kafka import Consumer  # noqa: E402

from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402

MEMBERS = 5
PARTITIONS = 10


def run_once(kafka: BrokerProcess, topic: str, timeout: float = 60.0) -> dict[str, float | None]:
    conf = {"bootstrap.servers": kafka.bootstrap, "group.id": "bench-" + uuid.uuid4().hex[:8],
            "group.protocol": "consumer", "enable.auto.commit": False, "auto.offset.reset": "latest"}
    consumers = [Consumer(dict(conf)) for _ in range(MEMBERS)]
    assign = [frozenset[tuple[str, int]]() for _ in range(MEMBERS)]
    alive = [True] * MEMBERS
    stop = threading.Event()

    def loop(i: int) -> None:
        while not stop.is_set() and alive[i]:
            consumers[i].poll(0.05)
            assign[i] = frozenset((tp.topic, tp.partition) for tp in consumers[i].assignment())

    full = frozenset((topic, p) for p in range(PARTITIONS))

    def complete(idx: range) -> bool:
        sets = [assign[i] for i in idx]
        return all(sets) and frozenset().union(*sets) == full and sum(len(s) for s in sets) == len(full)

    def wait(idx: range, since: float) -> float | None:
        deadline = since + timeout
        while time.perf_counter() < deadline:
            if complete(idx):
                return time.perf_counter() - since
            time.sleep(0.005)
        return None

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(MEMBERS)]
    t0 = time.perf_counter()
    for c in consumers:
        c.subscribe([topic])
    for t in threads:
        t.start()
    join = wait(range(MEMBERS), t0)
    rebalance = None
    if join is not None:
        time.sleep(1.0)
        alive[-1] = False
        threads[-1].join(5)
        t1 = time.perf_counter()
        consumers[-1].close()
        rebalance = wait(range(MEMBERS - 1), t1)
    stop.set()
    for t in threads:
        t.join(5)
    for i, c in enumerate(consumers):
        if alive[i]:
            c.close()
    return {"join_all_assigned_s": join, "rebalance_after_leave_s": rebalance}


def median(runs: list[dict[str, float | None]], key: str) -> float | None:
    values = [v for r in runs if (v := r[key]) is not None]
    return round(statistics.median(values), 3) if values else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--intervals", default="5000,1000,500")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    out = []
    for interval in [int(x) for x in args.intervals.split(",")]:
        with tempfile.TemporaryDirectory() as d:
            kafka = BrokerProcess(Path(d) / "data",
                                  overrides={"group.consumer.heartbeat.interval.ms": str(interval)}).start()
            try:
                runs = []
                for i in range(args.repeat):
                    topic = "bench-%d-%d" % (interval, i)
                    create_topic(kafka, topic, PARTITIONS)
                    runs.append(run_once(kafka, topic))
                    print("interval %d run %d: %s" % (interval, i, runs[-1]), file=sys.stderr)
            finally:
                kafka.stop()

        out.append({"heartbeat_interval_ms": interval, "runs": runs,
                    "join_all_assigned_s": median(runs, "join_all_assigned_s"),
                    "rebalance_after_leave_s": median(runs, "rebalance_after_leave_s")})
    print(json.dumps({"members": MEMBERS, "partitions": PARTITIONS, "results": out}, indent=1))


if __name__ == "__main__":
    main()
