"""Topic administration with real clients against a broker subprocess: confluent-kafka's
AdminClient, kafka-python's KafkaAdminClient and aiokafka's AIOKafkaAdminClient; changed configs
take effect on produce and survive a restart."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import BrokerProcess

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import KafkaException, Producer  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)

TIMEOUT = 15


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    with BrokerProcess(tmp_path_factory.mktemp("admin") / "data") as proc:
        yield proc


def unique(prefix: str) -> str:
    return "%s-%s" % (prefix, uuid.uuid4().hex[:8])


def confluent_produce(bootstrap: str, topic: str, value: bytes) -> Any:
    """Produce one value; the delivery error (or None)."""
    outcome: list[Any] = []
    producer = Producer({"bootstrap.servers": bootstrap, "message.send.max.retries": 0})
    producer.produce(topic, value, on_delivery=lambda err, msg: outcome.append(err))
    producer.flush(TIMEOUT)
    assert outcome, "no delivery report"
    return outcome[0]


def topic_exists(admin: AdminClient, name: str) -> bool:
    """Asked with DescribeConfigs: a Metadata request for one topic would auto-create it, and
    librdkafka's all-topics Metadata v13 request carries stray bytes."""
    resource = ConfigResource("topic", name)
    try:
        admin.describe_configs([resource])[resource].result(TIMEOUT)
        return True
    except KafkaException as exc:
        assert exc.args[0].code() == 3  # UNKNOWN_TOPIC_OR_PARTITION
        return False


# -- confluent-kafka -----------------------------------------------------------------------------


