"""Groups and transactions on three broker processes, with their coordinators and their partitions
on different nodes: a classic group (confluent-kafka, kafka-python, aiokafka), a KIP-848 group
(confluent-kafka, group.protocol=consumer), a share group (confluent-kafka's ShareConsumer) and a
consume-transform-produce transaction (confluent-kafka). Each test picks the node coordinating
its group or transactional id (FindCoordinator) and checks the layout: the topics are led by all
three nodes (Metadata), so most partitions sit on a node that is not the coordinator, and the
clients see the coordinator where it was picked."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from confluent_kafka import (
    Consumer,
    ConsumerGroupTopicPartitions,
    KafkaException,
    Producer,
    ShareConsumer,
)
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, KafkaConsumer
from kafka.admin import ConfigResource, ConfigResourceType

from broker.coordinator.share.coordinator import kafka_uuid
from protocol import messages as M
from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    GROUP,
    SHARE,
    TRANSACTION,
    call,
    coordinator,
    key_coordinated_by,
    metadata,
    read_to_end,
    shared_cluster,
    spread,
)
from tests.harness import wait_for

PARTITIONS = 6
PER_PARTITION = 10
TOTAL = PARTITIONS * PER_PARTITION


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ProcessCluster]:
    yield from shared_cluster(tmp_path_factory.mktemp("cluster"), overrides={
        "group.share.heartbeat.interval.ms": "500", "group.share.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "500", "group.consumer.min.heartbeat.interval.ms": "500"})


def new_topic(cluster: ProcessCluster, prefix: str) -> str:
    """A topic of PARTITIONS partitions, led by every node."""
    topic = "%s-%s" % (prefix, uuid.uuid4().hex[:6])
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    for future in admin.create_topics([NewTopic(topic, PARTITIONS, 1)], operation_timeout=10).values():
        assert future.result(20) is None
    spread(cluster, topic, PARTITIONS)
    return topic


def produce(cluster: ProcessCluster, topic: str) -> set[bytes]:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5})
    sent = set()
    for i in range(TOTAL):
        value = b"%s-%d" % (topic.encode(), i)
        producer.produce(topic, value=value, partition=i % PARTITIONS)
        sent.add(value)
    assert producer.flush(30) == 0
    return sent


def group_on(cluster: ProcessCluster, node: int, prefix: str) -> str:
    """A group id whose coordinator is `node`."""
    group = key_coordinated_by(cluster.node(1).port, GROUP, node, "%s-%s" % (prefix, uuid.uuid4().hex[:4]))
    assert coordinator(cluster.node(node).port, GROUP, group) == node  # every node agrees
    return group


def committed(cluster: ProcessCluster, group: str) -> dict[int, int]:
    """The group's committed offsets (OffsetFetch to its coordinator, by confluent-kafka's admin)."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    found = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(group)])[group].result(20)
    return {tp.partition: tp.offset for tp in found.topic_partitions}


def coordinator_seen_by_clients(cluster: ProcessCluster, group: str) -> tuple[int, str]:
    """(coordinator id, group type) as confluent-kafka's DescribeConsumerGroups answers."""
    admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
    description = admin.describe_consumer_groups([group])[group].result(20)
    return description.coordinator.id, str(description.type)


