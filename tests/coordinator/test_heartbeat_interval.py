"""Every ConsumerGroupHeartbeat is answered at once (no hold by default); a member waiting for
something the coordinator knows is coming is asked back when it is due (heartbeat_interval.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.heartbeat_interval import MIN_INTERVAL_MS, QUICK_INTERVAL_MS, SLACK_MS
from broker.coordinator.result import Deferred
from protocol.errors import ErrorCode
from tests.coordinator.consumer_harness import CONFIG, ConsumerHarness

E = ErrorCode
DELAYED = dataclasses.replace(CONFIG, consumer_initial_assignment_delay_ms=200)


def parts(response: Any) -> list[int]:
    return sorted(p for tp in response.assignment.topic_partitions for p in tp.partitions)


def test_nothing_is_held_by_default() -> None:
    assert GroupCoordinatorConfig().heartbeat_hold_ms == 0
    h = ConsumerHarness(dataclasses.replace(GroupCoordinatorConfig(), num_partitions=1))  # allow_held=False
    t = h.topic("t", 4)
    a = h.cjoin("a", ["t"])
    h.advance(200)
    a = h.hb("a", a.member_epoch, owned={})
    assert parts(a) == [0, 1, 2, 3]
    steady = h.hb("a", a.member_epoch, owned={t: [0, 1, 2, 3]})
    assert (steady.error_code, steady.assignment, steady.heartbeat_interval_ms) == (E.NONE, None, 5000)
    b = h.cjoin("b", ["t"])  # waits for a: answered at once all the same
    assert b.error_code == E.NONE and not isinstance(b, Deferred)


def test_the_first_members_are_asked_back_when_the_first_assignment_is_due() -> None:
    h = ConsumerHarness(DELAYED)
    h.topic("t", 6)
    joined = [h.cjoin("m%d" % i, ["t"]) for i in range(3)]
    assert [(r.member_epoch, r.assignment.topic_partitions, r.heartbeat_interval_ms) for r in joined] == [
        (1, [], 220)] * 3  # the delay, and 20 ms for its timer to have run
    h.advance(150)
    early = h.hb("m0", 1)  # a little early: nothing yet, back when it is due (not below 100 ms)
    assert (early.assignment, early.heartbeat_interval_ms) == (None, MIN_INTERVAL_MS)
    h.advance(70)
    answers = [h.hb("m%d" % i, 1) for i in range(3)]
    assert [len(parts(r)) for r in answers] == [2, 2, 2]
    assert {r.heartbeat_interval_ms for r in answers} == {5000}


def test_a_heartbeat_past_the_due_time_gets_the_assignment_before_the_timer_ran() -> None:
    h = ConsumerHarness(DELAYED)
    h.topic("t", 2)
    h.cjoin("a", ["t"])
    h.clock.advance(200)  # the timer fired; its operation waits behind the heartbeat
    assert parts(h.hb("a", 1)) == [0, 1]
    h.drain()  # the timer's operation: nothing left to do
    assert h.group().assignment_epoch == h.group().group_epoch


def test_a_waiting_member_comes_back_just_after_the_owner_learns_to_revoke() -> None:
    """b waits for partitions a owns; a learns at its next heartbeat (5 s after its last answer),
    revokes and says so at once: b is asked back just after that, not a whole interval later."""
    h = ConsumerHarness()
    t = h.topic("t", 4)
    a = h.cjoin("a", ["t"])
    assert parts(a) == [0, 1, 2, 3] and a.heartbeat_interval_ms == 5000
    h.advance(1000)
    b = h.cjoin("b", ["t"])
    assert (b.assignment.topic_partitions, b.heartbeat_interval_ms) == ([], 4000 + SLACK_MS)
    h.advance(4000)
    told = h.hb("a", 1, owned={t: [0, 1, 2, 3]})
    kept = parts(told)
    assert len(kept) == 2
    # b coming back meanwhile: a was told, it acknowledges soon
    assert h.hb("b", 2, owned={}).heartbeat_interval_ms == QUICK_INTERVAL_MS
    h.hb("a", 1, owned={t: kept})  # revoked
    h.advance(SLACK_MS)
    got = h.hb("b", 2, owned={})
    assert parts(got) == sorted({0, 1, 2, 3} - set(kept)) and got.heartbeat_interval_ms == 5000


def test_a_waiting_member_whose_owner_was_not_heard_since_the_load_gets_the_interval() -> None:
    h = ConsumerHarness()
    h.topic("t", 2)
    h.cjoin("a", ["t"])
    h = h.reload()
    assert h.cjoin("b", ["t"]).heartbeat_interval_ms == 5000


def test_literal_topics_first_then_the_regex_topics_at_the_next_heartbeat_asked_soon() -> None:
    """As in Kafka the regex is resolved after the answer that gives the literal topics; its
    topics come at the member's next heartbeat, which it is asked to send soon."""
    h = ConsumerHarness(DELAYED)
    h.topic("lit", 2)
    h.topic("orders-1", 2)
    lit, orders = h.metadata.topic("lit").topic_id, h.metadata.topic("orders-1").topic_id  # type: ignore[union-attr]
    joined = h.cjoin("a", ["lit"], regex="orders-.*")
    assert (joined.assignment.topic_partitions, joined.heartbeat_interval_ms) == ([], 220)
    h.advance(1000)  # long after the delay: the regex is still not resolved
    assert not h.group().resolved_regexes
    first = h.hb("a", 1)
    assert {tp.topic_id for tp in first.assignment.topic_partitions} == {lit}
    assert first.heartbeat_interval_ms == QUICK_INTERVAL_MS  # the regex is resolved right after
    h.advance(0)
    assert set(h.group().resolved_regexes) == {"orders-.*"}
    second = h.hb("a", first.member_epoch, owned={lit: [0, 1]})
    assert {tp.topic_id for tp in second.assignment.topic_partitions} == {lit, orders}
