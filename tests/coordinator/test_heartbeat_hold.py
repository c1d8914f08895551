"""Held heartbeats (group.heartbeat.hold.ms): a member with nothing to do gets its heartbeat
answered when there is news for it, or at the hold's deadline, or when the server releases it;
the answer is always the one a heartbeat arriving at that moment would get."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer_wait import carries_change
from broker.coordinator.group.held import MAX_LOOKS_AT_ONCE, HeldBook
from broker.coordinator.group.member import ConsumerGroupMember
from broker.coordinator.group.share_wait import carries_change as share_carries_change
from broker.coordinator.result import Deferred
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.coordinator.consumer_harness import CONFIG as CONSUMER_CONFIG
from tests.coordinator.consumer_harness import ConsumerHarness
from tests.coordinator.harness import TEST_CONFIG, ShardHarness

E = ErrorCode
SESSION_MS = 10000  # the harness's JoinGroup session timeout: holds of 3333 ms
HOLD_MS = SESSION_MS // 3


def held_heartbeat(h: ShardHarness, group_id: str, member_id: str, generation: int,
                   instance: str | None = None) -> Deferred[Any]:
    request = M.HeartbeatRequest(group_id=group_id, generation_id=generation, member_id=member_id,
                                 group_instance_id=instance)
    response = h.call(lambda s, now: s.heartbeat(request, now))
    assert isinstance(response, Deferred) and not response.done()
    return response


@pytest.fixture
def h() -> ShardHarness:
    return ShardHarness(dataclasses.replace(TEST_CONFIG, heartbeat_hold_ms=-1))


def test_hold_lengths() -> None:
    auto = GroupCoordinatorConfig.from_values({"group.heartbeat.hold.ms": "-1"})
    assert (auto.classic_hold_ms(10000), auto.classic_hold_ms(45000)) == (3333, 5000)
    assert (auto.steady_hold_ms, auto.unreleased_wait_ms) == (4000, 2500)
    capped = GroupCoordinatorConfig(heartbeat_hold_ms=60000)
    assert (capped.classic_hold_ms(45000), capped.classic_hold_ms(300000), capped.steady_hold_ms) == (15000, 60000,
                                                                                                       4000)
    # off unless turned on, as Kafka answers every heartbeat at once (the initial delay stays)
    for off in (GroupCoordinatorConfig(), GroupCoordinatorConfig.from_values({"group.heartbeat.hold.ms": "0"})):
        assert (off.classic_hold_ms(45000), off.steady_hold_ms, off.unreleased_wait_ms) == (0, 0, 0)
        assert off.initial_assignment_delay_ms == 200
    assert GroupCoordinatorConfig(heartbeat_hold_ms=-1, consumer_heartbeat_interval_ms=1000).steady_hold_ms == 500


def test_classic_heartbeat_is_answered_at_the_deadline_and_renews_the_session(h: ShardHarness) -> None:
    (leader, follower), gen = h.form_group("g", 2)
    held = held_heartbeat(h, "g", follower, gen)
    h.advance(HOLD_MS - 1)
    assert not held.done()
    h.advance(1)
    assert held.result().error_code == E.NONE
    # The session runs from the answer: the follower survives a whole session after it.
    held_heartbeat(h, "g", leader, gen)
    h.advance(SESSION_MS - 1)
    assert follower in h.group("g").members


def test_classic_heartbeat_learns_of_a_rebalance_at_once(h: ShardHarness) -> None:
    (leader, follower), gen = h.form_group("g", 2)
    held = [held_heartbeat(h, "g", m, gen) for m in (leader, follower)]
    h.join_new("g")  # a third member: the group prepares to rebalance
    assert [d.result().error_code for d in held] == [E.REBALANCE_IN_PROGRESS] * 2


def test_classic_heartbeat_of_a_removed_member(h: ShardHarness) -> None:
    (leader, follower), gen = h.form_group("g", 2)
    held = held_heartbeat(h, "g", follower, gen)
    other = held_heartbeat(h, "g", leader, gen)
    h.leave("g", (follower, None))  # e.g. on another connection
    assert held.result().error_code == E.UNKNOWN_MEMBER_ID
    assert other.result().error_code == E.REBALANCE_IN_PROGRESS


def test_classic_heartbeat_released_by_the_server(h: ShardHarness) -> None:
    (_, follower), gen = h.form_group("g", 2)
    held = held_heartbeat(h, "g", follower, gen)
    h.run(lambda s, now: s.release_heartbeat("g", follower, now))
    assert held.result().error_code == E.NONE
    h.run(lambda s, now: s.release_heartbeat("g", follower, now))  # nothing held: nothing happens
    assert not h.timer.is_scheduled("heartbeat-hold-g-%s" % follower)  # the deadline is cancelled


def test_classic_heartbeat_of_a_replaced_static_member(h: ShardHarness) -> None:
    first = h.join("g", instance="i1", session_ms=SESSION_MS)
    h.advance(TEST_CONFIG.initial_rebalance_delay_ms)
    joined = first.result()
    h.sync("g", joined.member_id, joined.generation_id, instance="i1",
           assignments={joined.member_id: b"a"}).result()
    held = held_heartbeat(h, "g", joined.member_id, joined.generation_id, instance="i1")
    h.join("g", instance="i1", session_ms=SESSION_MS)  # the instance restarted under a new member id
    assert held.result().error_code == E.FENCED_INSTANCE_ID


def test_classic_heartbeats_are_answered_when_the_shard_unloads(h: ShardHarness) -> None:
    (leader, _), gen = h.form_group("g", 2)
    held = held_heartbeat(h, "g", leader, gen)
    h.shard.on_unloaded()
    assert held.result().error_code == E.NOT_COORDINATOR


def test_no_hold_outside_a_stable_group_or_when_disabled(h: ShardHarness) -> None:
    (leader, follower), gen = h.form_group("g", 2)
    h.join_new("g")
    assert h.heartbeat("g", leader, gen) == E.REBALANCE_IN_PROGRESS  # answered at once
    off = ShardHarness()  # heartbeat_hold_ms=0
    (leader, _), gen = off.form_group("g", 2)
    assert off.heartbeat("g", leader, gen) == E.NONE


def test_classic_initial_join_gathers_members_even_without_a_delay() -> None:
    config = dataclasses.replace(TEST_CONFIG, initial_rebalance_delay_ms=0, classic_min_initial_delay_ms=200)
    h = ShardHarness(config)
    first = h.join_new("g")
    first_join = h.pending
    h.advance(150)
    second = h.join_new("g")
    assert not first_join.done()
    h.advance(50)
    joined = first_join.result()
    assert joined.error_code == E.NONE and {m.member_id for m in joined.members} == {first, second}
    assert GroupCoordinatorConfig().initial_join_delay_ms == 3000


# ----- KIP-848 consumer groups ------------------------------------------------------------------
STEADY = dataclasses.replace(CONSUMER_CONFIG, heartbeat_hold_ms=-1, consumer_unreleased_wait_ms=-1,
                             consumer_initial_assignment_delay_ms=0)


def steady_pair() -> tuple[ConsumerHarness, Any, dict[str, list[int]]]:
    """Members a and b of group g own two partitions each of t and have acknowledged them."""
    h = ConsumerHarness(STEADY)
    h.allow_held = True
    t = h.topic("t", 4)
    a = h.cjoin("a", ["t"])
    assert sorted(a.assignment.topic_partitions[0].partitions) == [0, 1, 2, 3]
    joined = h.cjoin("b", ["t"])  # a join is answered at once, b to come back soon
    assert (joined.assignment.topic_partitions, joined.heartbeat_interval_ms) == ([], 500)
    b = h.hb("b", 2, owned={})  # waits for partitions a still owns
    assert isinstance(b, Deferred)
    revoke = h.hb("a", 1, owned={t: [0, 1, 2, 3]})
    kept = revoke.assignment.topic_partitions[0].partitions
    revoked = h.hb("a", 1, owned={t: kept})  # a revoked (news for the coordinator): answered at once
    assert not isinstance(revoked, Deferred)
    assert (revoked.member_epoch, revoked.assignment, revoked.heartbeat_interval_ms) == (2, None, 500)
    h.advance(0)
    got = b.result().assignment.topic_partitions[0].partitions
    # both come back with nothing new: held (a below the short interval it was told)
    acked = [h.hb("a", 2, owned={t: kept}), h.hb("b", 2, owned={t: got})]
    assert all(isinstance(d, Deferred) for d in acked)
    h.advance(STEADY.steady_hold_ms)
    assert [d.result().heartbeat_interval_ms for d in acked] == [5000, 5000]
    return h, t, {"a": sorted(kept), "b": sorted(got)}


def test_a_steady_member_is_held_until_the_deadline() -> None:
    h, t, owned = steady_pair()
    held = h.hb("a", 2, owned={t: owned["a"]})
    assert isinstance(held, Deferred)
    h.advance(STEADY.steady_hold_ms - 1)
    assert not held.done()
    h.advance(1)
    response = held.result()
    assert (response.error_code, response.member_epoch, response.assignment) == (E.NONE, 2, None)


def test_a_steady_member_takes_over_the_partitions_of_one_that_leaves() -> None:
    h, t, owned = steady_pair()
    held = h.hb("a", 2, owned={t: owned["a"]})
    h.hb("b", -1)  # b leaves
    h.advance(0)
    response = held.result()
    assert response.member_epoch == 3
    assert sorted(response.assignment.topic_partitions[0].partitions) == [0, 1, 2, 3]


def test_a_steady_member_learns_of_new_partitions() -> None:
    h, t, owned = steady_pair()
    held = h.hb("a", 2, owned={t: owned["a"]})
    h.topic("t", 6)  # CreatePartitions
    h.advance(0)
    response = held.result()
    assert response.member_epoch == 3 and len(response.assignment.topic_partitions[0].partitions) == 3


def test_a_steady_member_released_by_the_server() -> None:
    h, t, owned = steady_pair()
    held = h.hb("a", 2, owned={t: owned["a"]})
    h.run(lambda s, now: s.release_heartbeat("g", "a", now))
    response = held.result()
    assert (response.error_code, response.member_epoch, response.assignment) == (E.NONE, 2, None)
    # released early (a commit waits behind it): the member is asked back soon
    assert response.heartbeat_interval_ms == 500


def test_a_member_released_early_is_held_again_within_its_short_interval() -> None:
    """A member that commits all the time is nearly always held: released by a commit, it comes
    back within the short interval, and its next heartbeat is held less than that interval (the
    request's timeout in librdkafka) - and learns of a leave at once."""
    h, t, owned = steady_pair()
    held = h.hb("a", 2, owned={t: owned["a"]})
    h.run(lambda s, now: s.release_heartbeat("g", "a", now))
    assert held.result().heartbeat_interval_ms == 500
    again = h.hb("a", 2, owned={t: owned["a"]})
    assert isinstance(again, Deferred)
    h.advance(249)
    assert not again.done()
    h.advance(1)  # half of the 500 ms it was told
    answered = again.result()
    assert (answered.error_code, answered.heartbeat_interval_ms) == (E.NONE, 5000)  # back to the default
    # with the default interval again, the hold is the usual one
    normal = h.hb("a", 2, owned={t: owned["a"]})
    h.advance(STEADY.steady_hold_ms - 1)
    assert not normal.done()
    h.advance(1)
    assert normal.done()
    # released early again, then b leaves while a is held: a takes b's partitions at once
    early = h.hb("a", 2, owned={t: owned["a"]})
    h.run(lambda s, now: s.release_heartbeat("g", "a", now))
    assert early.result().heartbeat_interval_ms == 500
    held = h.hb("a", 2, owned={t: owned["a"]})
    h.hb("b", -1)
    h.advance(0)
    assert sorted(held.result().assignment.topic_partitions[0].partitions) == [0, 1, 2, 3]


# ----- a heartbeat carrying a change from the client is answered at once ----------------------
T = uuid.uuid5(uuid.NAMESPACE_DNS, "t")
BEFORE = ConsumerGroupMember("m", member_epoch=5, instance_id="i", subscribed_topic_names=frozenset(["t"]),
                             assigned={T: frozenset([0, 1])}, pending_revocation={T: frozenset([2])})


def hb_request(epoch: int = 5, **fields: Any) -> Any:
    """A heartbeat with nothing new, as librdkafka sends it in a steady group, but for `fields`."""
    values: dict[str, Any] = dict(group_id="g", member_id="m", member_epoch=epoch, instance_id=None, rack_id=None,
                                  rebalance_timeout_ms=-1, subscribed_topic_names=None, subscribed_topic_regex=None,
                                  server_assignor=None, topic_partitions=None)
    owned = fields.pop("owned", None)
    if owned is not None:
        values["topic_partitions"] = [M.ConsumerGroupHeartbeatRequest.TopicPartitions(topic_id=T, partitions=owned)]
    values.update(fields)
    return M.ConsumerGroupHeartbeatRequest(**values)


@pytest.mark.parametrize(("request_", "change"), [
    (hb_request(), False),
    (hb_request(epoch=4), False),  # a retry with the previous epoch brings nothing either
    (hb_request(epoch=0), True),  # (re)joining
    (hb_request(epoch=-1), True),  # leaving
    (hb_request(epoch=-2), True),  # a static member leaving
    (hb_request(subscribed_topic_names=["t", "missing"]), True),
    (hb_request(subscribed_topic_names=["t"]), True),  # subscribed again to the same topics
    (hb_request(subscribed_topic_names=[], subscribed_topic_regex="^t$"), True),
    (hb_request(rebalance_timeout_ms=60000), True),
    (hb_request(server_assignor="range"), True),
    (hb_request(rack_id="r1"), True),
    (hb_request(instance_id="i"), False),  # the Java client sends it every time
    (hb_request(instance_id="j"), True),
    (hb_request(owned=[0, 1, 2]), False),  # what the coordinator assigned: an acknowledgement
    (hb_request(owned=[2, 1, 0]), False),
    (hb_request(owned=[0, 1]), True),  # partition 2 revoked
    (hb_request(owned=[]), True),
    (hb_request(owned=[0, 1, 2, 3]), True),
])
def test_carries_change_field_by_field(request_: Any, change: bool) -> None:
    assert carries_change(request_, BEFORE) is change


@pytest.mark.parametrize(("share_request", "change"), [
    (M.ShareGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3), False),
    (M.ShareGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=0, subscribed_topic_names=["t"]), True),
    (M.ShareGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=-1), True),
    (M.ShareGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3, subscribed_topic_names=["t"]), True),
    (M.ShareGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3, subscribed_topic_names=[]), True),
    (M.ShareGroupHeartbeatRequest(group_id="g", member_id="m", member_epoch=3, rack_id="r1"), True),
])
def test_share_carries_change(share_request: Any, change: bool) -> None:
    assert share_carries_change(share_request) is change


