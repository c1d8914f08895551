"""Kafka 4.x's admin long tail with real admin clients (kafka-python's KafkaAdminClient and
confluent-kafka's AdminClient) against one broker subprocess: feature flags, leader elections,
partition reassignments, the metadata quorum, log directories, config resources and
DescribeTopicPartitions."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest

from tests.harness import BrokerProcess, wait_for

kafka = pytest.importorskip("kafka")
from kafka import KafkaAdminClient  # noqa: E402

TIMEOUT = 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("admin4") / "data") as proc:
        yield proc


@pytest.fixture(scope="module")
def admin(broker: BrokerProcess) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=TIMEOUT * 1000)
    try:
        yield client
    finally:
        client.close()


def unique(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


# -- features (ApiVersions, UpdateFeatures) -------------------------------------------------------


def test_kafka_python_describes_and_updates_features(admin: KafkaAdminClient) -> None:
    described = admin.describe_features()
    assert described["metadata.version"]["supported"] == (7, 29)
    assert described["metadata.version"]["finalized"] == (29, 29)
    assert described["group.version"]["finalized"] == (1, 1)
    assert described["kraft.version"]["finalized"] == (1, 1)
    assert "finalized" not in described["streams.version"]
    assert admin.update_features({"group.version": ("SAFE_DOWNGRADE", 0)}, validate_only=True) == {
        "group.version": "OK"}
    assert admin.describe_features()["group.version"]["finalized"] == (1, 1)
    with pytest.raises(kafka.errors.InvalidUpdateVersionError, match="only supports versions 0-1"):
        admin.update_features({"group.version": 5})
    # an upgrade to the level the cluster has is no change
    assert admin.update_features({"metadata.version": 29}) == {"metadata.version": "OK"}


# -- leaders, reassignments, quorum, DescribeTopicPartitions ---------------------------------------


def create(admin: KafkaAdminClient, name: str, partitions: int = 2) -> str:
    from kafka.admin import NewTopic

    admin.create_topics([NewTopic(name, num_partitions=partitions, replication_factor=1)])
    return name


def test_kafka_python_elect_leaders(admin: KafkaAdminClient) -> None:
    topic = create(admin, unique("elect"))
    response = admin.elect_leaders(0, {topic: [0, 1]})  # ELECTION_NOT_NEEDED is not an error
    codes = {(r.topic, p.partition_id): p.error_code for r in response.replica_election_results
             for p in r.partition_result}
    assert codes == {(topic, 0): 84, (topic, 1): 84}
    with pytest.raises(kafka.errors.UnknownTopicOrPartitionError):
        admin.elect_leaders(1, {topic: [7]})


def test_confluent_elect_leaders(broker: BrokerProcess) -> None:
    confluent_kafka = pytest.importorskip("confluent_kafka")
    from confluent_kafka import ElectionType, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    topic = unique("elect-c")
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(TIMEOUT)
    result = admin.elect_leaders(ElectionType.PREFERRED, [TopicPartition(topic, 0), TopicPartition(topic, 1)])
    errors = result.result(TIMEOUT)
    assert {(tp.topic, tp.partition): e.code() for tp, e in errors.items()} == {
        (topic, 0): confluent_kafka.KafkaError.ELECTION_NOT_NEEDED,
        (topic, 1): confluent_kafka.KafkaError.ELECTION_NOT_NEEDED}
    unknown = admin.elect_leaders(ElectionType.UNCLEAN, [TopicPartition(unique("none"), 0)]).result(TIMEOUT)
    assert [e.code() for e in unknown.values()] == [confluent_kafka.KafkaError.UNKNOWN_TOPIC_OR_PART]


def test_kafka_python_partition_reassignments(admin: KafkaAdminClient) -> None:
    from kafka import TopicPartition

    topic = create(admin, unique("reassign"))
    tp = TopicPartition(topic, 0)
    assert admin.alter_partition_reassignments({tp: [1]}) == {tp: None}
    assert admin.alter_partition_reassignments({tp: [1, 2]}) == {tp: kafka.errors.InvalidReplicationAssignmentError}
    assert admin.alter_partition_reassignments({tp: None}) == {tp: kafka.errors.NoReassignmentInProgressError}
    assert admin.list_partition_reassignments() == {}
    assert admin.list_partition_reassignments([tp]) == {}


def test_kafka_python_describes_the_quorum(admin: KafkaAdminClient, broker: BrokerProcess) -> None:
    quorum = admin.describe_metadata_quorum()
    (topic,) = quorum["topics"]
    (partition,) = topic["partitions"]
    assert (topic["topic_name"], partition["leader_id"], partition["leader_epoch"]) == ("__cluster_metadata", 1, 1)
    (voter,) = partition["current_voters"]
    assert voter["replica_id"] == 1 and voter["log_end_offset"] == partition["high_watermark"] > 0
    assert partition["observers"] == []
    (node,) = quorum["nodes"]
    assert node["node_id"] == 1 and node["listeners"][0]["port"] == broker.port


def test_kafka_python_describe_topic_partitions(admin: KafkaAdminClient) -> None:
    topic = create(admin, unique("dtp"), partitions=5)
    first = admin.describe_topic_partitions([topic], response_partition_limit=3)
    (t,) = first["topics"]
    assert [p["partition_index"] for p in t["partitions"]] == [0, 1, 2]
    assert first["next_cursor"] == {"topic_name": topic, "partition_index": 3}
    rest = admin.describe_topic_partitions([topic], response_partition_limit=3, cursor=first["next_cursor"])
    assert [p["partition_index"] for p in rest["topics"][0]["partitions"]] == [3, 4]
    assert rest["next_cursor"] is None
    assert t["partitions"][0]["leader_id"] == 1 and t["partitions"][0]["isr_nodes"] == [1]
    missing = admin.describe_topic_partitions([unique("missing")])["topics"][0]
    assert (missing["error_code"], missing["partitions"]) == (3, [])


# -- log dirs (a second broker with two log.dirs) --------------------------------------------------


def test_kafka_python_moves_a_partition_between_log_dirs(tmp_path_factory: pytest.TempPathFactory) -> None:
    from kafka import KafkaProducer, TopicPartitionReplica

    base = tmp_path_factory.mktemp("dirs")
    dirs = [str(base / "d1"), str(base / "d2")]
    proc = BrokerProcess(base / "data", overrides={"log.dirs": ",".join(dirs)}).start()
    try:
        admin = KafkaAdminClient(bootstrap_servers=proc.bootstrap, request_timeout_ms=TIMEOUT * 1000)
        topic = create(admin, unique("moving"), partitions=1)
        producer = KafkaProducer(bootstrap_servers=proc.bootstrap)
        for i in range(50):
            producer.send(topic, b"%d" % i)
        producer.flush(TIMEOUT)

        def where() -> dict[str, int]:
            (entry,) = admin.describe_log_dirs({topic: [0]})
            return {d["log_dir"]: p["partition_size"] for d in entry["log_dirs"] for t in d["topics"]
                    for p in t["partitions"] if not p["is_future_key"]}

        (source, size), = where().items()
        target = next(d for d in dirs if d != source)
        result = admin.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 1): target})
        assert list(result.values()) == [kafka.errors.NoError]
        wait_for(lambda: where() == {target: size}, TIMEOUT, what="the partition in its new log dir")
        producer.send(topic, b"after").get(TIMEOUT)
        bad = admin.alter_replica_log_dirs({TopicPartitionReplica(topic, 0, 1): str(base / "nowhere")})
        assert list(bad.values()) == [kafka.errors.LogDirNotFoundError]
        producer.close()
        admin.close()
    finally:
        assert proc.stop() == 0


# -- config resources and client telemetry (KIP-714) -----------------------------------------------


def test_kafka_python_client_metrics_resources(admin: KafkaAdminClient) -> None:
    from kafka.admin import ConfigResource, ConfigResourceType

    name = unique("sub")
    resource = ConfigResource(ConfigResourceType.CLIENT_METRICS, name,
                              {"metrics": "org.apache.kafka.producer.", "interval.ms": "60000"})
    admin.alter_configs([resource], raise_on_unknown=False)
    described = admin.describe_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, name)])
    text = str(described)
    assert "org.apache.kafka.producer." in text and "60000" in text
    listed = admin.list_config_resources()
    assert name in listed["client_metrics"] and listed["broker"] == ["1"] and listed["broker_logger"] == ["1"]
    assert admin.list_config_resources(["CLIENT_METRICS"]) == {"client_metrics": listed["client_metrics"]}


def test_confluent_kafka_pushes_its_metrics(tmp_path_factory: pytest.TempPathFactory) -> None:
    """librdkafka asks for its subscription on connect and pushes OTLP metrics at the interval;
    they come out of /metrics with its client id."""
    import urllib.request

    from tests.harness import free_port

    confluent_kafka = pytest.importorskip("confluent_kafka")
    from kafka.admin import ConfigResource, ConfigResourceType

    port = free_port()
    proc = BrokerProcess(tmp_path_factory.mktemp("telemetry") / "data", overrides={"metrics.port": str(port)}).start()
    try:
        # the subscription is made with kafka-python: confluent-kafka's AdminClient has no CLIENT_METRICS type
        admin = KafkaAdminClient(bootstrap_servers=proc.bootstrap, request_timeout_ms=TIMEOUT * 1000)
        admin.alter_configs([ConfigResource(ConfigResourceType.CLIENT_METRICS, "everything",
                                            {"metrics": "*", "interval.ms": "200"})], raise_on_unknown=False)
        admin.close()
        producer = confluent_kafka.Producer({"bootstrap.servers": proc.bootstrap, "client.id": "telemetry-app"})
        topic = unique("pushed")
        producer.produce(topic, b"x")
        producer.flush(TIMEOUT)

        def pushed() -> str | None:
            producer.poll(0.05)
            text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=5).read().decode()
            lines = [x for x in text.splitlines() if x.startswith("org_apache_kafka_producer_")
                     and 'client_id="telemetry-app"' in x]
            return lines[0] if lines else None

        line = wait_for(pushed, TIMEOUT, what="the producer's pushed metrics on /metrics")
        assert 'client_software_name="confluent-kafka-python"' in line and 'client_instance_id="' in line
        producer.flush(TIMEOUT)
    finally:
        assert proc.stop() == 0
