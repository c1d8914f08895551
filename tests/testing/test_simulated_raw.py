"""The simulated cluster (simulated.brokers=3) in raw frames: what each node answers, leader and
coordinator moves, nodes going down and up, the HTTP door and a restart. Real clients:
tests/compat/test_simulated_clients.py."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from broker.testing import EmbeddedBroker
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.harness import RawClient, port_open
from tests.integration.test_server_support import (
    FETCH,
    batch,
    fetch_request,
    metadata,
    produce,
    produce_request,
)

E = ErrorCode
PRODUCE, CREATE_TOPICS, LIST_GROUPS = 0, 19, 16
NODES = [1, 2, 3]


@pytest.fixture
def kafka() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker({"simulated.brokers": 3, "offsets.topic.num.partitions": 6, "metrics.port": 0}) as broker:
        yield broker


def any_node(kafka: EmbeddedBroker) -> RawClient:
    """A client of a live node (bootstrap_servers lists those)."""
    return RawClient(int(kafka.bootstrap_servers.split(",")[0].rsplit(":", 1)[1]))


def ports(kafka: EmbeddedBroker) -> dict[int, int]:
    c = any_node(kafka)
    try:
        return {b.node_id: b.port for b in metadata(c, []).brokers}
    finally:
        c.close()


def layout(kafka: EmbeddedBroker, topic: str) -> dict[int, Any]:
    c = any_node(kafka)
    try:
        [t] = metadata(c, [topic]).topics
        return {p.partition_index: p for p in t.partitions}
    finally:
        c.close()


def create(c: RawClient, name: str, partitions: int, factor: int) -> Any:
    R = M.CreateTopicsRequest
    topic = R.CreatableTopic(name=name, num_partitions=partitions, replication_factor=factor, assignments=[],
                             configs=[])
    return c.call(CREATE_TOPICS, 5, R(topics=[topic], timeout_ms=10000, validate_only=False)).topics[0]


def test_nodes_replicas_and_the_wrong_node(kafka: EmbeddedBroker) -> None:
    nodes = ports(kafka)
    assert sorted(nodes) == NODES and len(set(nodes.values())) == 3
    assert kafka.bootstrap_servers == ",".join("127.0.0.1:%d" % nodes[n] for n in NODES)
    c = RawClient(nodes[2])
    assert create(c, "r3", 3, 3).error_code == 0
    too_many = create(c, "r4", 1, 4)
    assert too_many.error_code == E.INVALID_REPLICATION_FACTOR and "only 3 broker(s)" in too_many.error_message
    c.close()
    parts = layout(kafka, "r3")
    assert sorted(p.leader_id for p in parts.values()) == NODES  # leaders spread
    for p in parts.values():
        assert sorted(p.replica_nodes) == NODES and sorted(p.isr_nodes) == NODES and p.offline_replicas == []
        assert p.leader_id == p.replica_nodes[0]
    leader = parts[0].leader_id
    follower = next(n for n in NODES if n != leader)
    on_follower = RawClient(nodes[follower])
    answer = produce(on_follower, "r3", 0, batch([b"x"]))
    assert answer.error_code == E.NOT_LEADER_OR_FOLLOWER
    assert produce(RawClient(nodes[leader]), "r3", 0, batch([b"x"])).base_offset == 0  # nothing was written before
    # a request about partitions of several leaders: each partition answered as its node would
    R = M.ProduceRequest
    both = R(transactional_id=None, acks=-1, timeout_ms=10000, topic_data=[R.TopicProduceData(name="r3", partition_data=[
        R.PartitionProduceData(index=p, records=batch([b"y"])) for p in (0, 1, 2)])])
    answers = {p.index: p.error_code for t in on_follower.call(PRODUCE, 9, both).responses for p in t.partition_responses}
    assert answers == {p: 0 if parts[p].leader_id == follower else E.NOT_LEADER_OR_FOLLOWER for p in range(3)}
    on_follower.close()


def find_coordinator(c: RawClient, group: str) -> Any:
    return c.call(10, 3, M.FindCoordinatorRequest(key=group, key_type=0))


def join(c: RawClient, group: str) -> Any:
    return c.call(11, 5, M.JoinGroupRequest(
        group_id=group, session_timeout_ms=10000, rebalance_timeout_ms=10000, member_id="", protocol_type="consumer",
        protocols=[M.JoinGroupRequest.JoinGroupRequestProtocol(name="range", metadata=b"")]))


def test_coordinators_are_spread_and_answer_only_for_their_groups(kafka: EmbeddedBroker) -> None:
    nodes = ports(kafka)
    clients = {n: RawClient(port) for n, port in nodes.items()}
    groups = ["g%d" % i for i in range(12)]
    coordinators = {}
    for g in groups:
        found = {find_coordinator(c, g).node_id for c in clients.values()}
        assert len(found) == 1  # every node names the same coordinator
        coordinators[g] = found.pop()
    assert set(coordinators.values()) == set(NODES)
    for g in groups[:3]:
        for n, c in clients.items():
            code = join(c, g).error_code
            assert code == (E.MEMBER_ID_REQUIRED if n == coordinators[g] else E.NOT_COORDINATOR), (g, n)
    listed = {n: {g.group_id for g in c.call(LIST_GROUPS, 4, M.ListGroupsRequest(states_filter=[])).groups}
              for n, c in clients.items()}
    assert set().union(*listed.values()) == set(groups[:3])
    assert all(listed[n] == {g for g in groups[:3] if coordinators[g] == n} for n in NODES)
    moved = kafka.faults.move_coordinator("g0")
    assert moved != coordinators["g0"]
    assert find_coordinator(clients[moved], "g0").node_id == moved
    assert join(clients[coordinators["g0"]], "g0").error_code == E.NOT_COORDINATOR
    assert join(clients[moved], "g0").error_code == E.MEMBER_ID_REQUIRED
    for c in clients.values():
        c.close()


def test_leader_moves_with_a_new_epoch(kafka: EmbeddedBroker) -> None:
    kafka.create_topic("moving", 1, replication_factor=3)
    nodes = ports(kafka)
    before = layout(kafka, "moving")[0]
    leader = RawClient(nodes[before.leader_id])
    assert produce(leader, "moving", 0, batch([b"a"])).error_code == 0
    new = kafka.faults.move_leader("moving", 0)
    after = layout(kafka, "moving")[0]
    assert (after.leader_id, after.leader_epoch) == (new, before.leader_epoch + 1)
    assert produce(leader, "moving", 0, batch([b"b"])).error_code == E.NOT_LEADER_OR_FOLLOWER
    on_new = RawClient(nodes[new])
    request = fetch_request([("moving", 0, 0)])
    request.topics[0].partitions[0].current_leader_epoch = before.leader_epoch
    assert on_new.call(FETCH, 12, request).responses[0].partitions[0].error_code == E.FENCED_LEADER_EPOCH
    assert produce(on_new, "moving", 0, batch([b"b"])).base_offset == 1
    with pytest.raises(ValueError):
        kafka.faults.move_leader("moving", 0, to=new)  # already the leader
    EL = M.ElectLeadersRequest
    election = EL(election_type=0, timeout_ms=10000, topic_partitions=[EL.TopicPartitions(topic="moving", partitions=[0])])
    [result] = on_new.call(43, 2, election).replica_election_results[0].partition_result
    assert result.error_code == 0
    back = layout(kafka, "moving")[0]
    assert (back.leader_id, back.leader_epoch) == (before.replica_nodes[0], before.leader_epoch + 2)
    [again] = on_new.call(43, 2, election).replica_election_results[0].partition_result
    assert again.error_code == E.ELECTION_NOT_NEEDED
    kafka.create_topic("single", 1)
    with pytest.raises(ValueError):
        kafka.faults.move_leader("single", 0)  # no other replica
    leader.close()
    on_new.close()


def test_a_node_goes_down_and_comes_back(kafka: EmbeddedBroker) -> None:
    kafka.create_topic("r3", 3, replication_factor=3, min_insync_replicas=3)
    kafka.create_topic("r1", 3)
    nodes = ports(kafka)
    victim = layout(kafka, "r3")[0].leader_id
    kafka.faults.node_down(victim)
    assert not port_open(nodes[victim])
    assert victim not in ports(kafka)
    for p in layout(kafka, "r3").values():
        assert p.leader_id != victim and victim not in p.isr_nodes and p.offline_replicas == [victim]
    lonely = [p for p in layout(kafka, "r1").values() if p.replica_nodes == [victim]]
    assert lonely and all((p.error_code, p.leader_id) == (E.LEADER_NOT_AVAILABLE, -1) for p in lonely)
    survivor = layout(kafka, "r3")[0].leader_id
    c = RawClient(nodes[survivor])
    # acks=all with fewer in-sync replicas than min.insync.replicas
    assert c.call(PRODUCE, 9, produce_request("r3", 0, batch([b"x"]))).responses[0].partition_responses[0].error_code \
        == E.NOT_ENOUGH_REPLICAS
    assert produce(c, "r3", 0, batch([b"x"]), acks=1).error_code == 0
    c.close()
    kafka.faults.node_up(victim)
    assert port_open(nodes[victim])
    assert ports(kafka) == nodes
    assert all(sorted(p.isr_nodes) == NODES for p in layout(kafka, "r3").values())
    assert all(p.leader_id == victim for p in layout(kafka, "r1").values() if p.replica_nodes == [victim])
    c = RawClient(nodes[survivor])
    assert produce(c, "r3", 0, batch([b"y"])).error_code == 0
    c.close()


def test_the_http_door_and_a_restart(kafka: EmbeddedBroker) -> None:
    kafka.create_topic("kept", 1, replication_factor=2)
    assert kafka.broker.http is not None
    url = "http://127.0.0.1:%d/faults" % kafka.broker.http.port
    old = layout(kafka, "kept")[0]

    def post(body: Any) -> Any:
        request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST")
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read())["armed"]

    answer = post({"action": "move_leader", "topic": "kept", "partition": 0})
    moved = answer["result"]
    assert moved != old.leader_id and layout(kafka, "kept")[0].leader_id == moved
    down = next(n for n in NODES if n not in old.replica_nodes)
    post({"action": "node_down", "node": down})
    assert down not in ports(kafka)
    post({"action": "node_up", "node": down})
    nodes = ports(kafka)
    kafka.restart()
    assert ports(kafka) == nodes  # every node on its port again
    after = layout(kafka, "kept")[0]
    assert (after.leader_id, after.leader_epoch) == (moved, old.leader_epoch + 1)
    with pytest.raises(KafkaError):
        kafka.create_topic("too-wide", 1, replication_factor=4)


def test_a_refused_produce_or_fetch_names_the_leader_kip_951(kafka: EmbeddedBroker) -> None:
    nodes = ports(kafka)
    c = RawClient(nodes[1])
    assert create(c, "hint", 1, 3).error_code == 0
    c.close()
    p0 = layout(kafka, "hint")[0]
    follower = next(n for n in NODES if n != p0.leader_id)
    on_follower = RawClient(nodes[follower])
    try:
        for version, hinted in ((9, False), (10, True), (12, True)):
            r = on_follower.call(PRODUCE, version, produce_request("hint", 0, batch([b"x"])))
            answer = r.responses[0].partition_responses[0]
            assert answer.error_code == E.NOT_LEADER_OR_FOLLOWER
            if hinted:
                assert (answer.current_leader.leader_id, answer.current_leader.leader_epoch) == (
                    p0.leader_id, p0.leader_epoch)
                assert [(e.node_id, e.port) for e in r.node_endpoints] == [(p0.leader_id, nodes[p0.leader_id])]
        topic_id = metadata(on_follower, ["hint"]).topics[0].topic_id
        for version, hinted in ((15, False), (16, True)):
            f = on_follower.call(FETCH, version, fetch_request([("hint", 0, 0)], topic_ids={"hint": topic_id}))
            part = f.responses[0].partitions[0]
            assert part.error_code == E.NOT_LEADER_OR_FOLLOWER
            if hinted:
                assert part.current_leader.leader_id == p0.leader_id
                assert [(e.node_id, e.port) for e in f.node_endpoints] == [(p0.leader_id, nodes[p0.leader_id])]
            else:
                assert part.current_leader.leader_id == -1
        # the share APIs too: a share-partition lives with its partition's leader
        S, A = M.ShareFetchRequest, M.ShareAcknowledgeRequest
        share_fetch = S(group_id="hinted", member_id="AAAAAAAAAAAAAAAAAAAAAA", share_session_epoch=0, max_wait_ms=0,
                        min_bytes=1, max_bytes=1 << 20, max_records=10, batch_size=10,
                        topics=[S.FetchTopic(topic_id=topic_id, partitions=[S.FetchPartition(partition_index=0)])])
        acknowledge = A(group_id="hinted", member_id="AAAAAAAAAAAAAAAAAAAAAA", share_session_epoch=1, topics=[
            A.AcknowledgeTopic(topic_id=topic_id, partitions=[A.AcknowledgePartition(
                partition_index=0, acknowledgement_batches=[A.AcknowledgementBatch(0, 0, [1])])])])
        for api_key, request in ((78, share_fetch), (79, acknowledge)):
            r = on_follower.call(api_key, 1, request)
            [part] = r.responses[0].partitions
            assert part.error_code == E.NOT_LEADER_OR_FOLLOWER
            assert (part.current_leader.leader_id, part.current_leader.leader_epoch) == (p0.leader_id, p0.leader_epoch)
            assert [(e.node_id, e.port) for e in r.node_endpoints] == [(p0.leader_id, nodes[p0.leader_id])]
    finally:
        on_follower.close()


def test_share_group_admin_goes_to_the_groups_coordinator(kafka: EmbeddedBroker) -> None:
    nodes = ports(kafka)
    clients = {n: RawClient(port) for n, port in nodes.items()}
    try:
        coordinator = find_coordinator(clients[1], "sg").node_id
        D, A, X = M.DescribeShareGroupOffsetsRequest, M.AlterShareGroupOffsetsRequest, M.DeleteShareGroupOffsetsRequest
        for n, c in clients.items():
            described = c.call(90, 1, D(groups=[D.DescribeShareGroupOffsetsRequestGroup(group_id="sg", topics=None)]))
            altered = c.call(91, 0, A(group_id="sg", topics=[]))
            deleted = c.call(92, 0, X(group_id="sg", topics=[]))
            codes = (described.groups[0].error_code, altered.error_code, deleted.error_code)
            # the coordinator describes an unknown group as empty, alters it (creating it when a topic
            # is named, as Kafka 4.2) and cannot delete its offsets
            assert codes == ((E.NONE, E.NONE, E.GROUP_ID_NOT_FOUND) if n == coordinator
                             else (E.NOT_COORDINATOR,) * 3), n
    finally:
        for c in clients.values():
            c.close()