@pytest.mark.parametrize("change", [
    dict(topics=["t", "missing"]),  # a topic that does not exist: the assignment stays the same
    dict(topics=["t"]),  # subscribed again to the same topics
    dict(topics=[], regex="^t$"),  # a regex matching the same topic
    dict(rebalance_timeout_ms=60000),
    dict(assignor="range"),
    dict(rack="r1"),
])
def test_a_steady_member_bringing_a_change_is_answered_at_once(change: dict[str, Any]) -> None:
    """The member waits to hear back about its change: answered at once, as Kafka does, and asked
    back soon, so that the heartbeat after it (nothing new) is held again."""
    h, t, owned = steady_pair()
    response = h.hb("a", 2, **change)
    assert not isinstance(response, Deferred) and response.error_code == E.NONE
    if response.assignment is not None:  # the regex is being resolved: its partitions change (as in Kafka)
        assert "regex" in change
        return
    assert response.heartbeat_interval_ms == 500  # (a new subscription bumps the epoch, not the assignment)
    after = h.hb("a", response.member_epoch, owned={t: owned["a"]})
    assert isinstance(after, Deferred)
    h.advance(249)
    assert not after.done()
    h.advance(1)  # within half of the 500 ms it was told
    assert after.result().heartbeat_interval_ms == 5000