# confluent-kafka: classic and KIP-848 ------------------------------------------------------------
def confluent_group(cluster: ProcessCluster, topic: str, group: str, protocol: str) -> None:
    """Two members share the topic's partitions; every record is read once, offsets committed."""
    conf: dict[str, Any] = {"bootstrap.servers": cluster.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                            "enable.auto.commit": False, "group.protocol": protocol}
    if protocol == "classic":
        conf.update({"session.timeout.ms": 10000, "heartbeat.interval.ms": 500})
    members = [Consumer(conf), Consumer(conf)]
    try:
        for member in members:
            member.subscribe([topic])
        read: list[tuple[int, int, bytes]] = []

        def poll_all() -> None:
            for member in members:
                for msg in member.consume(50, 0.1):
                    if msg.error() is not None:
                        raise KafkaException(msg.error())
                    read.append((msg.partition(), msg.offset(), msg.value()))

        def both_assigned() -> bool:
            poll_all()
            owned = [{tp.partition for tp in member.assignment()} for member in members]
            return all(owned) and not owned[0] & owned[1] and owned[0] | owned[1] == set(range(PARTITIONS))

        wait_for(both_assigned, 40, interval=0, what="both members assigned")
        sent = produce(cluster, topic)

        def all_read() -> bool:
            poll_all()
            return len(read) >= TOTAL

        wait_for(all_read, 30, interval=0, what="every record")
        assert len(read) == TOTAL and {v for _, _, v in read} == sent
        for member in members:
            member.commit(asynchronous=False)
    finally:
        for member in members:
            member.close()
    assert committed(cluster, group) == {p: PER_PARTITION for p in range(PARTITIONS)}


def test_classic_group_confluent(cluster: ProcessCluster) -> None:
    topic = new_topic(cluster, "classic")
    group = group_on(cluster, 1, "classic")
    confluent_group(cluster, topic, group, "classic")
    assert coordinator_seen_by_clients(cluster, group) == (1, "ConsumerGroupType.CLASSIC")


def test_kip848_group_confluent(cluster: ProcessCluster) -> None:
    topic = new_topic(cluster, "kip848")
    group = group_on(cluster, 2, "kip848")
    confluent_group(cluster, topic, group, "consumer")
    assert coordinator_seen_by_clients(cluster, group) == (2, "ConsumerGroupType.CONSUMER")


# kafka-python and aiokafka: classic ---------------------------------------------------------------
def test_classic_group_kafka_python(cluster: ProcessCluster) -> None:
    topic = new_topic(cluster, "kp-group")
    group = group_on(cluster, 3, "kp-group")
    members = [KafkaConsumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest", heartbeat_interval_ms=500, session_timeout_ms=10000)
               for _ in range(2)]
    read: list[tuple[int, int, bytes]] = []
    try:
        def poll_all() -> None:
            for member in members:
                for tp, records in member.poll(timeout_ms=100).items():
                    read.extend((tp.partition, r.offset, r.value) for r in records)

        def both_assigned() -> bool:
            poll_all()
            owned = [{tp.partition for tp in member.assignment()} for member in members]
            return all(owned) and owned[0] | owned[1] == set(range(PARTITIONS))

        wait_for(both_assigned, 40, interval=0, what="both members assigned")
        sent = produce(cluster, topic)

        def all_read() -> bool:
            poll_all()
            return len(read) >= TOTAL

        wait_for(all_read, 30, interval=0, what="every record")
        assert len(read) == TOTAL and {v for _, _, v in read} == sent
        for member in members:
            member.commit()
    finally:
        for member in members:
            member.close()
    assert committed(cluster, group) == {p: PER_PARTITION for p in range(PARTITIONS)}
    assert coordinator_seen_by_clients(cluster, group) == (3, "ConsumerGroupType.CLASSIC")


