"""broker/partition/replica.py: the leader's rules for its followers, with an explicit clock."""

from __future__ import annotations

import pytest

from broker.partition.replica import (
    BrokerStatus,
    Followers,
    IsrChange,
    IsrState,
    ReplicaState,
    acks_all_outcome,
    can_join_isr,
    high_watermark_candidate,
    out_of_sync_replicas,
)
from protocol.errors import ErrorCode, KafkaError

LAG = 30_000


def test_a_fetch_at_the_leaders_end_is_caught_up_now():
    r = ReplicaState(2)
    r.update_fetch_state(10, 0, now_ms=1_000, leader_end_offset=10, broker_epoch=5, alive_epoch=5)
    assert (r.log_end_offset, r.last_caught_up_time_ms, r.broker_epoch) == (10, 1_000, 5)


def test_a_fetch_reaching_the_previous_fetchs_leader_end_was_caught_up_then():
    # Kafka's rule: a busy leader's follower is never exactly at the end, but each fetch reaches
    # where the leader ended at the previous fetch: caught up at the previous fetch's time
    r = ReplicaState(2)
    r.update_fetch_state(5, 0, now_ms=1_000, leader_end_offset=10, broker_epoch=5, alive_epoch=5)
    assert r.last_caught_up_time_ms == 0
    r.update_fetch_state(10, 0, now_ms=2_000, leader_end_offset=15, broker_epoch=5, alive_epoch=5)
    assert r.last_caught_up_time_ms == 1_000
    r.update_fetch_state(12, 0, now_ms=3_000, leader_end_offset=20, broker_epoch=5, alive_epoch=5)
    assert r.last_caught_up_time_ms == 1_000  # behind where the leader was at 2_000


def test_caught_up_within_the_lag_time():
    r = ReplicaState(2)
    r.update_fetch_state(10, 0, now_ms=1_000, leader_end_offset=10, broker_epoch=5, alive_epoch=5)
    assert r.is_caught_up(20, 1_000 + LAG, LAG)
    assert not r.is_caught_up(20, 1_001 + LAG, LAG)
    assert r.is_caught_up(10, 10**9, LAG)  # at the leader's end, whatever the time


def test_a_stale_broker_epoch_is_refused_and_changes_nothing():
    r = ReplicaState(2)
    with pytest.raises(KafkaError) as e:
        r.update_fetch_state(10, 0, now_ms=1_000, leader_end_offset=10, broker_epoch=4, alive_epoch=5)
    assert e.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert r.log_end_offset == -1
    # -1 (the follower did not say) and an epoch not known alive pass
    r.update_fetch_state(10, 0, now_ms=1_000, leader_end_offset=10, broker_epoch=-1, alive_epoch=5)
    r.update_fetch_state(11, 0, now_ms=1_000, leader_end_offset=11, broker_epoch=3, alive_epoch=None)
    assert r.log_end_offset == 11


def test_reset_on_a_new_leader_forgets_the_follower_but_keeps_the_isr_caught_up():
    r = ReplicaState(2)
    r.update_fetch_state(10, 0, now_ms=1_000, leader_end_offset=10, broker_epoch=5, alive_epoch=5)
    r.reset(now_ms=9_000, leader_end_offset=12, new_leader=True, in_sync=True)
    assert (r.log_end_offset, r.last_caught_up_time_ms, r.broker_epoch) == (-1, 9_000, None)
    r.reset(now_ms=9_000, leader_end_offset=12, new_leader=False, in_sync=False)
    assert (r.last_caught_up_time_ms, r.last_fetch_time_ms, r.last_fetch_leader_log_end_offset) == (0, 0, 12)


def _followers(*ends: tuple[int, int, int]) -> Followers:
    """(broker id, log end, last caught up time) of each follower of leader 1."""
    f = Followers(1)
    f.assign([1] + [b for b, _, _ in ends])
    for b, end, caught in ends:
        state = f.states[b]
        state.log_end_offset, state.last_caught_up_time_ms, state.broker_epoch = end, caught, 7
    return f


