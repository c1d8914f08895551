"""Transactions across `kill -9` of the broker (confluent-kafka): committed transactions survive
whole, open ones are aborted, a decided one (PrepareCommit) is completed at the next start.

Each test runs its own broker process, stopped and restarted on the same data dir.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException, Producer  # noqa: E402

from broker.coordinator.log_writer import coordinator_batch  # noqa: E402
from broker.coordinator.runtime import partition_for  # noqa: E402
from broker.coordinator.txn.records import parse_key, parse_value, transaction_record  # noqa: E402
from broker.coordinator.txn.state import TransactionState  # noqa: E402
from broker.log import LogConfig, load_log  # noqa: E402
from broker.log.reader import iter_records  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.txn_helpers import read_to_end, transaction_state  # noqa: E402
from tests.harness import BrokerProcess, wait_for  # noqa: E402

OVERRIDES = {"transaction.abort.timed.out.transaction.cleanup.interval.ms": "500",
             "transaction.state.log.num.partitions": "5"}


def start(data: Path, port: int | None = None) -> BrokerProcess:
    return BrokerProcess(data, port=port, overrides=OVERRIDES).start()


def txn_producer(bootstrap: str, tid: str, **config: Any) -> Producer:
    p = Producer({"bootstrap.servers": bootstrap, "transactional.id": tid, "linger.ms": 2,
                  "message.timeout.ms": 20000, "transaction.timeout.ms": 20000, **config})
    p.init_transactions(30)
    return p


def read_committed(bootstrap: str, topic: str, partitions: int) -> list[bytes]:
    return read_to_end(bootstrap, topic, partitions, "read_committed", timeout=30)


def test_kill_9_while_transactions_commit(tmp_path: Path) -> None:
    """Transactions spanning two partitions commit in a loop while the broker is killed: after the
    restart every acknowledged commit is there, whole, and nothing else is."""
    data = tmp_path / "data"
    broker = start(data)
    topic = "killed-txn"
    create_topic(broker, topic, 2, {"flush.messages": "1"})
    acked: list[int] = []
    stop = threading.Event()

    def loop() -> None:
        p = txn_producer(broker.bootstrap, "killer", **{"socket.timeout.ms": 2000})
        i = 0
        while not stop.is_set():
            try:
                p.begin_transaction()
                p.produce(topic, value=b"%d-a" % i, partition=0)
                p.produce(topic, value=b"%d-b" % i, partition=1)
                p.commit_transaction(5)
            except KafkaException:
                return  # the broker is gone
            acked.append(i)
            i += 1

    thread = threading.Thread(target=loop, name="txn-producer")
    thread.start()
    try:
        wait_for(lambda: len(acked) >= 30, timeout=60, what="30 committed transactions")
        broker.kill()
        stop.set()
        thread.join(60)
        broker = start(data, broker.port)
        # a new producer with the same id ends whatever the old one left open
        txn_producer(broker.bootstrap, "killer").flush(5)
        values = read_committed(broker.bootstrap, topic, 2)
    finally:
        stop.set()
        thread.join(10)
        assert broker.stop() == 0
    committed = {int(v.split(b"-")[0]) for v in values}
    assert set(acked) <= committed  # nothing acknowledged is lost
    assert sorted(values) == sorted([b"%d-a" % i for i in committed] + [b"%d-b" % i for i in committed])  # whole
    assert len(values) == len(set(values))  # once


def test_kill_9_with_a_transaction_open(tmp_path: Path) -> None:
    data = tmp_path / "data"
    broker = start(data)
    topic = "open-txn"
    try:
        create_topic(broker, topic, 1)
        p = txn_producer(broker.bootstrap, "open", **{"transaction.timeout.ms": 3000, "message.timeout.ms": 3000})
        p.begin_transaction()
        p.produce(topic, value=b"committed")
        p.commit_transaction(10)
        p.begin_transaction()
        p.produce(topic, value=b"open")
        p.flush(10)
        broker.kill()
        broker = start(data, broker.port)
        assert transaction_state(broker.port, "open") == "Ongoing"
        # the open transaction holds the LSO back until it times out and is aborted
        assert read_committed(broker.bootstrap, topic, 1) == [b"committed"]
        wait_for(lambda: transaction_state(broker.port, "open") == "CompleteAbort", 20, 0.1, "the timeout abort")
        fresh = txn_producer(broker.bootstrap, "open")  # recovers at once
        fresh.begin_transaction()
        fresh.produce(topic, value=b"after")
        fresh.commit_transaction(10)
        assert read_committed(broker.bootstrap, topic, 1) == [b"committed", b"after"]
    finally:
        assert broker.stop() == 0


def test_a_transaction_left_in_prepare_commit_completes_at_start(tmp_path: Path) -> None:
    """The broker died after the PrepareCommit record was durable, before the markers: the next
    start writes them, and the transaction's data becomes visible."""
    data = tmp_path / "data"
    broker = start(data)
    topic = "prepared"
    tid = "prepared-tx"
    create_topic(broker, topic, 2)
    p = txn_producer(broker.bootstrap, tid)
    p.begin_transaction()
    p.produce(topic, value=b"p0", partition=0)
    p.produce(topic, value=b"p1", partition=1)
    p.flush(10)
    port = broker.port
    broker.kill()
    # the decision is written, as EndTxn(commit) would have, and nothing after it
    log_dir = data / ("__transaction_state-%d" % partition_for(tid, 5))
    log, _ = load_log(str(log_dir), LogConfig(), had_clean_shutdown=False)
    last = [r for r in iter_records(log) if parse_key(r.key) == tid][-1]
    meta = parse_value(tid, last.value)
    assert meta.state is TransactionState.ONGOING
    prepared = meta.prepare_abort_or_commit(TransactionState.PREPARE_COMMIT, 0, -1, meta.txn_start_timestamp + 1,
                                            no_partition_added=False)
    log.append(coordinator_batch([transaction_record(prepared)]))
    log.close()
    broker = start(data, port)
    try:
        wait_for(lambda: transaction_state(broker.port, tid) == "CompleteCommit", 20, 0.1, "the completion")
        assert sorted(read_committed(broker.bootstrap, topic, 2)) == [b"p0", b"p1"]
    finally:
        assert broker.stop() == 0