def test_classic_group_aiokafka(cluster: ProcessCluster) -> None:
    topic = new_topic(cluster, "aio-group")
    controller_node = metadata(cluster.node(1).port, []).controller_id
    node = next(n for n in sorted(cluster.nodes) if n != controller_node)
    group = group_on(cluster, node, "aio-group")

    async def run() -> None:
        members = [AIOKafkaConsumer(topic, bootstrap_servers=cluster.bootstrap, group_id=group,
                                    enable_auto_commit=False, auto_offset_reset="earliest",
                                    heartbeat_interval_ms=500, session_timeout_ms=10000) for _ in range(2)]
        read: list[tuple[int, int, bytes]] = []
        for member in members:
            await member.start()
        try:
            async def poll_all() -> None:
                for member in members:
                    for tp, records in (await member.getmany(timeout_ms=100)).items():
                        read.extend((tp.partition, r.offset, r.value) for r in records)

            loop = asyncio.get_running_loop()
            deadline = loop.time() + 40
            while True:
                await poll_all()
                owned = [{tp.partition for tp in member.assignment()} for member in members]
                if all(owned) and owned[0] | owned[1] == set(range(PARTITIONS)):
                    break
                assert loop.time() < deadline, "members not both assigned: %s" % owned
            sent = await asyncio.to_thread(produce, cluster, topic)
            deadline = loop.time() + 30
            while len(read) < TOTAL:
                assert loop.time() < deadline, "read %d of %d" % (len(read), TOTAL)
                await poll_all()
            assert len(read) == TOTAL and {v for _, _, v in read} == sent
            for member in members:
                await member.commit()
        finally:
            for member in members:
                await member.stop()

    asyncio.run(run())
    assert committed(cluster, group) == {p: PER_PARTITION for p in range(PARTITIONS)}
    assert coordinator_seen_by_clients(cluster, group) == (node, "ConsumerGroupType.CLASSIC")


# share group -------------------------------------------------------------------------------------
def share_start_offsets(cluster: ProcessCluster, node: int, group: str, topic: str) -> dict[int, int]:
    """DescribeShareGroupOffsets (raw: no Python client has it), sent to the group's coordinator."""
    R = M.DescribeShareGroupOffsetsRequest
    response = call(cluster.node(node).port, 90, 1, R(groups=[R.DescribeShareGroupOffsetsRequestGroup(
        group_id=group, topics=[R.DescribeShareGroupOffsetsRequestTopic(topic_name=topic,
                                                                        partitions=list(range(PARTITIONS)))])]))
    found = response.groups[0]
    assert found.error_code == 0, found
    return {p.partition_index: p.start_offset for t in found.topics for p in t.partitions}


def set_share_auto_offset_reset(cluster: ProcessCluster, group: str) -> None:
    """share.auto.offset.reset=earliest (kafka-python's IncrementalAlterConfigs of a GROUP)."""
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap)
    try:
        result = admin.alter_configs([ConfigResource(ConfigResourceType.GROUP, group,
                                                     configs={"share.auto.offset.reset": "earliest"})],
                                     incremental=True)
    finally:
        admin.close()
    assert result == {"group": {group: "OK"}}, result


def share_read(cluster: ProcessCluster, group: str, topic: str, want: int, members: int = 2,
               idle: float = 0.0) -> list[bytes]:
    """What `members` share consumers of the group get (implicitly acknowledged): `want` records,
    then nothing more for `idle` seconds."""
    consumers = [ShareConsumer({"bootstrap.servers": cluster.bootstrap, "group.id": group}) for _ in range(members)]
    got: list[bytes] = []
    try:
        for consumer in consumers:
            consumer.subscribe([topic])

        def poll_all() -> bool:
            for consumer in consumers:
                for msg in consumer.poll(0.2):
                    assert msg.error() is None, msg.error()
                    got.append(msg.value())
            return len(got) >= want

        wait_for(poll_all, 60, interval=0, what="%d records through the share group" % want)
        if idle:
            with pytest.raises(TimeoutError):
                wait_for(lambda: poll_all() and len(got) > want, idle, interval=0, what="no more records")
        for consumer in consumers:
            consumer.commit_sync(10)  # librdkafka's close does not acknowledge the last poll's records
    finally:
        for consumer in consumers:
            consumer.close()
    return got


def share_state_nodes(cluster: ProcessCluster, group: str, topic: str) -> dict[int, int]:
    """Partition -> the share coordinator of its share-partition (FindCoordinator, key type 2)."""
    topic_id = metadata(cluster.node(1).port, [topic]).topics[0].topic_id
    return {p: coordinator(cluster.node(1).port, SHARE, "%s:%s:%d" % (group, kafka_uuid(topic_id), p))
            for p in range(PARTITIONS)}


