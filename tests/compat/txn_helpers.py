"""Helpers of the transaction tests with confluent-kafka: reading to the end of partitions under
an isolation level, and the coordinator's state of a transactional id."""

from __future__ import annotations

import time

import confluent_kafka
from confluent_kafka import Consumer, TopicPartition

from protocol import messages as M
from tests.harness import RawClient

PARTITION_EOF = confluent_kafka.KafkaError._PARTITION_EOF


def read_to_end(bootstrap: str, topic: str, partitions: int, isolation: str, timeout: float = 20) -> list[bytes]:
    """Every value up to the end of each partition (the LSO under read_committed), in the order read."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-reader", "enable.auto.commit": False,
                  "enable.partition.eof": True, "isolation.level": isolation})
    try:
        c.assign([TopicPartition(topic, p, confluent_kafka.OFFSET_BEGINNING) for p in range(partitions)])
        values: list[bytes] = []
        eof: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(eof) < partitions and time.monotonic() < deadline:
            msg = c.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == PARTITION_EOF, msg.error()
                eof.add(msg.partition())
                continue
            eof.discard(msg.partition())
            values.append(msg.value())
        assert len(eof) == partitions, "did not reach the end of every partition"
        return values
    finally:
        c.close()


def transaction_state(port: int, tid: str) -> str:
    """The coordinator's state of the transactional id (DescribeTransactions)."""
    c = RawClient(port, "txn-test")
    try:
        r = c.call(65, 0, M.DescribeTransactionsRequest(transactional_ids=[tid]))
        return str(r.transaction_states[0].transaction_state)
    finally:
        c.close()
