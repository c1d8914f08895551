"""Replication throttles across processes, set as kafka-reassign-partitions --throttle sets them:
the topic's leader.replication.throttled.replicas names the current replica, its
follower.replication.throttled.replicas the joining one, and the brokers' rates bound how fast
the joining replica copies the log (confluent-kafka sets the configs, kafka-python moves the
replica). Either side alone holds the copy to its rate: with 400 KB to copy at 100 KB/s and
16 KB per fetch, the reassignment cannot complete in less than (400 - 16) / 100 = 3.8 s. The
bound asserted is a lower one (a throttle's promise), never a speed. A broker's configs go to that
broker (librdkafka sends them there), which forwards them to the controller; another broker's
are refused where they arrive, as Kafka's ConfigAdminManager does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient, AlterConfigOpType, ConfigEntry, ConfigResource
from kafka import KafkaAdminClient
from kafka import TopicPartition as KafkaTopicPartition

from protocol import messages as M
from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    call,
    controller,
    create_topic,
    logged_errors,
    metadata,
    read_to_end,
    running_cluster,
    wait_leaders,
)
from tests.harness import wait_for

pytestmark = pytest.mark.timeout(150)
INCREMENTAL_ALTER_CONFIGS = 44
RATE = 100_000
RECORDS, SIZE = 400, 1000
MIN_SECONDS = (RECORDS * SIZE - 16384) / RATE - 0.5  # less the clock's slack between the steps


def alter(admin: AdminClient, resource: str, name: str, configs: dict[str, str | None]) -> None:
    change = ConfigResource(resource, name, incremental_configs=[
        ConfigEntry(k, v, incremental_operation=AlterConfigOpType.SET if v is not None else AlterConfigOpType.DELETE)
        for k, v in configs.items()])
    admin.incremental_alter_configs([change])[change].result(30)


def fill(cluster: ProcessCluster, topic: str) -> None:
    # batches of 10 records (10 KB): a fetch of 16 KB takes one
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 5,
                         "batch.num.messages": 10})
    for i in range(RECORDS):
        producer.produce(topic, b"%04d" % i + b"x" * (SIZE - 4), partition=0)
    assert producer.flush(40) == 0


def replicas(port: int, topic: str) -> list[int]:
    return list(metadata(port, [topic]).topics[0].partitions[0].replica_nodes)


def move(cluster: ProcessCluster, topic: str, target: list[int]) -> float:
    """Seconds from the reassignment's start until the target replicas are the partition's."""
    admin = KafkaAdminClient(bootstrap_servers=cluster.bootstrap, request_timeout_ms=30000)
    try:
        started = time.monotonic()
        tp = KafkaTopicPartition(topic, 0)
        assert admin.alter_partition_reassignments({tp: target}) == {tp: None}
        wait_for(lambda: not admin.list_partition_reassignments()
                 and sorted(replicas(cluster.node(1).port, topic)) == sorted(target), 60,
                 what="the reassignment of %s to complete" % topic)
        return time.monotonic() - started
    finally:
        admin.close()


@pytest.mark.parametrize("side", ["leader", "follower"])
def test_a_throttled_reassignment_copies_no_faster_than_the_rate(tmp_path: Path, side: str) -> None:
    topic = "throttled-" + side
    with running_cluster(tmp_path / "cluster", overrides={"replica.fetch.max.bytes": "16384"}) as cluster:
        port = cluster.node(1).port
        code, message = create_topic(port, topic, 1, factor=1)
        assert code == 0, message
        source = wait_leaders(cluster, topic, lambda ls: ls.get(0, -1) >= 0)[0]
        joining = next(n for n in cluster.nodes if n != source)
        fill(cluster, topic)
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        alter(admin, "topic", topic, {"leader.replication.throttled.replicas": "0:%d" % source,
                                      "follower.replication.throttled.replicas": "0:%d" % joining})
        # per broker, as kafka-reassign-partitions sets it on the brokers taking part
        throttled = str(source if side == "leader" else joining)
        alter(admin, "broker", throttled, {"%s.replication.throttled.rate" % side: str(RATE)})
        described = admin.describe_configs([ConfigResource("broker", throttled)])
        entry = next(iter(described.values())).result(30)["%s.replication.throttled.rate" % side]
        assert entry.value == str(RATE)

        elapsed = move(cluster, topic, [source, joining])
        assert elapsed >= MIN_SECONDS, "copied %d B in %.1f s: faster than %d B/s" % (RECORDS * SIZE, elapsed, RATE)
        # the copy is whole: the source alone gone, the joining replica serves every record
        alter(admin, "broker", throttled, {"%s.replication.throttled.rate" % side: None})
        move(cluster, topic, [joining])
        wait_leaders(cluster, topic, lambda ls: ls.get(0) == joining)
        values = read_to_end(cluster, topic, 1, RECORDS)
        assert sorted(v[:4] for v in values) == [b"%04d" % i for i in range(RECORDS)]
        assert logged_errors(cluster) == []


def test_a_throttle_rate_or_list_that_kafka_refuses_is_refused(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", topic=("refused", 1, 1)) as cluster:
        # a broker's configs sent to a node that is not the controller: its own are forwarded, and
        # another broker's refused there, answered in the request's order (ConfigAdminManager)
        other = next(n for n in cluster.nodes if n != controller(cluster.node(1).port))
        Q = M.IncrementalAlterConfigsRequest
        request = Q(validate_only=False, resources=[
            Q.AlterConfigsResource(resource_type=4, resource_name=str(other), configs=[Q.AlterableConfig(
                name="leader.replication.throttled.rate", config_operation=0, value="5000")]),
            Q.AlterConfigsResource(resource_type=4, resource_name=str(other % 3 + 1), configs=[Q.AlterableConfig(
                name="leader.replication.throttled.rate", config_operation=0, value="5000")]),
            Q.AlterConfigsResource(resource_type=2, resource_name="refused", configs=[Q.AlterableConfig(
                name="leader.replication.throttled.replicas", config_operation=0, value="*")])])
        answer = call(cluster.node(other).port, INCREMENTAL_ALTER_CONFIGS, 1, request)
        assert [(r.error_code, r.resource_name, r.error_message) for r in answer.responses] == [
            (0, str(other), None),
            (42, str(other % 3 + 1), "Unexpected broker id, expected %d, but received %d" % (other, other % 3 + 1)),
            (0, "refused", None)]
        admin = AdminClient({"bootstrap.servers": cluster.bootstrap})
        resource = ConfigResource("broker", str(other))
        wait_for(lambda: admin.describe_configs([resource])[resource].result(30)
                 .get("leader.replication.throttled.rate") is not None, 30, what="the rate set on the broker")
        for resource, name, config, value, code in (
                ("broker", "1", "leader.replication.throttled.rate", "fast", 42),  # INVALID_REQUEST
                ("broker", "1", "follower.replication.throttled.rate", "-1", 42),
                ("topic", "refused", "leader.replication.throttled.replicas", "0", 40)):  # INVALID_CONFIG
            with pytest.raises(KafkaException) as failure:
                alter(admin, resource, name, {config: value})
            assert failure.value.args[0].code() == code, (config, value, failure.value)
