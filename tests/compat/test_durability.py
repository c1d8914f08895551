"""Data survives a clean restart and `kill -9` of the broker during an acks=all produce.

Each test runs its own broker process (it is stopped and restarted on the same port and data
dir), so these do not use the shared module broker.
"""

from __future__ import annotations

import re
import threading
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402

from tests.compat.conftest import consume_until, create_topic  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

PARTITIONS = 3


def read_everything(bootstrap: str, topic: str, expected: int, timeout: float = 30) -> list[Any]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "durability", "enable.auto.commit": False,
                  "isolation.level": "read_uncommitted"})
    try:
        c.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out = consume_until(c, expected, timeout, num_messages=5000)
        # anything beyond `expected` (duplicates) would show up on one more round
        for msg in c.consume(num_messages=5000, timeout=0.5):
            assert msg.error() is None, msg.error()
            out.append(msg)
        return out
    finally:
        c.close()


def test_clean_restart_keeps_everything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data).start()
    topic = "restart"
    try:
        # 1.2 MB per partition: every partition rolls a second segment
        create_topic(broker, topic, PARTITIONS, {"segment.bytes": "1048576"})
        p = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
        for i in range(3000):
            p.produce(topic, key=b"%d" % i, value=(b"v%d-" % i).ljust(1200, b"."), partition=i % PARTITIONS)
            p.poll(0)
        assert p.flush(30) == 0
        before = [(m.partition(), m.offset(), m.key(), m.value()) for m in read_everything(broker.bootstrap, topic, 3000)]
    finally:
        assert broker.stop() == 0
    assert (data / ".kafka_cleanshutdown").exists()
    broker = BrokerProcess(data, port=broker.port).start()
    try:
        after = [(m.partition(), m.offset(), m.key(), m.value()) for m in read_everything(broker.bootstrap, topic, 3000)]
        assert sorted(after) == sorted(before) and len(after) == 3000
        # and the log goes on where it stopped
        p = Producer({"bootstrap.servers": broker.bootstrap})
        reports: list[Any] = []
        p.produce(topic, value=b"next", partition=0, on_delivery=lambda err, msg: reports.append((err, msg)))
        assert p.flush(30) == 0
        [(err, msg)] = reports
        assert err is None and msg.offset() == 1000
    finally:
        assert broker.stop() == 0


def test_kill_9_during_idempotent_acks_all_produce(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = BrokerProcess(data).start()
    topic = "killed"
    acked: list[bytes] = []
    failed: list[Any] = []
    sent: list[bytes] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            acked.append(msg.value())
        else:
            failed.append(err)

    # flush.messages=1: each produce is acknowledged only after its fsync, so a kill is likely to
    # land between a write and its acknowledgement; the producer then retries batches the log
    # already holds, which only the producer state rebuilt from the log recognises as duplicates
    create_topic(broker, topic, PARTITIONS, {"flush.messages": "1"})
    producer = Producer({
        "bootstrap.servers": broker.bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": 1,
        "batch.num.messages": 20,
        "message.timeout.ms": 60000,
        "reconnect.backoff.ms": 50,
        "reconnect.backoff.max.ms": 500,
        "retry.backoff.ms": 50,
        "retry.backoff.max.ms": 500,
    })
    killed = threading.Event()
    flushed: list[int] = []

    def send(i: int) -> None:
        value = b"m%07d" % i
        while True:
            try:
                producer.produce(topic, value=value, partition=i % PARTITIONS, on_delivery=on_delivery)
                sent.append(value)
                return
            except BufferError:  # local queue full while the broker is away
                producer.poll(0.05)

    def produce_loop() -> None:
        # stream until the broker was killed (bounded), then 1000 more after it
        i = 0
        while not killed.is_set() and i < 200_000:
            send(i)
            i += 1
            if i % 20 == 0:
                producer.poll(0.002)  # delivery callbacks run here, in this thread
        for j in range(i, i + 1000):
            send(j)
            producer.poll(0)
        flushed.append(producer.flush(90))

    thread = threading.Thread(target=produce_loop, name="producer")
    thread.start()
    try:
        wait_for(lambda: len(acked) >= 1000, timeout=30, what="1000 acknowledged messages")
        broker.kill()  # SIGKILL by PID while the producer streams: no clean shutdown, no final flush
        killed.set()
        acked_before_kill = len(acked)
        assert not (data / ".kafka_cleanshutdown").exists()
        broker = BrokerProcess(data, port=broker.port).start()
        thread.join(120)
        assert not thread.is_alive()
        assert flushed == [0]
    finally:
        killed.set()
        thread.join(10)
        rc = broker.stop()
    assert not failed, failed[:3]
    assert len(acked) == len(sent) > acked_before_kill
    broker = BrokerProcess(data, port=broker.port).start()
    try:
        got = [m.value() for m in read_everything(broker.bootstrap, topic, len(sent))]
    finally:
        assert broker.stop() == 0
    assert rc == 0
    # every acknowledged value is there exactly once: the producer's retries of batches written
    # just before the kill were recognised as duplicates
    assert len(got) == len(set(got)) == len(sent)
    assert set(got) == set(acked)
    # the start after the kill recovered the unflushed segments; the clean restarts had nothing to do
    recovered = [int(n) for n in re.findall(r"recovered_segments=(\d+)", broker.output())]
    assert recovered[1] > 0 and recovered[2] == 0, recovered