def test_a_member_revoking_is_answered_at_once_and_a_rejoin_too() -> None:
    h, t, owned = steady_pair()
    # a rejoins (fenced, or its client restarted the membership): answered at once, asked back soon
    rejoined = h.cjoin("a", ["t"])
    assert not isinstance(rejoined, Deferred) and rejoined.error_code == E.NONE
    # a static member leaving, and a member leaving: answered at once
    left = h.hb("b", -1)
    assert not isinstance(left, Deferred) and (left.error_code, left.member_epoch) == (E.NONE, -1)


def test_a_waiting_member_bringing_a_change_is_answered_at_once() -> None:
    """A member waiting for partitions another still owns is held; one that changes its
    subscription meanwhile is answered at once (and held again at its next heartbeat)."""
    h = ConsumerHarness(dataclasses.replace(STEADY, consumer_unreleased_wait_ms=2000))
    h.allow_held = True
    t = h.topic("t", 4)
    h.cjoin("a", ["t"])
    assert h.cjoin("b", ["t"]).heartbeat_interval_ms == 500
    h.advance(500)
    held = h.hb("b", 2, owned={})
    assert isinstance(held, Deferred) and not held.done()
    h.run(lambda s, now: s.release_heartbeat("g", "b", now))
    changed = h.hb("b", 2, topics=["t", "missing"])
    assert not isinstance(changed, Deferred) and changed.heartbeat_interval_ms == 500
    again = h.hb("b", 2, owned={})
    assert isinstance(again, Deferred) and not again.done()
    del t


