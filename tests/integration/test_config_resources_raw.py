"""CLIENT_METRICS config resources, ListConfigResources and client telemetry with raw frames:
subscriptions stored and described as Kafka does, every resource type listed, a pushed payload
exposed on /metrics with the client's labels."""

from __future__ import annotations

import urllib.request
import uuid
from pathlib import Path
from typing import Any

from protocol import messages as M
from protocol.compression import compress
from protocol.errors import ErrorCode
from tests.harness import RawClient, free_port
from tests.integration.test_server_support import API_VERSIONS, BrokerThread

DESCRIBE_CONFIGS, ALTER_CONFIGS, INCREMENTAL_ALTER_CONFIGS, LIST_CONFIG_RESOURCES = 32, 33, 44, 74
GET_SUBSCRIPTIONS, PUSH = 71, 72
CLIENT_METRICS, SET, DELETE, APPEND = 16, 0, 1, 2


def incremental(c: RawClient, name: str, ops: list[tuple[str, int, str | None]]) -> Any:
    R = M.IncrementalAlterConfigsRequest
    resource = R.AlterConfigsResource(resource_type=CLIENT_METRICS, resource_name=name, configs=[
        R.AlterableConfig(name=k, config_operation=op, value=v) for k, op, v in ops])
    (response,) = c.call(INCREMENTAL_ALTER_CONFIGS, 1, R(resources=[resource], validate_only=False)).responses
    return response


def describe(c: RawClient, name: str) -> Any:
    R = M.DescribeConfigsRequest
    request = R(resources=[R.DescribeConfigsResource(resource_type=CLIENT_METRICS, resource_name=name,
                                                     configuration_keys=None)], include_synonyms=False)
    (result,) = c.call(DESCRIBE_CONFIGS, 4, request).results
    return result


def listed(c: RawClient, version: int, types: list[int] | None = None) -> Any:
    return c.call(LIST_CONFIG_RESOURCES, version, M.ListConfigResourcesRequest(resource_types=types or []))


def test_client_metrics_resources_and_listing(tmp_path: Path) -> None:
    bt = BrokerThread(tmp_path).start()
    c = bt.client()
    try:
        bt.create_topic("t1", 1)
        ok = incremental(c, "producers", [("metrics", SET, "org.apache.kafka.producer."), ("interval.ms", SET, "1000"),
                                          ("match", SET, "client_id=app.*")])
        assert (ok.error_code, ok.error_message) == (0, None)
        assert incremental(c, "producers", [("metrics", APPEND, "org.apache.kafka.consumer.")]).error_code == 0
        got = describe(c, "producers")
        assert got.error_code == 0
        assert [(e.name, e.value, e.config_source) for e in got.configs] == [
            ("interval.ms", "1000", 7), ("match", "client_id=app.*", 7),
            ("metrics", "org.apache.kafka.producer.,org.apache.kafka.consumer.", 7)]
        assert describe(c, "unknown").configs == []
        assert describe(c, "").error_code == ErrorCode.INVALID_REQUEST
        for ops, code in [([("color", SET, "red")], ErrorCode.INVALID_REQUEST),
                          ([("interval.ms", SET, "10")], ErrorCode.INVALID_REQUEST),
                          ([("match", SET, "nope=.*")], ErrorCode.INVALID_CONFIG),
                          ([("interval.ms", APPEND, "5")], ErrorCode.INVALID_CONFIG)]:
            assert incremental(c, "producers", ops).error_code == code, ops
        assert incremental(c, "", [("metrics", SET, "*")]).error_code == ErrorCode.INVALID_REQUEST
        # the legacy API replaces the set
        R = M.AlterConfigsRequest
        legacy = R(validate_only=False, resources=[R.AlterConfigsResource(
            resource_type=CLIENT_METRICS, resource_name="all", configs=[R.AlterableConfig(name="metrics", value="*")])])
        assert c.call(ALTER_CONFIGS, 2, legacy).responses[0].error_code == 0
        v0 = listed(c, 0)
        assert (v0.error_code, sorted(r.resource_name for r in v0.config_resources)) == (0, ["all", "producers"])
        v1 = listed(c, 1)
        assert [(r.resource_type, r.resource_name) for r in v1.config_resources] == [
            (16, "producers"), (16, "all"), (8, "1"), (4, "1"), (2, "t1")]
        assert [r.resource_name for r in listed(c, 1, [2]).config_resources] == ["t1"]
        assert listed(c, 1, [99]).error_code == ErrorCode.UNSUPPORTED_VERSION
        # a subscription whose configs are all deleted is gone
        assert incremental(c, "all", [("metrics", DELETE, None)]).error_code == 0
        assert [r.resource_name for r in listed(c, 0).config_resources] == ["producers"]
    finally:
        c.close()
        bt.stop()
    with BrokerThread(tmp_path) as again:
        c = again.client()
        assert [r.resource_name for r in listed(c, 0).config_resources] == ["producers"]
        c.close()


def test_pushed_metrics_on_the_metrics_endpoint(tmp_path: Path) -> None:
    from broker.observability.telemetry.otlp import GAUGE, Point, encode_metrics_data

    port = free_port()
    bt = BrokerThread(tmp_path, **{"metrics.port": str(port)}).start()
    c = bt.client("telemetry-test")
    try:
        assert incremental(c, "all", [("metrics", SET, "*"), ("interval.ms", SET, "100")]).error_code == 0
        c.call(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="raw-client", client_software_version="9.9"))
        got = c.call(GET_SUBSCRIPTIONS, 0, M.GetTelemetrySubscriptionsRequest(client_instance_id=uuid.UUID(int=0)))
        assert (got.error_code, got.requested_metrics, got.push_interval_ms, got.delta_temporality) == (
            0, ["*"], 100, True)
        assert got.accepted_compression_types == [4, 3, 1, 2] and got.telemetry_max_bytes == 1048576
        payload = encode_metrics_data({}, [Point("org.apache.kafka.producer.io.wait.ratio", GAUGE, 0.5,
                                                 (("node.id", "1"),), 1)])
        R = M.PushTelemetryRequest
        pushed = c.call(PUSH, 0, R(client_instance_id=got.client_instance_id, subscription_id=got.subscription_id,
                                   terminating=False, compression_type=3, metrics=compress(3, payload)))
        assert pushed.error_code == 0
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % port, timeout=10).read().decode()
        line = next(x for x in text.splitlines() if x.startswith("org_apache_kafka_producer_io_wait_ratio{"))
        for label in ('client_id="telemetry-test"', 'client_software_name="raw-client"',
                      'client_software_version="9.9"', 'client_source_address="127.0.0.1"', 'node_id="1"'):
            assert label in line
        assert line.endswith(" 0.5")
        bad = c.call(PUSH, 0, R(client_instance_id=got.client_instance_id, subscription_id=got.subscription_id + 1,
                                terminating=True, compression_type=0, metrics=b""))
        assert bad.error_code == ErrorCode.UNKNOWN_SUBSCRIPTION_ID
    finally:
        c.close()
        bt.stop()
