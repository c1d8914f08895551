"""What the test kit costs a test: a fresh EmbeddedBroker (the `kafka_broker` fixture's work),
and a whole round trip through it with a real client.

    python bench/testkit.py [--repeat 20]

- `fixture_ms`: EmbeddedBroker start + close (temporary directory made and removed, thread and
  event loop started and stopped), as the fixture does per test. Goal: <= 500 ms.
  `fixture_3_nodes_ms`: the same with simulated.brokers=3.
- `round_trip_ms`: start, create a topic, produce one record and consume it with
  confluent-kafka (producer flushed, consumer assigned from the beginning), stop. Goal: <= 1 s.
- `pytest_per_test_ms`: a throwaway project of N tests using `kafka_broker`, run by pytest in a
  subprocess, minus the same project whose tests use no fixture, divided by N.

Medians (and max) over `--repeat` runs after one warm-up; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from broker.testing import EmbeddedBroker


def fixture_once(**properties: Any) -> float:
    t0 = time.perf_counter()
    with EmbeddedBroker({"log.level": "WARNING", **properties}):
        pass
    return time.perf_counter() - t0


def round_trip_once() -> float:
    t0 = time.perf_counter()
    with EmbeddedBroker({"log.level": "WARNING"}) as kafka:
        kafka.create_topic("bench")
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "linger.ms": 0})
        producer.produce("bench", b"value", partition=0)
        assert producer.flush(10) == 0
        consumer = Consumer({"bootstrap.servers": kafka.bootstrap_servers, "group.id": "bench",
                             "enable.auto.commit": False, "fetch.wait.max.ms": 10})
        consumer.assign([TopicPartition("bench", 0, 0)])
        message = None
        deadline = time.monotonic() + 10
        while message is None and time.monotonic() < deadline:
            message = consumer.poll(0.01)
        assert message is not None and message.error() is None and message.value() == b"value"
        consumer.close()
    return time.perf_counter() - t0


def pytest_run(tests: int, fixture: bool) -> float:
    body = "def test_%d(kafka_broker):\n    assert kafka_broker.bootstrap_servers\n" if fixture else \
        "def test_%d():\n    assert True\n"
    with tempfile.TemporaryDirectory() as d:
        (Path(d) / "pytest.ini").write_text("[pytest]\nkafka_broker_properties = log.level=WARNING\n")
        (Path(d) / "test_x.py").write_text("\n".join(body % i for i in range(tests)))
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_x.py"], cwd=d,
                       check=True, capture_output=True, timeout=300)
        return time.perf_counter() - t0


def summary(values: list[float]) -> dict[str, Any]:
    return {"median_ms": round(statistics.median(values) * 1000, 1), "max_ms": round(max(values) * 1000, 1)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--pytest-tests", type=int, default=50)
    args = ap.parse_args()
    fixture_once()
    round_trip_once()
    fixtures = [fixture_once() for _ in range(args.repeat)]
    clusters = [fixture_once(**{"simulated.brokers": 3}) for _ in range(args.repeat)]
    trips = [round_trip_once() for _ in range(args.repeat)]
    with_fixture = [pytest_run(args.pytest_tests, True) for _ in range(3)]
    without = [pytest_run(args.pytest_tests, False) for _ in range(3)]
    per_test = (statistics.median(with_fixture) - statistics.median(without)) / args.pytest_tests
    print(json.dumps({"fixture_ms": summary(fixtures), "fixture_3_nodes_ms": summary(clusters),
                      "round_trip_ms": summary(trips),
                      "pytest_per_test_ms": round(per_test * 1000, 1)}, indent=1))


if __name__ == "__main__":
    main()