# ----- looking at held heartbeats again ---------------------------------------------------------
def test_a_held_static_member_leaving_for_a_while_gets_its_heartbeat_answered_once() -> None:
    """With holds on: the held heartbeat of a static member that leaves temporarily (epoch -2) is
    answered by the leave. It used to be looked at again as a leave, each look writing the leave
    anew and waking itself (the coordinator spun at one instant)."""
    config = dataclasses.replace(CONSUMER_CONFIG, heartbeat_hold_ms=-1)
    h = ConsumerHarness(config)
    h.allow_held = True
    t = h.topic("t", 2)
    s = h.cjoin("s", ["t"], instance="i")
    held = h.hb("s", s.member_epoch, owned={t: [0, 1]}, instance="i")
    assert isinstance(held, Deferred) and not held.done()
    logged = len(h.log)
    assert h.hb("s", -2, instance="i").error_code == E.NONE
    h.advance(0)
    assert held.done()
    assert len(h.log) == logged + 1  # the one leave record


def test_held_book_backstop() -> None:
    book: HeldBook[Any] = HeldBook(ConsumerHarness().timer)
    assert not any(book.looked_too_often("g", "m", 5) for _ in range(MAX_LOOKS_AT_ONCE))
    assert book.looked_too_often("g", "m", 5)
    assert not book.looked_too_often("g", "m", 6)  # a new instant
