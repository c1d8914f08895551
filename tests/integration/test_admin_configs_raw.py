"""DescribeConfigs, AlterConfigs and IncrementalAlterConfigs with raw frames against an in-process
broker: topic and broker resources, sources and synonyms, validation, effect on the logs, restarts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient
from tests.integration.test_server_support import (  # noqa: F401  (fixtures)
    BrokerThread,
    batch,
    broker_thread_fixture,
    client_fixture,
    produce,
)

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS = 32, 33, 44
TOPIC, BROKER, BROKER_LOGGER = 2, 4, 8
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3


def describe(c: RawClient, rtype: int, name: str, keys: list[str] | None = None, version: int = 4,
             synonyms: bool = False, docs: bool = False) -> Any:
    R = M.DescribeConfigsRequest
    request = R(resources=[R.DescribeConfigsResource(resource_type=rtype, resource_name=name, configuration_keys=keys)],
                include_synonyms=synonyms, include_documentation=docs)
    (result,) = c.call(DESCRIBE_CONFIGS, version, request).results
    return result


def entries(result: Any) -> dict[str, Any]:
    return {e.name: e for e in result.configs}


def alter(c: RawClient, rtype: int, name: str, configs: dict[str, str | None], version: int = 2,
          validate_only: bool = False) -> Any:
    R = M.AlterConfigsRequest
    resource = R.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=[
        R.AlterableConfig(name=k, value=v) for k, v in configs.items()])
    (response,) = c.call(ALTER_CONFIGS, version, R(resources=[resource], validate_only=validate_only)).responses
    return response


def incremental(c: RawClient, rtype: int, name: str, ops: list[tuple[str, int, str | None]], version: int = 1,
                validate_only: bool = False) -> Any:
    R = M.IncrementalAlterConfigsRequest
    resource = R.AlterConfigsResource(resource_type=rtype, resource_name=name, configs=[
        R.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])
    request = R(resources=[resource], validate_only=validate_only)
    (response,) = c.call(INCREMENTAL_ALTER_CONFIGS, version, request).responses
    return response


def error_of(response: Any) -> tuple[int, str | None]:
    return response.error_code, response.error_message


# -- DescribeConfigs -------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(1, 5))
def test_describe_topic_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("d", 1, {"retention.ms": "1000", "cleanup.policy": "compact"})
    result = describe(client, TOPIC, "d", version=version, synonyms=True, docs=True)
    assert (result.error_code, result.resource_type, result.resource_name) == (0, TOPIC, "d")
    got = entries(result)
    retention = got["retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only, retention.is_sensitive) == (
        "1000", 1, False, False)
    assert [(s.name, s.value, s.source) for s in retention.synonyms] == [("retention.ms", "1000", 1)]
    segment = got["segment.bytes"]
    assert (segment.value, segment.config_source) == ("1073741824", 5)
    assert [(s.name, s.value, s.source) for s in segment.synonyms] == [("log.segment.bytes", "1073741824", 5)]
    assert got["max.message.bytes"].synonyms[0].name == "message.max.bytes"
    assert "message.downconversion.enable" not in got  # gone in Kafka 4
    assert len(got) == 33
    if version >= 3:
        assert (retention.config_type, got["cleanup.policy"].config_type, got["preallocate"].config_type) == (5, 7, 1)
        assert retention.documentation
    plain = describe(client, TOPIC, "d", version=version)
    assert all(e.synonyms == [] for e in plain.configs)
    if version >= 3:
        assert all(e.documentation is None for e in plain.configs)


def test_describe_topic_synonym_order(tmp_path: Path) -> None:
    with BrokerThread(tmp_path, log_retention_hours="2", log_segment_bytes="2097152") as bt:
        bt.create_topic("s", 1)
        c = bt.client()
        got = entries(describe(c, TOPIC, "s", synonyms=True))
        # log.retention.ms is unset: Kafka lists no synonym for retention.ms, so its source is the default
        # one although the value comes from log.retention.hours
        assert (got["retention.ms"].value, got["retention.ms"].config_source) == ("7200000", 5)
        assert got["retention.ms"].synonyms == []
        assert [(s.name, s.value, s.source) for s in got["segment.bytes"].synonyms] == [
            ("log.segment.bytes", "2097152", 4), ("log.segment.bytes", "1073741824", 5)]
        assert got["segment.bytes"].config_source == 4
        assert bt.broker.partitions.get("s", 0).log.config.retention_ms == 7_200_000
        # CreateTopics v5+ resolves every config to the synonym that supplied it
        R = M.CreateTopicsRequest
        topic = R.CreatableTopic(name="s2", num_partitions=1, replication_factor=1, assignments=[], configs=[])
        (created,) = c.call(19, 7, R(topics=[topic], timeout_ms=1000, validate_only=True)).topics
        sources = {x.name: (x.value, x.config_source) for x in created.configs}
        assert sources["retention.ms"] == ("7200000", 4)
        assert sources["segment.bytes"] == ("2097152", 4)
        assert sources["flush.ms"] == ("9223372036854775807", 5)
        c.close()


def test_describe_filters_and_errors(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("f", 1)
    only = describe(client, TOPIC, "f", keys=["retention.ms", "nope"])
    assert [e.name for e in only.configs] == ["retention.ms"]
    assert [e.name for e in describe(client, TOPIC, "f", keys=[]).configs] == [e.name for e in
                                                                                 describe(client, TOPIC, "f").configs]
    missing = describe(client, TOPIC, "missing")
    assert (missing.error_code, missing.configs, missing.resource_name) == (
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, [], "missing")
    bad = describe(client, TOPIC, "bad name")
    assert bad.error_code == ErrorCode.INVALID_TOPIC_EXCEPTION
    other = describe(client, BROKER, "2")
    assert error_of(other) == (ErrorCode.INVALID_REQUEST,
                               "Unexpected broker id, expected 1 or empty string, but received 2")
    assert error_of(describe(client, BROKER, "x")) == (ErrorCode.INVALID_REQUEST,
                                                       "Broker id must be an integer, but it is: x")
    logger = describe(client, BROKER_LOGGER, "1")
    assert error_of(logger) == (ErrorCode.INVALID_REQUEST, "Unsupported resource type: BROKER_LOGGER")


@pytest.mark.parametrize("version", range(1, 5))
def test_describe_broker_every_version(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    result = describe(client, BROKER, "1", version=version, synonyms=True, docs=True)
    assert result.error_code == 0
    got = entries(result)
    listeners = got["listeners"]
    # listeners are dynamic in Kafka 4.x (DynamicListenerConfig); log.dirs is not
    assert (listeners.value, listeners.config_source, listeners.read_only) == ("PLAINTEXT://127.0.0.1:0", 4, False)
    assert got["log.dirs"].read_only
    hours = got["log.retention.hours"]
    assert (hours.value, hours.config_source, hours.read_only) == ("168", 5, True)
    retention = got["log.retention.ms"]
    assert (retention.value, retention.config_source, retention.read_only) == (None, 5, False)
    assert got["num.partitions"].read_only
    assert not got["message.max.bytes"].read_only
    if version >= 3:
        assert (got["log.retention.ms"].config_type, got["listeners"].config_type) == (5, 7)
        assert got["num.partitions"].documentation
    # a new cluster holds min.insync.replicas as a cluster-level dynamic default (KIP-966, Kafka 4.1+)
    (min_isr,) = describe(client, BROKER, "", version=version).configs
    assert (min_isr.name, min_isr.value, min_isr.config_source) == ("min.insync.replicas", "1", 3)
    assert (got["min.insync.replicas"].value, got["min.insync.replicas"].config_source) == ("1", 3)


# -- AlterConfigs ------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(0, 3))
def test_alter_topic_replaces_the_set(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("a", 1, {"retention.ms": "1000", "cleanup.policy": "compact"})
    response = alter(client, TOPIC, "a", {"max.message.bytes": "200"}, version)
    assert (response.error_code, response.error_message, response.resource_name) == (0, None, "a")
    assert broker_thread.broker.metadata.topic("a").configs == {"max.message.bytes": "200"}
    config = broker_thread.broker.partitions.get("a", 0).log.config
    assert (config.max_message_bytes, config.retention_ms, config.cleanup_policy) == (200, 604800000, ("delete",))
    too_big = produce(client, "a", 0, batch([b"x" * 500]))
    assert too_big.error_code == ErrorCode.MESSAGE_TOO_LARGE
    got = entries(describe(client, TOPIC, "a"))
    assert (got["max.message.bytes"].value, got["max.message.bytes"].config_source) == ("200", 1)
    assert got["retention.ms"].config_source == 5


def test_alter_topic_validation(broker_thread: BrokerThread, client: RawClient) -> None:
    broker_thread.create_topic("v", 1, {"retention.ms": "1000"})
    dry = alter(client, TOPIC, "v", {"retention.ms": "5"}, validate_only=True)
    assert dry.error_code == 0
    assert broker_thread.broker.metadata.topic("v").configs == {"retention.ms": "1000"}
    cases: list[tuple[str, dict[str, str | None], int, str | None]] = [
        ("v", {"retention.ms": "never"}, ErrorCode.INVALID_CONFIG, None),
        ("v", {"unknown.thing": "1"}, ErrorCode.INVALID_CONFIG, "Unknown topic config name: unknown.thing"),
        ("v", {"retention.ms": None}, ErrorCode.INVALID_REQUEST, "Null value not supported for : retention.ms"),
        ("missing", {"retention.ms": "1"}, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "The topic 'missing' does not exist."),
        ("", {"retention.ms": "1"}, ErrorCode.INVALID_REQUEST, "Default topic resources are not allowed."),
    ]
    for name, configs, code, message in cases:
        response = alter(client, TOPIC, name, configs)
        assert response.error_code == code, (name, configs, response)
        assert message is None or response.error_message == message
    assert broker_thread.broker.metadata.topic("v").configs == {"retention.ms": "1000"}
    R = M.AlterConfigsRequest
    twice = R.AlterConfigsResource(resource_type=TOPIC, resource_name="v", configs=[])
    response = client.call(ALTER_CONFIGS, 2, R(resources=[twice, twice], validate_only=False))
    assert [error_of(r) for r in response.responses] == [
        (ErrorCode.INVALID_REQUEST, "Each resource must appear at most once.")] * 2
    weird = R.AlterConfigsResource(resource_type=BROKER_LOGGER, resource_name="1", configs=[])
    (response,) = client.call(ALTER_CONFIGS, 2, R(resources=[weird], validate_only=False)).responses
    assert error_of(response) == (ErrorCode.INVALID_REQUEST, "Unknown resource type 8")


# -- IncrementalAlterConfigs -------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(0, 2))
def test_incremental_topic_ops(broker_thread: BrokerThread, client: RawClient, version: int) -> None:
    broker_thread.create_topic("i", 1, {"retention.ms": "1000"})
    response = incremental(client, TOPIC, "i", [("cleanup.policy", APPEND, "compact"), ("segment.ms", SET, "5000")],
                           version)
    assert error_of(response) == (0, None)
    topic = broker_thread.broker.metadata.topic("i")
    assert topic.configs == {"retention.ms": "1000", "cleanup.policy": "delete,compact", "segment.ms": "5000"}
    assert broker_thread.broker.partitions.get("i", 0).log.config.cleanup_policy == ("delete", "compact")
    response = incremental(client, TOPIC, "i", [("cleanup.policy", SUBTRACT, "delete"), ("retention.ms", DELETE, None)],
                           version)
    assert response.error_code == 0
    assert topic.configs == {"cleanup.policy": "compact", "segment.ms": "5000"}
    log_config = broker_thread.broker.partitions.get("i", 0).log.config
    assert (log_config.cleanup_policy, log_config.retention_ms, log_config.segment_ms) == (
        ("compact",), 604800000, 5000)
    not_list = incremental(client, TOPIC, "i", [("retention.ms", APPEND, "5")], version)
    assert error_of(not_list) == (ErrorCode.INVALID_CONFIG,
                                  "Can't APPEND to key retention.ms because its type is not LIST.")
    null = incremental(client, TOPIC, "i", [("retention.ms", SET, None)], version)
    assert error_of(null) == (ErrorCode.INVALID_REQUEST, "Null value not supported for : retention.ms")
    dup = incremental(client, TOPIC, "i", [("retention.ms", SET, "1"), ("retention.ms", DELETE, None)], version)
    assert error_of(dup) == (ErrorCode.INVALID_REQUEST, "Error due to duplicate config keys")
    bad_op = incremental(client, TOPIC, "i", [("retention.ms", 9, "1")], version)
    assert bad_op.error_code == ErrorCode.INVALID_REQUEST
    invalid = incremental(client, TOPIC, "i", [("segment.bytes", SET, "1")], version)
    assert invalid.error_code == ErrorCode.INVALID_CONFIG
    dry = incremental(client, TOPIC, "i", [("segment.ms", DELETE, None)], version, validate_only=True)
    assert dry.error_code == 0 and topic.configs["segment.ms"] == "5000"


def test_dynamic_broker_configs(broker_thread: BrokerThread, client: RawClient) -> None:
    broker = broker_thread.broker
    broker_thread.create_topic("plain", 1)
    broker_thread.create_topic("own", 1, {"max.message.bytes": "100000"})
    response = incremental(client, BROKER, "", [("message.max.bytes", SET, "300"), ("log.retention.ms", SET, "60000")])
    assert error_of(response) == (0, None)
    assert broker.partitions.get("plain", 0).log.config.max_message_bytes == 300
    assert broker.partitions.get("own", 0).log.config.max_message_bytes == 100000
    assert produce(client, "plain", 0, batch([b"x" * 1000])).error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert produce(client, "own", 0, batch([b"x" * 1000])).error_code == 0
    # a per-broker value wins over the cluster-wide one
    assert incremental(client, BROKER, "1", [("message.max.bytes", SET, "5000")]).error_code == 0
    assert broker.partitions.get("plain", 0).log.config.max_message_bytes == 5000
    got = entries(describe(client, BROKER, "1", synonyms=True))
    assert (got["message.max.bytes"].value, got["message.max.bytes"].config_source) == ("5000", 2)
    assert [(s.name, s.value, s.source) for s in got["message.max.bytes"].synonyms] == [
        ("message.max.bytes", "5000", 2), ("message.max.bytes", "300", 3), ("message.max.bytes", "1048588", 5)]
    cluster = entries(describe(client, BROKER, "", synonyms=True))
    assert set(cluster) == {"message.max.bytes", "log.retention.ms", "min.insync.replicas"}
    assert [(s.source) for s in cluster["message.max.bytes"].synonyms] == [3]
    topic = entries(describe(client, TOPIC, "plain", synonyms=True))
    assert (topic["max.message.bytes"].value, topic["max.message.bytes"].config_source) == ("5000", 2)
    assert (topic["retention.ms"].value, topic["retention.ms"].config_source) == ("60000", 3)
    # a new topic follows the dynamic defaults too
    broker_thread.create_topic("later", 1)
    assert broker.partitions.get("later", 0).log.config.retention_ms == 60000
    # deleting the per-broker value falls back to the cluster-wide one
    assert incremental(client, BROKER, "1", [("message.max.bytes", DELETE, None)]).error_code == 0
    assert broker.partitions.get("plain", 0).log.config.max_message_bytes == 300
    # the legacy API replaces the whole cluster-wide set, which must keep min.insync.replicas (ELR)
    assert error_of(alter(client, BROKER, "", {"log.cleanup.policy": "compact"})) == (
        ErrorCode.INVALID_CONFIG, "Cluster-level min.insync.replicas cannot be removed while ELR is enabled.")
    assert alter(client, BROKER, "", {"log.cleanup.policy": "compact", "min.insync.replicas": "1"}).error_code == 0
    assert broker.config.dynamic_default == {"log.cleanup.policy": "compact", "min.insync.replicas": "1"}
    assert broker.partitions.get("plain", 0).log.config.max_message_bytes == 1048588
    assert incremental(client, BROKER, "", [("log.cleanup.policy", APPEND, "delete")]).error_code == 0
    assert broker.config.dynamic_default == {"log.cleanup.policy": "compact,delete", "min.insync.replicas": "1"}


def test_dynamic_broker_config_errors(broker_thread: BrokerThread, client: RawClient) -> None:
    cases: list[tuple[str, list[tuple[str, int, str | None]], int, str | None]] = [
        ("1", [("num.partitions", SET, "3")], ErrorCode.INVALID_REQUEST,
         "Cannot update these configs dynamically: Set(num.partitions)"),
        ("", [("node.id", SET, "7"), ("log.dirs", SET, "/x")], ErrorCode.INVALID_REQUEST,
         "Cannot update these configs dynamically: Set(log.dirs, node.id)"),
        ("1", [("log.roll.hours", SET, "2")], ErrorCode.INVALID_REQUEST,  # only a topic config's first synonym
         "Cannot update these configs dynamically: Set(log.roll.hours)"),
        ("1", [("ssl.keystore.location", SET, "/k.pem")], ErrorCode.INVALID_REQUEST,
         "These security configs can be dynamically updated only per-listener using the listener prefix: "
         "Set(ssl.keystore.location)"),
        ("", [("sasl.kerberos.min.time.before.relogin", SET, "60000")], ErrorCode.INVALID_REQUEST,
         "Cannot update these configs at default cluster level, broker id must be specified: "
         "Set(sasl.kerberos.min.time.before.relogin)"),
        ("", [("listener.name.external.ssl.keystore.location", SET, "/k.pem")], ErrorCode.INVALID_REQUEST,
         "Cannot update these configs at default cluster level, broker id must be specified: "
         "Set(listener.name.external.ssl.keystore.location)"),
        ("1", [("log.retention.ms", SET, "soon")], ErrorCode.INVALID_REQUEST,
         "Invalid value soon for configuration log.retention.ms: Not a number of type LONG"),
        ("1", [("log.segment.bytes", SET, "10")], ErrorCode.INVALID_REQUEST, None),
        ("1", [("log.preallocate", SET, "maybe")], ErrorCode.INVALID_REQUEST, None),
        ("1", [("log.retention.ms", APPEND, "1")], ErrorCode.INVALID_CONFIG,
         "Config value append is not allowed for config key: log.retention.ms"),
        ("2", [("log.retention.ms", SET, "1")], ErrorCode.INVALID_REQUEST,
         "Unexpected broker id, expected 1, but received 2"),
        ("x", [("log.retention.ms", SET, "1")], ErrorCode.INVALID_REQUEST, "Node id must be an integer, but it is: x"),
        ("1", [("min.insync.replicas", SET, "2")], ErrorCode.INVALID_CONFIG,
         "Broker-level min.insync.replicas cannot be altered while ELR is enabled."),
        ("", [("min.insync.replicas", DELETE, None)], ErrorCode.INVALID_CONFIG,
         "Cluster-level min.insync.replicas cannot be removed while ELR is enabled."),
    ]
    for name, ops, code, message in cases:
        response = incremental(client, BROKER, name, ops)
        assert response.error_code == code, (name, ops, response)
        assert message is None or response.error_message == message, response
    assert incremental(client, BROKER, "1", [("log.retention.ms", SET, "1")], validate_only=True).error_code == 0
    assert broker_thread.broker.metadata.image.broker_configs == {"": {"min.insync.replicas": "1"}}
    assert broker_thread.broker.config.dynamic_broker == {}


def test_kafkas_dynamic_listener_and_sasl_configs_are_accepted(broker_thread: BrokerThread, client: RawClient) -> None:
    # DynamicListenerConfig: SASL and listener settings per broker, stores per listener, cluster-level limits
    for name, ops in [
        ("1", [("sasl.kerberos.min.time.before.relogin", SET, "60000")]),
        ("1", [("listener.name.external.ssl.keystore.location", SET, "/k.pem")]),
        ("", [("max.connections", SET, "1000"), ("num.io.threads", SET, "8")]),
        ("1", [("some.custom.config", SET, "x")]),  # a name Kafka does not know is stored
    ]:
        response = incremental(client, BROKER, name, ops)
        assert response.error_code == 0, response
    assert broker_thread.broker.config.dynamic_broker == {
        "sasl.kerberos.min.time.before.relogin": "60000", "listener.name.external.ssl.keystore.location": "/k.pem",
        "some.custom.config": "x"}
    got = {c.name: c for c in describe(client, BROKER, "1", ["sasl.kerberos.min.time.before.relogin"]).configs}
    relogin = got["sasl.kerberos.min.time.before.relogin"]
    assert (relogin.value, relogin.read_only, relogin.config_source) == ("60000", False, 2)  # DYNAMIC_BROKER_CONFIG


@pytest.fixture
def restartable(tmp_path: Path) -> Iterator[list[BrokerThread]]:
    threads = [BrokerThread(tmp_path).start()]
    try:
        yield threads
    finally:
        threads[-1].close()


def test_configs_survive_restart(restartable: list[BrokerThread]) -> None:
    first = restartable[0]
    c = first.client()
    first.create_topic("kept", 2)
    assert alter(c, TOPIC, "kept", {"max.message.bytes": "200", "retention.ms": "123456"}).error_code == 0
    assert incremental(c, BROKER, "", [("log.segment.bytes", SET, "2097152")]).error_code == 0
    assert incremental(c, BROKER, "1", [("log.retention.bytes", SET, "99999")]).error_code == 0
    c.close()
    first.close()
    second = BrokerThread(first.tmp_path).start()
    restartable.append(second)
    log_config = second.broker.partitions.get("kept", 1).log.config
    assert (log_config.max_message_bytes, log_config.retention_ms) == (200, 123456)
    assert (log_config.segment_bytes, log_config.retention_bytes) == (2097152, 99999)
    c = second.client()
    assert produce(c, "kept", 1, batch([b"x" * 500])).error_code == ErrorCode.MESSAGE_TOO_LARGE
    got = entries(describe(c, TOPIC, "kept"))
    assert (got["segment.bytes"].value, got["segment.bytes"].config_source) == ("2097152", 3)
    assert (got["retention.bytes"].value, got["retention.bytes"].config_source) == ("99999", 2)
    assert got["max.message.bytes"].config_source == 1
    c.close()
