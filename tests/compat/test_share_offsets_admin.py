"""AlterShareGroupOffsets on a share group that does not exist yet creates it (Kafka 4.2,
KAFKA-19662, what franz-go's TestShareGroupOffsetsAdmin expects): an operator positions a group
before its first member starts. No Python client has the share offset admin calls (confluent-kafka
2.16, kafka-python 3.0, aiokafka 0.14), so they go as frames; what they do is seen through real
clients: kafka-python lists the group, confluent-kafka's ShareConsumer starts where it was put and
a confluent-kafka consumer group keeps its type. Default broker settings."""

from __future__ import annotations

import time
import uuid
from typing import Any

from confluent_kafka import Consumer, Producer, ShareConsumer, TopicPartition
from kafka import KafkaAdminClient

from protocol import messages as M
from protocol.errors import ErrorCode as E
from tests.compat.conftest import create_topic
from tests.harness import BrokerProcess, RawClient

R = M.AlterShareGroupOffsetsRequest
D = M.DescribeShareGroupOffsetsRequest


def alter(kafka: BrokerProcess, group_id: str, topic: str, offsets: dict[int, int]) -> Any:
    c = RawClient(kafka.port, "share-admin")
    try:
        return c.call(91, 0, R(group_id=group_id, topics=[R.AlterShareGroupOffsetsRequestTopic(
            topic_name=topic, partitions=[R.AlterShareGroupOffsetsRequestPartition(partition_index=p, start_offset=o)
                                          for p, o in offsets.items()])]))
    finally:
        c.close()


def start_offsets(kafka: BrokerProcess, group_id: str) -> dict[tuple[str, int], int]:
    c = RawClient(kafka.port, "share-admin")
    try:
        group = c.call(90, 1, D(groups=[D.DescribeShareGroupOffsetsRequestGroup(group_id=group_id, topics=None)]))
    finally:
        c.close()
    return {(t.topic_name, p.partition_index): p.start_offset for t in group.groups[0].topics for p in t.partitions}


def produce(kafka: BrokerProcess, topic: str, n: int, partitions: int) -> None:
    p = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, value=b"v%d" % i, partition=i % partitions)
    assert p.flush(10) == 0


def test_altering_offsets_creates_the_share_group_its_first_member_starts_there(
        kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    produce(kafka, topic_name, 20, 2)  # offsets 0-9 in each partition
    group = "share-" + uuid.uuid4().hex[:10]
    altered = alter(kafka, group, topic_name, {0: 7, 1: 3})
    assert altered.error_code == 0
    assert [(p.partition_index, p.error_code) for t in altered.responses for p in t.partitions] == [(0, 0), (1, 0)]
    admin = KafkaAdminClient(bootstrap_servers=kafka.bootstrap)
    try:
        listed = admin.list_groups(types_filter=["share"])
    finally:
        admin.close()
    assert [(g["group_id"], g["group_state"]) for g in listed if g["group_id"] == group] == [(group, "Empty")], listed
    assert start_offsets(kafka, group) == {(topic_name, 0): 7, (topic_name, 1): 3}

    # share.auto.offset.reset is left at latest: the member starts where the group was put
    c = ShareConsumer({"bootstrap.servers": kafka.bootstrap, "group.id": group})
    got: list[tuple[int, int]] = []
    try:
        c.subscribe([topic_name])
        deadline = time.monotonic() + 30
        while len(got) < 10 and time.monotonic() < deadline:
            for m in c.poll(0.5):
                assert m.error() is None, m.error()
                got.append((m.partition(), m.offset()))
        # a group with a member is not altered
        busy = alter(kafka, group, topic_name, {0: 0})
        assert (busy.error_code, busy.error_message) == (E.NON_EMPTY_GROUP, "The group is not empty.")
        c.commit_sync(10)
    finally:
        c.close()
    assert sorted(got) == [(0, o) for o in range(7, 10)] + [(1, o) for o in range(3, 10)]


def test_a_consumer_group_is_not_made_a_share_group(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    group = "consumer-" + uuid.uuid4().hex[:10]
    c = Consumer({"bootstrap.servers": kafka.bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic_name, 0, 0)], asynchronous=False)
    finally:
        c.close()
    refused = alter(kafka, group, topic_name, {0: 0})
    assert (refused.error_code, refused.error_message) == (E.GROUP_ID_NOT_FOUND,
                                                           "Group %s is not a share group." % group)