def test_confluent_create_describe_alter_delete(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = unique("cf")
    futures = admin.create_topics([
        NewTopic(name, 3, 1, config={"retention.ms": "3600000"}),
        NewTopic(unique("rf3"), 1, 3),
        NewTopic("bad/name", 1, 1),
    ], operation_timeout=10)
    results: dict[str, Any] = {}
    for topic, future in futures.items():
        try:
            future.result(TIMEOUT)
            results[topic] = None
        except KafkaException as exc:
            results[topic] = exc.args[0]
    assert results[name] is None
    errors = {t: e for t, e in results.items() if e is not None}
    assert sorted(e.code() for e in errors.values()) == [17, 38]  # INVALID_TOPIC_EXCEPTION, INVALID_REPLICATION_FACTOR
    assert "only 1 broker(s) are registered" in [e for e in errors.values() if e.code() == 38][0].str()

    dry_name = unique("dry")
    admin.create_topics([NewTopic(dry_name, 1, 1)], validate_only=True)[dry_name].result(TIMEOUT)
    assert not topic_exists(admin, dry_name)
    assert topic_exists(admin, name)

    resource = ConfigResource("topic", name)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["retention.ms"].value == "3600000"
    assert configs["retention.ms"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    assert not configs["cleanup.policy"].is_read_only

    change = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
    ])
    admin.incremental_alter_configs([change])[change].result(TIMEOUT)
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["cleanup.policy"].value == "delete,compact"
    assert configs["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value

    bad = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("retention.ms", "forever", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as failure:
        admin.incremental_alter_configs([bad])[bad].result(TIMEOUT)
    assert failure.value.args[0].code() == 40  # INVALID_CONFIG

    admin.create_partitions([NewPartitions(name, 5)])[name].result(TIMEOUT)
    assert len(admin.list_topics(name, timeout=TIMEOUT).topics[name].partitions) == 5
    with pytest.raises(KafkaException) as failure:
        admin.create_partitions([NewPartitions(name, 2)])[name].result(TIMEOUT)
    assert failure.value.args[0].code() == 37  # INVALID_PARTITIONS

    cluster = admin.describe_cluster().result(TIMEOUT)
    assert [n.id for n in cluster.nodes] == [1] and cluster.controller.id == 1 and cluster.cluster_id

    admin.delete_topics([name], operation_timeout=10)[name].result(TIMEOUT)
    assert not topic_exists(admin, name)
    with pytest.raises(KafkaException) as failure:
        admin.delete_topics([name])[name].result(TIMEOUT)
    assert failure.value.args[0].code() == 3  # UNKNOWN_TOPIC_OR_PARTITION


def test_confluent_max_message_bytes_takes_effect(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    name = unique("limit")
    admin.create_topics([NewTopic(name, 1, 1)])[name].result(TIMEOUT)
    assert confluent_produce(broker.bootstrap, name, b"x" * 5000) is None
    change = ConfigResource("topic", name, incremental_configs=[
        ConfigEntry("max.message.bytes", "1000", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([change])[change].result(TIMEOUT)
    error = confluent_produce(broker.bootstrap, name, b"x" * 5000)
    assert error is not None and error.code() == confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    assert confluent_produce(broker.bootstrap, name, b"x" * 100) is None


def test_confluent_broker_configs(broker: BrokerProcess) -> None:
    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    resource = ConfigResource("broker", "1")
    configs = admin.describe_configs([resource])[resource].result(TIMEOUT)
    assert configs["listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert not configs["listeners"].is_read_only and configs["log.dirs"].is_read_only  # Kafka 4.x's dynamic set
    assert configs["log.retention.hours"].value == "168"
    refused = ConfigResource("broker", "1", incremental_configs=[
        ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(KafkaException) as failure:
        admin.incremental_alter_configs([refused])[refused].result(TIMEOUT)
    assert failure.value.args[0].code() == 42  # INVALID_REQUEST
    assert "Cannot update these configs dynamically" in failure.value.args[0].str()


# -- kafka-python --------------------------------------------------------------------------------


def test_kafka_python_admin(broker: BrokerProcess) -> None:
    from kafka import KafkaProducer
    from kafka.admin import ConfigResource as KConfigResource
    from kafka.admin import KafkaAdminClient
    from kafka.admin import NewPartitions as KNewPartitions
    from kafka.admin import NewTopic as KNewTopic
    from kafka.errors import MessageSizeTooLargeError, TopicAlreadyExistsError

    admin = KafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
    try:
        name = unique("kp")
        created = admin.create_topics([KNewTopic(name, 2, 1, topic_configs={"cleanup.policy": "compact"})])
        (topic,) = created["topics"]
        assert (topic["error_code"], topic["num_partitions"], topic["replication_factor"]) == (0, 2, 1)
        assert topic["configs"]["cleanup.policy"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([KNewTopic(name, 2, 1)])

        described = admin.describe_configs([KConfigResource("TOPIC", name)])
        assert described["topic"][name]["cleanup.policy"]["value"] == "compact"
        every = admin.describe_configs([KConfigResource("TOPIC", name)], include_synonyms=True, config_filter="all")
        assert every["topic"][name]["segment.bytes"]["synonyms"][0]["name"] == "log.segment.bytes"

        assert admin.alter_configs([KConfigResource("TOPIC", name, {"max.message.bytes": "1000"})]) == {
            "topic": {name: "OK"}}
        assert admin.alter_configs([KConfigResource("TOPIC", name, {"retention.ms": "60000"})],
                                   incremental=False) == {"topic": {name: "OK"}}
        described = admin.describe_configs([KConfigResource("TOPIC", name)])
        # the legacy API replaces the set; kafka-python carries the other modified keys over
        assert {k: v["value"] for k, v in described["topic"][name].items()} == {
            "cleanup.policy": "compact", "max.message.bytes": "1000", "retention.ms": "60000"}

        producer = KafkaProducer(bootstrap_servers=broker.bootstrap, retries=0, request_timeout_ms=10000)
        try:
            producer.send(name, key=b"k", value=b"y" * 10).get(TIMEOUT)
            with pytest.raises(MessageSizeTooLargeError):
                producer.send(name, key=b"k", value=b"x" * 5000).get(TIMEOUT)
        finally:
            producer.close(5)

        admin.create_partitions({name: KNewPartitions(4)})
        cluster = admin.describe_cluster()
        assert cluster["controller_id"] == 1 and [b["broker_id"] for b in cluster["brokers"]] == [1]
        (log_dirs,) = admin.describe_log_dirs()
        partitions = {(t["name"], p["partition_index"]) for d in log_dirs["log_dirs"] for t in d["topics"]
                      for p in t["partitions"]}
        assert {(name, i) for i in range(4)} <= partitions

        broker_configs = admin.describe_configs([KConfigResource("BROKER", "1")], config_filter="all")["broker"]["1"]
        assert broker_configs["listeners"]["config_source"] == "STATIC_BROKER_CONFIG"
        assert admin.delete_topics([name])["topics"][0]["error_code"] == 0
    finally:
        admin.close()


# -- aiokafka ------------------------------------------------------------------------------------


def test_aiokafka_admin(broker: BrokerProcess) -> None:
    from aiokafka.admin import AIOKafkaAdminClient
    from aiokafka.admin import NewPartitions as ANewPartitions
    from aiokafka.admin import NewTopic as ANewTopic
    from aiokafka.admin.config_resource import ConfigResource as AConfigResource
    from aiokafka.admin.config_resource import ConfigResourceType

    async def run() -> None:
        admin = AIOKafkaAdminClient(bootstrap_servers=broker.bootstrap, request_timeout_ms=10000)
        await admin.start()
        try:
            name = unique("aio")
            response = await admin.create_topics([ANewTopic(name, 2, 1, topic_configs={"retention.ms": "5000"})])
            assert [t[1] for t in response.topic_errors] == [0]
            (described,) = await admin.describe_configs([AConfigResource(ConfigResourceType.TOPIC, name)])
            ((_code, _msg, _type, rname, entries),) = described.resources
            values = {e[0]: e[1] for e in entries}
            assert rname == name and values["retention.ms"] == "5000"
            await admin.alter_configs([AConfigResource(ConfigResourceType.TOPIC, name, {"retention.ms": "7000"})])
            (described,) = await admin.describe_configs([AConfigResource(ConfigResourceType.TOPIC, name)])
            assert {e[0]: e[1] for e in described.resources[0][4]}["retention.ms"] == "7000"
            await admin.create_partitions({name: ANewPartitions(3)})
            assert name in await admin.list_topics()
            cluster = await admin.describe_cluster()
            assert cluster["controller_id"] == 1
            deleted = await admin.delete_topics([name])
            assert [t[1] for t in deleted.topic_error_codes] == [0]
        finally:
            await admin.close()

    asyncio.run(asyncio.wait_for(run(), 60))


# -- restart -------------------------------------------------------------------------------------


@pytest.mark.timeout(90)
def test_topics_and_configs_survive_restart(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = BrokerProcess(data).start()
    name = unique("kept")
    try:
        admin = AdminClient({"bootstrap.servers": first.bootstrap})
        admin.create_topics([NewTopic(name, 2, 1, config={"max.message.bytes": "1000"})])[name].result(TIMEOUT)
        node = ConfigResource("broker", "1", incremental_configs=[
            ConfigEntry("log.retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET)])
        admin.incremental_alter_configs([node])[node].result(TIMEOUT)
        topic_id = admin.list_topics(name, timeout=TIMEOUT).topics[name]
        del admin
    finally:
        assert first.stop() == 0
    second = BrokerProcess(data, port=first.port).start()
    try:
        admin = AdminClient({"bootstrap.servers": second.bootstrap})
        metadata = admin.list_topics(name, timeout=TIMEOUT).topics[name]
        assert len(metadata.partitions) == 2 and topic_id is not None
        resource = ConfigResource("topic", name)
        configs = admin.describe_configs([resource])[resource].result(TIMEOUT)
        assert (configs["max.message.bytes"].value, configs["max.message.bytes"].source) == (
            "1000", ConfigSource.DYNAMIC_TOPIC_CONFIG.value)
        assert (configs["retention.ms"].value, configs["retention.ms"].source) == (
            "3600000", ConfigSource.DYNAMIC_BROKER_CONFIG.value)
        error = confluent_produce(second.bootstrap, name, b"x" * 5000)
        assert error is not None and error.code() == confluent_kafka.KafkaError.MSG_SIZE_TOO_LARGE
    finally:
        second.stop()