def test_share_group(cluster: ProcessCluster) -> None:
    """Two share consumers read every record once; what they acknowledged is not delivered again
    to a new member: its state went to the share coordinators of each share-partition, which are
    not all on one node (__share_group_state is made by the group's first use)."""
    topic = new_topic(cluster, "share")
    group = group_on(cluster, 3, "share")
    set_share_auto_offset_reset(cluster, group)
    sent = produce(cluster, topic)
    got = share_read(cluster, group, topic, TOTAL)
    assert len(got) == TOTAL and set(got) == sent
    state_nodes = share_state_nodes(cluster, group, topic)
    assert len(set(state_nodes.values())) >= 2, "share-state coordinators all on one node: %s" % state_nodes
    more = produce(cluster, topic)
    assert set(share_read(cluster, group, topic, TOTAL, members=1, idle=2.0)) == more
    assert coordinator_seen_by_clients(cluster, group)[0] == 3




def test_share_group_offsets_described_across_nodes(cluster: ProcessCluster) -> None:
    topic = new_topic(cluster, "share-offsets")
    group = group_on(cluster, 2, "share-offsets")
    set_share_auto_offset_reset(cluster, group)
    produce(cluster, topic)
    assert len(share_read(cluster, group, topic, TOTAL)) == TOTAL
    assert set(share_state_nodes(cluster, group, topic).values()) - {2}, "every share-partition's state on node 2"
    # The group's coordinator reads each share-partition's state from that key's share coordinator
    # (ReadShareGroupStateSummary), as Kafka's does: the start offset persisted with the last write,
    # which Kafka's SharePartition sends before it moves the start offset past what it acknowledges.
    described = share_start_offsets(cluster, 2, group, topic)
    assert sorted(described) == list(range(PARTITIONS))
    assert all(0 <= offset <= PER_PARTITION for offset in described.values()), described


# a transaction ------------------------------------------------------------------------------------
@pytest.mark.parametrize("group_node_is_txn_node", [
    True, False])
def test_consume_transform_produce_transaction(cluster: ProcessCluster, group_node_is_txn_node: bool) -> None:
    """The transaction's partitions are led by all three nodes; its coordinator is not the
    controller; the group whose offsets it commits is coordinated there too, or by another node."""
    source, sink = new_topic(cluster, "txn-in"), new_topic(cluster, "txn-out")
    controller_node = metadata(cluster.node(1).port, []).controller_id
    txn_node = next(n for n in sorted(cluster.nodes) if n != controller_node)
    group_node = txn_node if group_node_is_txn_node else next(n for n in sorted(cluster.nodes) if n != txn_node)
    tid = key_coordinated_by(cluster.node(1).port, TRANSACTION, txn_node, "tx-" + uuid.uuid4().hex[:4])
    group = group_on(cluster, group_node, "ctp")
    sent = produce(cluster, source)

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": tid, "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()  # aborted: its records (on every node) never reach a read_committed reader
    for i in range(PARTITIONS * 2):
        producer.produce(sink, value=b"aborted-%d" % i, partition=i % PARTITIONS)
    producer.flush(30)
    producer.abort_transaction(30)

    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    transformed = 0
    try:
        consumer.subscribe([source])
        deadline = time.monotonic() + 60
        while transformed < TOTAL:
            assert time.monotonic() < deadline, "transformed %d of %d" % (transformed, TOTAL)
            batch = [m for m in consumer.consume(20, 0.5) if m.error() is None]
            if not batch:
                continue
            producer.begin_transaction()
            for msg in batch:
                producer.produce(sink, value=b"out:" + msg.value(), partition=msg.partition())
            producer.send_offsets_to_transaction(consumer.position(consumer.assignment()),
                                                 consumer.consumer_group_metadata(), 10)
            producer.commit_transaction(30)
            transformed += len(batch)
    finally:
        consumer.close()
    assert transformed == TOTAL
    got = read_to_end(cluster, sink, PARTITIONS, TOTAL, isolation="read_committed", errors_fail=True)
    assert sorted(got) == sorted(b"out:" + v for v in sent)
    assert committed(cluster, group) == {p: PER_PARTITION for p in range(PARTITIONS)}
