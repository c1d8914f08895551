"""Fault injection seen in raw frames: which entries fail and how, what the handler still serves,
counting, the HTTP door and the command-line door. Real clients: tests/compat/test_faults_*.py."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.testing import EmbeddedBroker
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import BrokerProcess, RawClient, free_port
from tests.integration.test_server_support import (
    FETCH,
    METADATA,
    batch,
    fetch_request,
    metadata,
    produce,
    produce_request,
)

E = ErrorCode
PRODUCE, OFFSET_COMMIT, OFFSET_FETCH, FIND_COORDINATOR, JOIN_GROUP, DESCRIBE_GROUPS = 0, 8, 9, 10, 11, 15
LIST_OFFSETS = 2


@pytest.fixture(scope="module")
def kafka() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker({"offsets.topic.num.partitions": 1, "metrics.port": 0}) as broker:
        broker.create_topic("t", 2)
        yield broker


@pytest.fixture
def client(kafka: EmbeddedBroker) -> Iterator[RawClient]:
    kafka.faults.clear()
    c = RawClient(kafka.port)
    yield c
    c.close()
    kafka.faults.clear()


def produce_two(client: RawClient, version: int = 9) -> dict[int, Any]:
    R = M.ProduceRequest
    request = R(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[R.TopicProduceData(
        name="t", partition_data=[R.PartitionProduceData(index=p, records=batch([b"v%d" % p])) for p in (0, 1)])])
    response = client.call(PRODUCE, version, request)
    return {p.index: p for t in response.responses for p in t.partition_responses}


def end_offset(client: RawClient, partition: int) -> int:
    R = M.ListOffsetsRequest
    request = R(replica_id=-1, isolation_level=0, topics=[R.ListOffsetsTopic(name="t", partitions=[
        R.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1, timestamp=-1)])])
    return int(client.call(LIST_OFFSETS, 7, request).topics[0].partitions[0].offset)


def test_only_the_named_partition_fails_and_nothing_is_written_for_it(kafka: EmbeddedBroker, client: RawClient) -> None:
    before = end_offset(client, 0), end_offset(client, 1)
    fault = kafka.faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=2, topic="t", partition=0)
    for _ in range(2):
        answers = produce_two(client)
        assert answers[0].error_code == E.NOT_LEADER_OR_FOLLOWER and answers[0].base_offset == -1
        assert answers[1].error_code == 0
    assert (fault.times, fault.injected) == (0, 2) and kafka.faults.armed == []
    assert all(p.error_code == 0 for p in produce_two(client).values())  # used up
    assert (end_offset(client, 0), end_offset(client, 1)) == (before[0] + 1, before[1] + 3)


def test_a_whole_fetch_fails_with_unknown_offsets_and_empty_records(kafka: EmbeddedBroker, client: RawClient) -> None:
    kafka.faults.fail("Fetch", "UNKNOWN_TOPIC_OR_PARTITION")
    response = client.call(FETCH, 12, fetch_request([("t", 0, 0), ("t", 1, 0)], max_wait_ms=5000, min_bytes=10**6))
    assert response.error_code == 0
    [topic] = response.responses
    assert [(p.partition_index, p.error_code, p.high_watermark, bytes(p.records)) for p in topic.partitions] == [
        (0, E.UNKNOWN_TOPIC_OR_PARTITION, -1, b""), (1, E.UNKNOWN_TOPIC_OR_PARTITION, -1, b"")]


def test_a_fetch_with_a_failed_partition_answers_at_once(kafka: EmbeddedBroker, client: RawClient) -> None:
    kafka.faults.fail("Fetch", "NOT_LEADER_OR_FOLLOWER", topic="t", partition=1)
    # min_bytes out of reach: without the failure it would wait the full 30 s (longer than the socket timeout)
    response = client.call(FETCH, 12, fetch_request([("t", 0, 10**6), ("t", 1, 0)], max_wait_ms=30000,
                                                    min_bytes=10**9))
    by_partition = {p.partition_index: p for p in response.responses[0].partitions}
    assert by_partition[1].error_code == E.NOT_LEADER_OR_FOLLOWER
    assert by_partition[0].error_code == E.OFFSET_OUT_OF_RANGE  # served by the handler


def find_coordinator(client: RawClient, group: str, version: int = 3) -> Any:
    if version >= 4:
        return client.call(FIND_COORDINATOR, version, M.FindCoordinatorRequest(key_type=0, coordinator_keys=[group]))
    return client.call(FIND_COORDINATOR, version, M.FindCoordinatorRequest(key=group, key_type=0))


def commit(client: RawClient, group: str, version: int = 8) -> Any:
    R = M.OffsetCommitRequest
    return client.call(OFFSET_COMMIT, version, R(group_id=group, generation_id_or_member_epoch=-1, member_id="",
                                                 topics=[R.OffsetCommitRequestTopic(name="t", partitions=[
                                                     R.OffsetCommitRequestPartition(partition_index=p,
                                                                                    committed_offset=1)
                                                     for p in (0, 1)])]))


def offset_fetch(client: RawClient, group: str, version: int) -> Any:
    R = M.OffsetFetchRequest
    if version >= 8:
        request = R(groups=[R.OffsetFetchRequestGroup(group_id=group, topics=[
            R.OffsetFetchRequestTopics(name="t", partition_indexes=[0, 1])])], require_stable=False)
    else:
        request = R(group_id=group, topics=[R.OffsetFetchRequestTopic(name="t", partition_indexes=[0, 1])],
                    require_stable=False)
    return client.call(OFFSET_FETCH, version, request)


def test_group_errors_go_where_kafka_puts_them(kafka: EmbeddedBroker, client: RawClient) -> None:
    assert find_coordinator(client, "g").error_code == 0
    faults = kafka.faults
    faults.fail("OffsetCommit", "COORDINATOR_LOAD_IN_PROGRESS", group="g")
    assert commit(client, "other").topics[0].partitions[0].error_code == 0  # another group: served
    assert {p.error_code for p in commit(client, "g").topics[0].partitions} == {E.COORDINATOR_LOAD_IN_PROGRESS}
    faults.fail("OffsetFetch", "NOT_COORDINATOR", times=2, group="g")
    v5 = offset_fetch(client, "g", 5)
    assert v5.error_code == E.NOT_COORDINATOR and v5.topics == []  # a top-level error from v2 on
    v8 = offset_fetch(client, "g", 8)
    assert [(g.group_id, g.error_code) for g in v8.groups] == [("g", E.NOT_COORDINATOR)]
    faults.fail("FindCoordinator", "COORDINATOR_NOT_AVAILABLE", times=2)
    old = find_coordinator(client, "g")
    assert (old.error_code, old.node_id, old.port) == (E.COORDINATOR_NOT_AVAILABLE, -1, -1)
    [entry] = find_coordinator(client, "g", 4).coordinators
    assert (entry.key, entry.error_code, entry.node_id) == ("g", E.COORDINATOR_NOT_AVAILABLE, -1)
    faults.fail("DescribeGroups", "COORDINATOR_LOAD_IN_PROGRESS", group="b")
    groups = client.call(DESCRIBE_GROUPS, 5, M.DescribeGroupsRequest(groups=["a", "b"], include_authorized_operations=False))
    assert sorted((g.group_id, g.error_code) for g in groups.groups) == [("a", 0), ("b", E.COORDINATOR_LOAD_IN_PROGRESS)]
    faults.fail("JoinGroup", "REBALANCE_IN_PROGRESS")
    join = client.call(JOIN_GROUP, 5, M.JoinGroupRequest(
        group_id="j", session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="", protocol_type="consumer",
        protocols=[M.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]))
    assert join.error_code == E.REBALANCE_IN_PROGRESS
    assert faults.armed == []


def test_metadata_faults_look_at_the_answer(kafka: EmbeddedBroker, client: RawClient) -> None:
    kafka.faults.fail("Metadata", "LEADER_NOT_AVAILABLE", topic="t", partition=1)
    everything = metadata(client, None)
    [t] = [t for t in everything.topics if t.name == "t"]
    assert [(p.partition_index, p.error_code, p.leader_id) for p in t.partitions] == [
        (0, 0, kafka.broker.node_id), (1, E.LEADER_NOT_AVAILABLE, -1)]
    kafka.faults.fail("Metadata", "UNKNOWN_TOPIC_OR_PARTITION", topic="t")
    assert metadata(client, ["nothing-here"], allow_auto=False).topics[0].name == "nothing-here"  # not hit
    [t] = metadata(client, ["t"]).topics
    assert (t.error_code, t.partitions) == (E.UNKNOWN_TOPIC_OR_PARTITION, [])


def test_delay_disconnect_and_drop(kafka: EmbeddedBroker, client: RawClient) -> None:
    faults = kafka.faults
    faults.delay("Metadata", 300)
    started = time.monotonic()
    metadata(client, [])
    assert time.monotonic() - started >= 0.3
    faults.disconnect("Produce")
    client.send(PRODUCE, 9, produce_request("t", 0, batch([b"x"])))
    assert client.is_closed()
    other = RawClient(kafka.port)
    faults.drop("Metadata")
    other.send(METADATA, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False))
    dropped = other.correlation_id
    assert not other.is_closed(timeout=0.3)  # no answer, connection open
    # the next request is answered; the dropped one never is
    assert produce(other, "t", 0, batch([b"y"])).error_code == 0
    assert dropped != other.correlation_id
    other.close()


def test_fail_disk(kafka: EmbeddedBroker, client: RawClient) -> None:
    with pytest.raises(ValueError):
        kafka.faults.fail_disk("no-such-topic", 0)
    fault = kafka.faults.fail_disk("t", 1, times=2)
    answers = [produce_two(client) for _ in range(3)]
    assert [a[1].error_code for a in answers] == [E.KAFKA_STORAGE_ERROR, E.KAFKA_STORAGE_ERROR, 0]
    assert [a[0].error_code for a in answers] == [0, 0, 0]
    assert fault.injected == 2 and kafka.faults.armed == []


def test_arguments_are_checked(kafka: EmbeddedBroker) -> None:
    faults = kafka.faults
    for bad in (lambda: faults.fail("Produc", "NOT_LEADER_OR_FOLLOWER"),
                lambda: faults.fail("Produce", "NOT_AN_ERROR"),
                lambda: faults.fail("Produce", "NONE"),
                lambda: faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", times=0),
                lambda: faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", partition=0),
                lambda: faults.fail("Produce", "NOT_LEADER_OR_FOLLOWER", group="g"),
                lambda: faults.fail("ApiVersions", "UNSUPPORTED_VERSION", topic="t"),
                lambda: faults.delay("Fetch", -1),
                lambda: faults.arm({"action": "explode", "api": "Fetch"}),
                lambda: faults.arm({"api": "Fetch"}),
                lambda: faults.arm({"api": "Fetch", "error": "NOT_LEADER_OR_FOLLOWER", "colour": "red"})):
        with pytest.raises(ValueError):
            bad()
    assert faults.armed == []


def http(kafka: EmbeddedBroker, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    assert kafka.broker.http is not None
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request("http://127.0.0.1:%d%s" % (kafka.broker.http.port, path), data=data,
                                     method=method)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            payload = r.read()
            return r.status, json.loads(payload) if r.headers["Content-Type"] == "application/json" else payload
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def produce_failures(kafka: EmbeddedBroker) -> int:
    return sum(i["count"] for i in http(kafka, "GET", "/faults")[1]["injected"]
               if (i["api"], i["action"], i["error"]) == ("Produce", "fail", "NOT_LEADER_OR_FOLLOWER"))


def test_the_http_door(kafka: EmbeddedBroker, client: RawClient) -> None:
    before = produce_failures(kafka)
    status, body = http(kafka, "POST", "/faults", {"api": "Produce", "error": "NOT_LEADER_OR_FOLLOWER", "times": 2})
    assert status == 201 and body["armed"]["error"] == "NOT_LEADER_OR_FOLLOWER"
    assert http(kafka, "POST", "/faults", [{"action": "delay", "api": "Fetch", "ms": 10},
                                           {"action": "fail_disk", "topic": "t", "partition": 0}])[0] == 201
    assert [f["action"] for f in http(kafka, "GET", "/faults")[1]["armed"]] == ["fail", "delay", "fail_disk"]
    assert produce(client, "t", 1, batch([b"z"])).error_code == E.NOT_LEADER_OR_FOLLOWER
    status, body = http(kafka, "POST", "/faults", {"api": "Produce", "error": "NO_SUCH_ERROR"})
    assert status == 400 and "NO_SUCH_ERROR" in body["error"]
    assert http(kafka, "POST", "/faults", "not an object")[0] == 400
    assert http(kafka, "DELETE", "/faults") == (200, {"cleared": 3})
    assert produce(client, "t", 1, batch([b"z"])).error_code == 0
    assert produce_failures(kafka) == before + 1
    status, text = http(kafka, "GET", "/metrics")
    assert status == 200
    assert b'kafka_faults_injected_total{action="fail",api="Produce",error="NOT_LEADER_OR_FOLLOWER"} %d.0' % (
        before + 1) in text
    assert http(kafka, "GET", "/nothing")[0] == 404


def test_the_command_line_door(tmp_path: Path) -> None:
    metrics_port = free_port()
    proc = BrokerProcess(tmp_path / "data", overrides={"metrics.port": str(metrics_port)}, args=[
        "--fault", "api=Produce,error=NOT_ENOUGH_REPLICAS,times=1,topic=auto",
        "--fault", '{"action": "delay", "api": "ApiVersions", "ms": 1}',
    ]).start()
    try:
        c = RawClient(proc.port)
        metadata(c, ["auto"])  # auto-created
        assert produce(c, "auto", 0, batch([b"a"])).error_code == E.NOT_ENOUGH_REPLICAS
        assert produce(c, "auto", 0, batch([b"a"])).error_code == 0
        c.close()
    finally:
        assert proc.stop() == 0
    assert "fault injected" in proc.output()
    bad = BrokerProcess(tmp_path / "bad", args=["--fault", "api=Produce"])
    with pytest.raises(RuntimeError, match="needs error"):
        bad.start()
