"""Share group membership on the group coordinator shard (no runtime, manual clock) and the share
assignor."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import StaticTopicMetadata
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.shard import GroupCoordinatorShard
from broker.coordinator.group.share_assignor import assign, balance
from broker.coordinator.group.share_group import ShareGroup, ShareGroupState
from broker.coordinator.group.share_heartbeat import validate_heartbeat_request
from broker.coordinator.result import Deferred
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.coordinator.harness import ShardHarness

E = ErrorCode
REQ = M.ShareGroupHeartbeatRequest
CONFIG = GroupCoordinatorConfig(num_partitions=1, share_session_timeout_ms=10_000, share_heartbeat_interval_ms=2000)
HOLDING = dataclasses.replace(CONFIG, heartbeat_hold_ms=-1)  # group.heartbeat.hold.ms turned on
T1 = uuid.uuid5(uuid.NAMESPACE_DNS, "t1")
T2 = uuid.uuid5(uuid.NAMESPACE_DNS, "t2")


class ShareHarness(ShardHarness):
    def __init__(self, log: Any = None, config: GroupCoordinatorConfig = CONFIG) -> None:
        self.metadata = StaticTopicMetadata()
        self.metadata.add("t1", 2, T1)
        self.metadata.add("t2", 3, T2)
        super().__init__(config, log=log)

    def _make_shard(self, config: GroupCoordinatorConfig) -> GroupCoordinatorShard:
        return GroupCoordinatorShard(self.timer, config, metadata=self.metadata)

    def hb(self, member: str, epoch: int, topics: list[str] | None = None, group: str = "g") -> Any:
        request = REQ(group_id=group, member_id=member, member_epoch=epoch, rack_id=None,
                      subscribed_topic_names=topics)
        validate_heartbeat_request(request)
        return self.call(lambda s, now: s.share_group_heartbeat(request, RequestInfo("c", "/127.0.0.1", 1), now))


def assigned(response: Any) -> dict[uuid.UUID, list[int]]:
    assert response.assignment is not None
    return {tp.topic_id: tp.partitions for tp in response.assignment.topic_partitions}


def test_join_gets_everything_then_a_second_member_shares() -> None:
    h = ShareHarness()
    r1 = h.hb("m1", 0, ["t1"])
    assert (r1.error_code, r1.member_epoch, r1.heartbeat_interval_ms) == (E.NONE, 1, 2000)
    assert assigned(r1) == {T1: [0, 1]}
    r2 = h.hb("m2", 0, ["t1"])
    assert r2.member_epoch == 2 and assigned(r2) == {T1: [1]}
    r1 = h.hb("m1", 1)
    assert r1.member_epoch == 2 and assigned(r1) == {T1: [0]}
    group = h.group("g")
    assert isinstance(group, ShareGroup) and group.state is ShareGroupState.STABLE
    assert group.initialized_partitions() == {(T1, 0), (T1, 1)}


def test_more_members_than_partitions_share_every_partition() -> None:
    h = ShareHarness()
    for i in range(5):
        h.hb("m%d" % i, 0, ["t1"])
    loads: dict[int, int] = {}
    for i in range(5):
        r = h.hb("m%d" % i, h.group("g").members["m%d" % i].member_epoch)
        member = h.group("g").members["m%d" % i]
        assert member.assigned, "every member gets a partition"
        for p in member.assigned[T1]:
            loads[p] = loads.get(p, 0) + 1
        del r
    assert loads == {0: 3, 1: 3}  # ceil(5 / 2) members on each partition


def test_errors_of_share_heartbeats() -> None:
    h = ShareHarness()
    with pytest.raises(KafkaError) as err:
        h.hb("m1", 1, ["t1"])
    assert err.value.code is E.GROUP_ID_NOT_FOUND
    h.hb("m1", 0, ["t1"])
    with pytest.raises(KafkaError) as err:
        h.hb("other", 3)
    assert err.value.code is E.UNKNOWN_MEMBER_ID
    with pytest.raises(KafkaError) as err:
        h.hb("m1", 7)
    assert err.value.code is E.FENCED_MEMBER_EPOCH
    for bad in (REQ(group_id="g", member_id="", member_epoch=0, subscribed_topic_names=["t1"]),
                REQ(group_id="g", member_id="m", member_epoch=0, subscribed_topic_names=[]),
                REQ(group_id="g", member_id="m", member_epoch=-3, subscribed_topic_names=None)):
        with pytest.raises(KafkaError) as err:
            validate_heartbeat_request(bad)
        assert err.value.code is E.INVALID_REQUEST


def test_a_group_id_of_another_type_is_not_a_share_group() -> None:
    h = ShareHarness()
    h.commit("classic", {("t1", 0): 5})
    with pytest.raises(KafkaError) as err:
        h.hb("m1", 0, ["t1"], group="classic")
    assert err.value.code is E.GROUP_ID_NOT_FOUND
    h.hb("m1", 0, ["t1"], group="share")
    with pytest.raises(KafkaError) as err:  # the API layer answers it on every partition
        h.commit("share", {("t1", 0): 5}, version=9)
    assert err.value.code is E.GROUP_ID_NOT_FOUND


def test_leave_and_session_expiry_remove_members_and_the_group_survives_a_reload() -> None:
    h = ShareHarness()
    h.hb("m1", 0, ["t1", "t2"])
    h.hb("m2", 0, ["t1"])
    left = h.hb("m2", -1)
    assert left.member_epoch == -1
    assert list(h.group("g").members) == ["m1"]
    again = h.reload()
    group = again.group("g")
    assert list(group.members) == ["m1"] and group.group_epoch == h.group("g").group_epoch
    assert group.members["m1"].assigned == h.group("g").members["m1"].assigned
    h.advance(10_001)  # m1 stopped heartbeating
    assert h.group("g").state is ShareGroupState.EMPTY
    listed = h.shard.list_groups([], ["share"])
    assert [(g.group_id, g.group_state, g.group_type) for g in listed] == [("g", "Empty", "share")]
    deleted = h.call(lambda s, now: s.delete_groups(["g"], now))
    assert deleted[0].error_code == E.NONE and "g" not in h.shard.groups


def test_describe() -> None:
    h = ShareHarness()
    h.hb("m1", 0, ["t1"])
    (described,) = h.shard.share_group_describe(["g"])
    assert (described.group_state, described.assignor_name, [m.member_id for m in described.members]) == (
        "Stable", "simple", ["m1"])
    assert described.members[0].assignment.topic_partitions[0].topic_name == "t1"
    (missing,) = h.shard.share_group_describe(["nope"])
    assert missing.error_code == E.GROUP_ID_NOT_FOUND


def test_the_assignor_is_balanced_and_sticky() -> None:
    parts = [(T1, 0), (T1, 1), (T1, 2), (T1, 3)]
    first = balance(parts, ["a", "b"], {})
    assert sorted(len(v) for v in first.values()) == [2, 2]
    second = balance(parts, ["a", "b", "c"], first)
    assert sorted(len(v) for v in second.values()) == [1, 1, 2]
    assert all(second[m] <= first[m] for m in ("a", "b"))  # a and b kept what they could
    # heterogeneous subscriptions: each topic is shared among its own subscribers
    target = assign({"a": frozenset([T1]), "b": frozenset([T1, T2])}, {T1: 2, T2: 3}, {})
    assert set(target["a"]) == {T1} and target["b"][T2] == frozenset([0, 1, 2])


def test_the_classic_describe_groups_answers_a_share_group_as_kafka_does() -> None:
    h = ShareHarness()
    h.hb("m1", 0, ["t1"])
    v6 = h.shard.describe_groups(["g", "nope"], 6)
    assert [(d.error_code, d.error_message, d.group_state) for d in v6] == [
        (E.GROUP_ID_NOT_FOUND, "Group g is not a classic group.", "Dead"),
        (E.GROUP_ID_NOT_FOUND, "Group nope not found.", "Dead")]
    (v5,) = h.shard.describe_groups(["g"], 5)
    assert (v5.error_code, v5.group_state) == (E.NONE, "Dead")


def test_every_share_heartbeat_is_answered_at_once_by_default() -> None:
    h = ShareHarness()
    h.hb("m1", 0, ["t1"])
    steady = h.hb("m1", 1)
    assert not isinstance(steady, Deferred) and (steady.assignment, steady.heartbeat_interval_ms) == (None, 2000)


def test_a_heartbeat_with_nothing_new_is_held_until_the_group_changes() -> None:
    h = ShareHarness(config=HOLDING)
    h.hb("m1", 0, ["t1"])
    h.hb("m2", 0, ["t1"])
    assert assigned(h.hb("m1", 1)) == {T1: [0]}  # m1 learns it shares the topic with m2: not held
    held = h.hb("m1", 2)
    assert isinstance(held, Deferred) and not held.done()
    h.advance(999)  # held for 1 s less than the 2 s interval librdkafka times the request out with
    assert not held.done()
    h.advance(1)
    assert held.result().error_code == E.NONE and held.result().assignment is None
    # m2 leaves: m1's held heartbeat is answered at once with m2's partition
    held = h.hb("m1", 2)
    assert isinstance(held, Deferred) and not held.done()
    h.hb("m2", -1)
    h.advance(0)
    assert held.done() and assigned(held.result()) == {T1: [0, 1]} and held.result().member_epoch == 3


def test_a_held_share_heartbeat_released_by_another_request_asks_the_member_back_soon() -> None:
    h = ShareHarness(config=HOLDING)
    h.hb("m1", 0, ["t1"])
    held = h.hb("m1", 1)
    assert isinstance(held, Deferred) and not held.done()
    h.call(lambda s, now: s.release_heartbeat("g", "m1", now))
    assert held.result().heartbeat_interval_ms == 500 and held.result().assignment is None
    again = h.hb("m1", 1)  # it was told 500 ms: held for half of that at most
    h.advance(250)
    assert isinstance(again, Deferred) and again.done() and again.result().heartbeat_interval_ms == 2000
    # the shard going away answers a held heartbeat NOT_COORDINATOR (the client finds the coordinator again)
    held = h.hb("m1", 1)
    h.shard.on_unloaded()
    assert isinstance(held, Deferred) and held.result().error_code == E.NOT_COORDINATOR


def test_a_share_heartbeat_bringing_a_change_is_answered_at_once() -> None:
    """Kafka answers every heartbeat at once; one that brings the client's change (even a
    subscription to the same topics, which writes nothing) is not held: its client waits for it."""
    h = ShareHarness(config=HOLDING)
    h.hb("m1", 0, ["t1"])
    assert isinstance(h.hb("m1", 1), Deferred)  # nothing new: held
    h.advance(1000)
    epoch = 1
    for topics in (["t1"], ["t1", "missing"], ["t1"]):
        response = h.hb("m1", epoch, topics)
        assert not isinstance(response, Deferred) and response.error_code == E.NONE, topics
        assert response.assignment is None  # the same partitions (the epoch moves with the subscription)
        epoch = response.member_epoch
    request = REQ(group_id="g", member_id="m1", member_epoch=epoch, rack_id="r1", subscribed_topic_names=None)
    response = h.call(lambda s, now: s.share_group_heartbeat(request, RequestInfo("c", "/127.0.0.1", 1), now))
    assert not isinstance(response, Deferred) and response.error_code == E.NONE
    assert isinstance(h.hb("m1", epoch), Deferred)  # nothing new again: held


def test_group_share_max_size_refuses_one_member_too_many() -> None:
    h = ShareHarness(config=dataclasses.replace(CONFIG, share_max_size=2))
    h.hb("m1", 0, ["t1"])
    h.hb("m2", 0, ["t1"])
    with pytest.raises(KafkaError) as err:
        h.hb("m3", 0, ["t1"])
    assert err.value.code is E.GROUP_MAX_SIZE_REACHED
    assert list(h.group("g").members) == ["m1", "m2"]  # nothing else changed
    h.hb("m2", -1)
    assert h.hb("m3", 0, ["t1"]).error_code == E.NONE  # a place is free again


def test_subscription_changes_and_topics_grown_or_deleted_move_the_assignment() -> None:
    h = ShareHarness()
    r = h.hb("m1", 0, ["t1", "t2"])
    assert assigned(r) == {T1: [0, 1], T2: [0, 1, 2]}
    # t1 grows to 4 partitions: the next heartbeat carries them
    h.metadata.add("t1", 4, T1)
    h.run(lambda s, now: s.on_metadata_change(set(), set(), {"t1"}, now))
    r = h.hb("m1", r.member_epoch)
    assert assigned(r) == {T1: [0, 1, 2, 3], T2: [0, 1, 2]}
    assert {(T1, 2), (T1, 3)} <= h.group("g").initialized_partitions()
    # t2 is deleted: its partitions leave the assignment
    h.metadata.remove("t2")
    h.run(lambda s, now: s.on_metadata_change(set(), {"t2"}, set(), now))
    r = h.hb("m1", r.member_epoch)
    assert assigned(r) == {T1: [0, 1, 2, 3]}
    # the member subscribes to a new topic only: t1 goes, t3 comes
    t3 = uuid.uuid5(uuid.NAMESPACE_DNS, "t3")
    h.metadata.add("t3", 1, t3)
    h.run(lambda s, now: s.on_metadata_change({"t3"}, set(), set(), now))
    epoch = r.member_epoch
    r = h.hb("m1", epoch, ["t3"])
    assert assigned(r) == {t3: [0]} and r.member_epoch > epoch
