"""ConsumerGroupHeartbeat on the shard: joining, epochs, reconciliation across members, leaving,
errors, timers on the manual clock, static members, topic changes and regular expressions."""

from __future__ import annotations

import dataclasses

import pytest
from structlog.testing import capture_logs

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import ConsumerGroup, ConsumerGroupState
from broker.coordinator.group.member import MemberState
from broker.coordinator.group.records import (
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    CONSUMER_GROUP_MEMBER_METADATA,
    CONSUMER_GROUP_METADATA,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA,
    parse_record,
)
from broker.coordinator.result import Deferred
from protocol.errors import ErrorCode
from tests.coordinator.consumer_harness import CONFIG, REQ, Client, ConsumerHarness, tid

E = ErrorCode
GS = ConsumerGroupState


@pytest.fixture
def h() -> ConsumerHarness:
    harness = ConsumerHarness()
    harness.topic("t", 4)
    return harness


def parts(response: object) -> dict[object, list[int]]:
    a = response.assignment  # type: ignore[attr-defined]
    return {tp.topic_id: list(tp.partitions) for tp in a.topic_partitions}


def test_first_member_joins(h: ConsumerHarness) -> None:
    t = h.metadata.topic("t").topic_id  # type: ignore[union-attr]
    r = h.cjoin("m1", ["t"])
    assert (r.error_code, r.member_id, r.member_epoch, r.heartbeat_interval_ms) == (0, "m1", 1, 5000)
    assert parts(r) == {t: [0, 1, 2, 3]}
    types = [parse_record(k, v)[0] for k, v in h.log]
    assert types == [CONSUMER_GROUP_MEMBER_METADATA, CONSUMER_GROUP_METADATA, CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
                     CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA, CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT]
    group = h.group()
    assert isinstance(group, ConsumerGroup)
    assert (group.group_epoch, group.assignment_epoch, group.state) == (1, 1, GS.STABLE)
    member = group.members["m1"]
    assert (member.client_id, member.client_host, member.rebalance_timeout_ms, member.subscribed_topic_regex) == (
        "client", "/127.0.0.1", 300000, "")


def test_steady_heartbeat_changes_nothing_and_omits_the_assignment(h: ConsumerHarness) -> None:
    h.cjoin("m1", ["t"])
    n = len(h.log)
    r = h.hb("m1", 1)  # every nullable field null: unchanged
    assert (r.error_code, r.member_epoch, r.assignment) == (0, 1, None)
    assert len(h.log) == n
    assert h.group().members["m1"].subscribed_topic_names == frozenset(["t"])
    # A full request (after an error, say) gets the assignment again.
    t = h.metadata.topic("t").topic_id  # type: ignore[union-attr]
    r = h.hb("m1", 1, topics=["t"], owned={t: [0, 1, 2, 3]}, rebalance_timeout_ms=300000)
    assert parts(r) == {t: [0, 1, 2, 3]}