def test_high_watermark_is_the_smallest_end_of_the_isr():
    f = _followers((2, 8, 0), (3, 5, 0))
    assert high_watermark_candidate(10, f, IsrState((1, 2, 3)), 100_000, LAG, None) == 5
    assert high_watermark_candidate(10, f, IsrState((1, 2)), 100_000, LAG, None) == 8
    assert high_watermark_candidate(10, f, IsrState((1,)), 100_000, LAG, None) == 10


def test_high_watermark_waits_for_a_caught_up_follower_about_to_join():
    f = _followers((2, 8, 90_000))
    assert high_watermark_candidate(10, f, IsrState((1,)), 100_000, LAG, None) == 8
    # not if its broker may not join (fenced, shutting down, or another broker epoch)
    statuses = {2: BrokerStatus(None, fenced=True)}
    assert high_watermark_candidate(10, f, IsrState((1,)), 100_000, LAG, statuses.get) == 10
    assert high_watermark_candidate(10, f, IsrState((1,)), 100_000, LAG, {2: BrokerStatus(8)}.get) == 10
    assert high_watermark_candidate(10, f, IsrState((1,)), 100_000, LAG, {2: BrokerStatus(7)}.get) == 8


def test_the_maximal_isr_counts_a_pending_expansion_but_not_a_pending_shrink():
    f = _followers((2, 4, 0), (3, 9, 0))
    expanding = IsrState((1, 3)).expand(2)
    assert expanding.change is IsrChange.EXPAND and expanding.maximal_isr == {1, 2, 3}
    assert high_watermark_candidate(10, f, expanding, 100_000, LAG, None) == 4
    shrinking = IsrState((1, 2, 3)).shrink([2])
    assert shrinking.sent_isr == (1, 3) and shrinking.maximal_isr == {1, 2, 3}
    assert high_watermark_candidate(10, f, shrinking, 100_000, LAG, None) == 4
    assert shrinking.committed() == IsrState((1, 2, 3))


def test_out_of_sync_followers():
    f = _followers((2, 10, 0), (3, 7, 95_000), (4, 7, 10_000))
    isr = IsrState((1, 2, 3, 4))
    assert out_of_sync_replicas(isr, f, 10, 100_000, LAG) == {4}
    assert out_of_sync_replicas(isr.shrink([4]), f, 10, 100_000, LAG) == set()  # one change at a time


def test_joining_the_isr_needs_the_high_watermark_and_the_current_epoch():
    f = _followers((2, 10, 0))
    r = f.states[2]
    assert can_join_isr(r, IsrState((1,)), 10, 3, f, None)
    assert not can_join_isr(r, IsrState((1,)), 11, 3, f, None)  # below the high watermark
    assert not can_join_isr(r, IsrState((1,)), 10, 11, f, None)  # not into this leader epoch yet
    assert not can_join_isr(r, IsrState((1, 2)), 10, 3, f, None)  # already in
    assert not can_join_isr(r, IsrState((1,)).expand(2), 10, 3, f, None)  # a change in flight
    assert not can_join_isr(r, IsrState((1,)), 10, 3, f, {2: BrokerStatus(7, shutting_down=True)}.get)


def test_acks_all_outcome():
    assert acks_all_outcome(9, 10, 3, 2) is None
    assert acks_all_outcome(10, 10, 3, 2) == ErrorCode.NONE
    assert acks_all_outcome(10, 10, 1, 2) == ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


def test_followers_follow_the_replicas():
    f = Followers(1)
    f.assign([1, 2, 3])
    assert sorted(f.states) == [2, 3]
    f.states[2].log_end_offset = 5
    f.assign([3, 2, 4])
    assert sorted(f.states) == [2, 3, 4] and f.states[2].log_end_offset == 5