def test_two_members_revoke_before_assign(h: ConsumerHarness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    a.poll()
    assert len(a.partitions()) == 4
    rb = b.poll()
    # b is in the group at epoch 2 but gets nothing yet: a still owns everything.
    group = h.group()
    assert (rb.member_epoch, b.partitions(), group.state) == (2, set(), GS.RECONCILING)
    assert group.members["b"].state is MemberState.UNRELEASED_PARTITIONS
    ra = a.poll()  # a learns the new target: revokes two partitions, keeps epoch 1
    assert (ra.member_epoch, len(a.partitions())) == (1, 2)
    assert group.members["a"].state is MemberState.UNREVOKED_PARTITIONS
    assert b.poll().assignment is None  # still owned by a: nothing new for b
    ra = a.poll()  # a acknowledges the revocation: epoch 2, stable
    assert (ra.member_epoch, group.members["a"].state) == (2, MemberState.STABLE)
    rb = b.poll()  # now b gets the released partitions
    assert len(b.partitions()) == 2 and not (a.partitions() & b.partitions())
    assert group.state is GS.STABLE
    assert rb.member_epoch == 2


def test_lost_response_retry_with_previous_epoch_is_accepted(h: ConsumerHarness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    a.poll()
    b.poll()
    a.poll()  # revoke
    a.poll()  # epoch 2
    t = h.metadata.topic("t").topic_id  # type: ignore[union-attr]
    # The response carrying epoch 2 was lost: a retries with epoch 1 and a subset of its assignment.
    r = h.hb("a", 1, owned={t: sorted(p for _, p in a.partitions())})
    assert (r.error_code, r.member_epoch) == (0, 2)
    # Anything else is fenced.
    assert h.hb("a", 1, owned={t: [0, 1, 2, 3]}).error_code == E.FENCED_MEMBER_EPOCH
    assert h.hb("a", 0 + 7, owned={}).error_code == E.FENCED_MEMBER_EPOCH
    assert h.hb("zombie", 2).error_code == E.UNKNOWN_MEMBER_ID
    assert h.hb("a", 2, group="nope").error_code == E.GROUP_ID_NOT_FOUND


def test_fenced_member_rejoins_with_the_same_id(h: ConsumerHarness) -> None:
    c = Client(h, "a", ["t"])
    c.poll()
    c.epoch = 9
    assert c.poll().error_code == E.FENCED_MEMBER_EPOCH
    r = c.poll()  # epoch 0, same member id: it gets its assignment back
    assert (r.error_code, r.member_epoch, len(c.partitions())) == (0, 1, 4)


def test_request_validation() -> None:
    h = ConsumerHarness()
    cases = [
        (REQ(group_id="g", member_id="", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_names=[],
             topic_partitions=[]), E.INVALID_REQUEST),  # v1: the client chooses the member id
        (REQ(group_id="", member_id="m", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_names=[],
             topic_partitions=[]), E.INVALID_REQUEST),
        (REQ(group_id="g", member_id="m", member_epoch=0, subscribed_topic_names=[], topic_partitions=[]),
         E.INVALID_REQUEST),  # no rebalance timeout
        (REQ(group_id="g", member_id="m", member_epoch=0, rebalance_timeout_ms=1, topic_partitions=[]),
         E.INVALID_REQUEST),  # neither names nor regex
        (REQ(group_id="g", member_id="m", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_names=[]),
         E.INVALID_REQUEST),  # owned partitions must be an empty list
        (REQ(group_id="g", member_id="m", member_epoch=-2), E.INVALID_REQUEST),  # static leave without instance
        (REQ(group_id="g", member_id="m", member_epoch=-3), E.INVALID_REQUEST),
        (REQ(group_id="g", member_id="m", member_epoch=0, instance_id=" ", rebalance_timeout_ms=1,
             subscribed_topic_names=[], topic_partitions=[]), E.INVALID_REQUEST),
        (REQ(group_id="g", member_id="m", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_names=[],
             topic_partitions=[], server_assignor="sticky"), E.UNSUPPORTED_ASSIGNOR),
        (REQ(group_id="g", member_id="m", member_epoch=0, rebalance_timeout_ms=1, subscribed_topic_regex="(",
             topic_partitions=[]), E.INVALID_REGULAR_EXPRESSION),
    ]
    with capture_logs() as logs:
        for request, code in cases:
            r = h.cg_heartbeat(request)
            assert r.error_code == code, (request, r)
            assert r.error_message
            assert "b'" not in r.error_message  # RE2's description as text, not a bytes repr
    assert "g" not in h.shard.groups
    assert not [e for e in logs if "joins" in e["event"]]  # a refused member never joined
    # v0 members may leave the id to the coordinator.
    r = h.cg_heartbeat(REQ(group_id="g", member_id="", member_epoch=0, rebalance_timeout_ms=1,
                        subscribed_topic_names=[], topic_partitions=[]), version=0)
    assert r.error_code == 0 and len(r.member_id) == 22  # as Kafka's Uuid.toString()


def test_leave_bumps_the_epoch_and_frees_the_partitions(h: ConsumerHarness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    for _ in range(3):
        a.poll()
        b.poll()
    assert len(a.partitions()) == len(b.partitions()) == 2
    epoch = h.group().group_epoch
    r = b.leave()
    assert (r.error_code, r.member_id, r.member_epoch) == (0, "b", -1)
    group = h.group()
    assert "b" not in group.members and "b" not in group.target_assignment
    assert (group.group_epoch, group.state) == (epoch + 1, GS.ASSIGNING)
    a.poll()
    assert len(a.partitions()) == 4 and group.state is GS.STABLE
    # Leaving twice, or from an unknown group.
    assert h.hb("b", -1).error_code == E.UNKNOWN_MEMBER_ID
    assert h.hb("b", -1, group="other").error_code == E.GROUP_ID_NOT_FOUND
    a.leave()
    assert h.group().state is GS.EMPTY


def test_session_timeout_fences_a_silent_member(h: ConsumerHarness) -> None:
    a, b = Client(h, "a", ["t"]), Client(h, "b", ["t"])
    for _ in range(3):
        a.poll()
        b.poll()
    for _ in range(4):
        h.advance(10_000)
        a.poll()  # a keeps heartbeating, b does not
    assert "b" in h.group().members
    h.advance(10_000)
    assert "b" not in h.group().members
    a.poll()
    assert len(a.partitions()) == 4
    assert b.poll().error_code == E.UNKNOWN_MEMBER_ID


def test_rebalance_timeout_fences_a_member_that_does_not_revoke(h: ConsumerHarness) -> None:
    h.cjoin("a", ["t"], rebalance_timeout_ms=20_000)
    b = Client(h, "b", ["t"])
    b.poll()
    t = h.metadata.topic("t").topic_id  # type: ignore[union-attr]
    h.hb("a", 1, owned={t: [0, 1, 2, 3]})  # told to revoke
    assert h.group().members["a"].state is MemberState.UNREVOKED_PARTITIONS
    for _ in range(2):
        h.advance(9_000)
        h.hb("a", 1, owned={t: [0, 1, 2, 3]})  # heartbeats but never revokes
        b.poll()
    h.advance(3_000)
    assert "a" not in h.group().members
    b.poll()
    assert len(b.partitions()) == 4


def test_static_member_leaves_and_comes_back_with_its_partitions(h: ConsumerHarness) -> None:
    a = Client(h, "a1", ["t"], instance="inst-a")
    b = Client(h, "b", ["t"])
    for _ in range(3):
        a.poll()
        b.poll()
    mine = a.partitions()
    assert len(mine) == 2
    r = a.leave()
    assert (r.error_code, r.member_epoch) == (0, -2)
    group = h.group()
    assert group.members["a1"].member_epoch == -2 and group.state is not GS.EMPTY
    b.poll()
    assert len(b.partitions()) == 2  # the static member's partitions are kept for it
    # A new instance while the member is alive is refused; with another member id it is fenced.
    assert h.cjoin("a2", ["t"], instance="inst-b").error_code == 0
    h.hb("a2", -1)
    # The restarted instance (new member id) takes over.
    a2 = Client(h, "a2-new", ["t"], instance="inst-a")
    r = a2.poll()
    assert r.error_code == 0 and a2.partitions() == mine
    assert "a1" not in group.members and group.static_members["inst-a"] == "a2-new"
    assert h.cjoin("a3", ["t"], instance="inst-a").error_code == E.UNRELEASED_INSTANCE_ID
    assert h.hb("a1", 3, instance="inst-a").error_code == E.FENCED_INSTANCE_ID
    assert h.hb("x", 3, instance="nobody").error_code == E.UNKNOWN_MEMBER_ID


def test_static_member_that_never_returns_expires(h: ConsumerHarness) -> None:
    a = Client(h, "a1", ["t"], instance="inst-a")
    b = Client(h, "b", ["t"])
    for _ in range(3):
        a.poll()
        b.poll()
    a.leave()
    for _ in range(5):
        h.advance(10_000)
        b.poll()
    assert "a1" not in h.group().members
    b.poll()
    assert len(b.partitions()) == 4


def test_server_assignor_is_chosen_by_the_members(h: ConsumerHarness) -> None:
    h.topic("u", 4)
    ids = sorted(["m1", "m2"])
    for m in ids:
        h.cjoin(m, ["t", "u"], assignor="range")
    group = h.group()
    assert group.preferred_server_assignor() == "range"
    for m in ids:
        h.hb(m, group.members[m].member_epoch, owned={})
    # range co-partitions: each member the same partition numbers of t and u.
    target = group.target_assignment
    for m in ids:
        assert len({ps for ps in target[m].values()}) == 1
    assert h.shard.consumer_group_describe(["g"])[0].assignor_name == "range"


def test_group_max_size() -> None:
    h = ConsumerHarness(dataclasses.replace(CONFIG, consumer_max_size=1))
    assert h.cjoin("a", []).error_code == 0
    assert h.cjoin("b", []).error_code == E.GROUP_MAX_SIZE_REACHED
    assert h.hb("a", 1).error_code == 0


def test_new_partitions_and_deleted_topics_change_the_assignment(h: ConsumerHarness) -> None:
    a = Client(h, "a", ["t", "u"])
    a.poll()
    epoch = h.group().group_epoch
    h.topic("t", 6)  # CreatePartitions
    h.topic("u", 2)  # a topic the member subscribed to before it existed
    a.poll()
    assert h.group().group_epoch == epoch + 1
    a.poll()
    assert len(a.partitions()) == 8
    h.delete_topic("u")
    a.poll()  # told to revoke u
    assert len(a.partitions()) == 6 and h.group().state is GS.RECONCILING
    a.poll()
    assert h.group().state is GS.STABLE


def test_regex_subscription_follows_topic_creation() -> None:
    config = dataclasses.replace(CONFIG, consumer_regex_refresh_interval_ms=1000)
    h = ConsumerHarness(config)
    h.topic("orders-1", 2)
    h.topic("other", 2)
    a = Client(h, "a", [])
    a.joined = True
    r = h.cjoin("a", regex="orders-.*")
    a.epoch = r.member_epoch
    assert r.assignment is not None and a.partitions() == set()  # resolved asynchronously
    h.advance(0)  # the resolution runs
    group = h.group()
    assert group.resolved_regexes["orders-.*"].topics == frozenset(["orders-1"])
    a.poll()
    assert len(a.partitions()) == 2
    h.topic("orders-2", 3)
    h.advance(500)
    a.poll()  # within the refresh floor: not yet
    h.advance(600)
    a.poll()  # schedules the refresh
    h.advance(0)
    a.poll()
    a.poll()
    assert len(a.partitions()) == 5
    assert h.shard.consumer_group_describe(["g"])[0].members[0].subscribed_topic_regex == "orders-.*"
    # The last member subscribed to the regex leaves: the resolved regex goes too.
    a.leave()
    assert group.resolved_regexes == {}


def test_offset_commit_and_fetch_with_member_epochs(h: ConsumerHarness) -> None:
    from protocol import messages as M

    c = Client(h, "a", ["t"])
    c.poll()
    assert h.commit9("g", "a", 1, {("t", 0): 5}) == {("t", 0): 0}
    assert h.commit9("g", "a", 0, {("t", 0): 6}) == {("t", 0): E.STALE_MEMBER_EPOCH}
    assert h.commit9("g", "b", 1, {("t", 0): 6}) == {("t", 0): E.UNKNOWN_MEMBER_ID}
    assert h.commit9("g", "a", 1, {("t", 0): 6}, version=8) == {("t", 0): E.UNSUPPORTED_VERSION}
    assert h.commit9("g", "", -1, {("t", 0): 6}) == {("t", 0): E.UNKNOWN_MEMBER_ID}  # admin, group not empty

    def fetch(member_id: str | None, epoch: int) -> object:
        request = M.OffsetFetchRequest.OffsetFetchRequestGroup(
            group_id="g", member_id=member_id, member_epoch=epoch,
            topics=[M.OffsetFetchRequest.OffsetFetchRequestTopics(name="t", partition_indexes=[0])])
        return h.shard.fetch_offsets(request, False)

    assert fetch(None, -1).topics[0].partitions[0].committed_offset == 5  # type: ignore[attr-defined]
    assert fetch("a", 1).topics[0].partitions[0].committed_offset == 5  # type: ignore[attr-defined]
    with pytest.raises(Exception) as err:
        fetch("a", 7)
    assert err.value.code == E.STALE_MEMBER_EPOCH  # type: ignore[attr-defined]
    c.leave()
    assert h.commit9("g", "", -1, {("t", 0): 7}) == {("t", 0): 0}  # empty group: the admin client commits


def test_describe_list_and_delete(h: ConsumerHarness) -> None:
    c = Client(h, "a", ["t"])
    c.poll()
    d = h.shard.consumer_group_describe(["g", "nope"])
    assert (d[0].group_state, d[0].group_epoch, d[0].assignment_epoch, d[0].assignor_name) == ("Stable", 1, 1,
                                                                                              "uniform")
    m = d[0].members[0]
    assert (m.member_id, m.member_epoch, m.member_type, m.subscribed_topic_names) == ("a", 1, 1, ["t"])
    assert [tp.topic_name for tp in m.assignment.topic_partitions] == ["t"]
    assert m.target_assignment.topic_partitions[0].partitions == [0, 1, 2, 3]
    assert d[1].error_code == E.GROUP_ID_NOT_FOUND
    listed = h.shard.list_groups([], ["consumer"])
    assert [(g.group_id, g.protocol_type, g.group_state, g.group_type) for g in listed] == [
        ("g", "consumer", "Stable", "consumer")]
    assert h.shard.list_groups(["stable"], []) and not h.shard.list_groups(["empty"], [])
    assert h.shard.list_groups([], ["classic"]) == []
    # The classic DescribeGroups does not know consumer groups.
    v6 = h.shard.describe_groups(["g"], 6)[0]
    assert (v6.error_code, v6.error_message, v6.group_state) == (
        E.GROUP_ID_NOT_FOUND, "Group g is not a classic group.", "Dead")
    v5 = h.shard.describe_groups(["g"], 5)[0]
    assert (v5.error_code, v5.group_state) == (0, "Dead")  # below v6 Kafka answers Dead without an error
    h.commit9("g", "a", 1, {("t", 0): 5})
    assert h.run(lambda s, now: s.delete_groups(["g"], now)).response[0].error_code == E.NON_EMPTY_GROUP
    c.leave()
    assert h.run(lambda s, now: s.delete_groups(["g"], now)).response[0].error_code == 0
    assert "g" not in h.shard.groups and h.shard.offsets.store.group("g") == {}
    # A fresh group of the same name starts over.
    assert h.cjoin("b", ["t"]).member_epoch == 1


def test_defaults_are_kafkas() -> None:
    assert (CONFIG.consumer_session_timeout_ms, GroupCoordinatorConfig().consumer_heartbeat_interval_ms,
            GroupCoordinatorConfig().consumer_assignors) == (45000, 5000, ("uniform", "range"))
    config = GroupCoordinatorConfig.from_values({"group.consumer.assignors": "range, uniform",
                                                 "group.consumer.heartbeat.interval.ms": "500"})
    assert (config.consumer_assignors, config.consumer_heartbeat_interval_ms) == (("range", "uniform"), 500)


def test_a_member_waiting_for_unreleased_partitions_is_answered_when_they_are_free() -> None:
    h = ConsumerHarness(dataclasses.replace(CONFIG, consumer_unreleased_wait_ms=2000,
                                            consumer_initial_assignment_delay_ms=0, consumer_steady_hold_ms=0))
    h.allow_held = True
    t = h.topic("t", 4)
    assert len(h.cjoin("a", ["t"]).assignment.topic_partitions[0].partitions) == 4
    # everything is a's: b's join (a change) is answered at once, b is asked back soon
    joined = h.cjoin("b", ["t"])
    assert (joined.member_epoch, joined.assignment.topic_partitions, joined.heartbeat_interval_ms) == (2, [], 500)
    held = h.hb("b", 2, owned={})  # nothing new: b waits
    assert isinstance(held, Deferred) and not held.done()
    r = h.hb("a", 1, owned={t: [0, 1, 2, 3]})  # a is told to revoke two partitions
    kept = r.assignment.topic_partitions[0].partitions
    assert len(kept) == 2 and not held.done()
    h.hb("a", 1, owned={t: kept})  # a revoked them: b is answered at once
    h.advance(0)
    response = held.result()
    assert (response.error_code, response.member_epoch) == (0, 2)
    assert sorted(response.assignment.topic_partitions[0].partitions) == sorted({0, 1, 2, 3} - set(kept))
    # Nothing to wait for: answered at once.
    assert not isinstance(h.hb("b", 2, owned={t: response.assignment.topic_partitions[0].partitions}), Deferred)


def test_a_waiting_member_is_answered_by_the_deadline() -> None:
    h = ConsumerHarness(dataclasses.replace(CONFIG, consumer_unreleased_wait_ms=2000,
                                            consumer_initial_assignment_delay_ms=0, consumer_steady_hold_ms=0,
                                            consumer_heartbeat_interval_ms=10000))
    h.allow_held = True
    h.topic("t", 2)
    h.cjoin("a", ["t"])
    joined = h.cjoin("b", ["t"])
    assert joined.heartbeat_interval_ms == 500  # asked back soon: that heartbeat may be held
    held = h.hb("b", 2, owned={})  # held below the interval it was told (librdkafka's timeout)
    h.advance(249)
    assert not held.done()
    h.advance(1)
    response = held.result()
    # still waiting: asked back just after a (not told yet) is expected back, 10 s after its join
    assert (response.error_code, response.member_epoch, response.assignment, response.heartbeat_interval_ms) == (
        0, 2, None, 10000 - 250 + 100)
    held = h.hb("b", 2, owned={})
    h.advance(1999)
    assert not held.done()
    h.advance(1)
    assert held.result().member_epoch == 2
    # A waiting member that is fenced meanwhile is told so.
    held = h.hb("b", 2, owned={})
    assert isinstance(held, Deferred)
    h.hb("b", -1)
    assert held.result().error_code == E.UNKNOWN_MEMBER_ID
    assert GroupCoordinatorConfig(heartbeat_hold_ms=-1).unreleased_wait_ms == 2500
    assert GroupCoordinatorConfig(heartbeat_hold_ms=-1, consumer_heartbeat_interval_ms=500).unreleased_wait_ms == 250
    assert GroupCoordinatorConfig().unreleased_wait_ms == 0  # holds are off unless turned on


def test_first_members_wait_for_each_other() -> None:
    """A group that was empty computes its first assignment after a short delay; the joins are
    answered at once (nothing assigned yet, come back soon), the members' next heartbeats then,
    each with its share: nobody has anything to revoke."""
    h = ConsumerHarness(dataclasses.replace(CONFIG, consumer_unreleased_wait_ms=2000,
                                            consumer_initial_assignment_delay_ms=200, consumer_steady_hold_ms=0))
    h.allow_held = True
    h.topic("t", 6)
    joined = [h.cjoin("m%d" % i, ["t"]) for i in range(3)]
    # asked back when the first assignment is due
    assert [(r.member_epoch, r.assignment.topic_partitions, r.heartbeat_interval_ms) for r in joined] == [
        (1, [], 200)] * 3
    group = h.group()
    assert (group.group_epoch, group.state) == (4, GS.ASSIGNING)  # 2 for the first member, +1 per member
    assert all(m.member_epoch == 1 and not m.assigned for m in group.members.values())
    h.advance(150)
    held = [h.hb("m%d" % i, 1) for i in range(3)]  # a little early: held until the assignment
    assert all(isinstance(d, Deferred) and not d.done() for d in held)
    h.advance(49)
    assert not any(d.done() for d in held)
    h.advance(1)
    responses = [d.result() for d in held]
    assert [r.member_epoch for r in responses] == [4, 4, 4]
    assert sorted(len(r.assignment.topic_partitions[0].partitions) for r in responses) == [2, 2, 2]
    assert group.state is GS.STABLE
    assert GroupCoordinatorConfig().initial_assignment_delay_ms == 200
    assert dataclasses.replace(CONFIG, consumer_unreleased_wait_ms=0).initial_assignment_delay_ms == 0


def test_a_new_groups_literal_topics_come_before_its_regex_topics() -> None:
    """Kafka resolves regexes asynchronously: the first assignment has the literal topics only,
    the regex's partitions come a little later, with no delay added to the literal part."""
    config = dataclasses.replace(CONFIG, consumer_unreleased_wait_ms=2500, heartbeat_hold_ms=-1,
                                 consumer_initial_assignment_delay_ms=200)
    h = ConsumerHarness(config)
    h.allow_held = True
    h.topic("lit", 2)
    h.topic("orders-1", 2)
    joined = h.cjoin("a", ["lit"], regex="orders-.*")
    assert (joined.member_epoch, joined.assignment.topic_partitions) == (1, [])  # the group's initial delay
    assert joined.heartbeat_interval_ms == 200  # asked back when the first assignment is due
    h.advance(150)
    first = h.hb("a", 1)
    assert isinstance(first, Deferred) and not first.done()
    h.advance(50)
    literal = first.result()
    assert {tp.topic_id for tp in literal.assignment.topic_partitions} == {tid("lit")}
    h.advance(200)  # the regex is resolved once that is out
    assert h.group().resolved_regexes["orders-.*"].topics == frozenset(["orders-1"])
    later = h.hb("a", literal.member_epoch, topics=None, regex=None,
                 owned={tp.topic_id: tp.partitions for tp in literal.assignment.topic_partitions})
    h.advance(0)
    response = later.result() if isinstance(later, Deferred) else later
    assert {tp.topic_id for tp in response.assignment.topic_partitions} == {tid("lit"), tid("orders-1")}
