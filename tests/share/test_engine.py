"""The share-partition engine case by case, on a manual clock (time is an argument)."""

from __future__ import annotations

import pytest

from broker.coordinator.share.state import StateBatch
from broker.share.engine import (
    AckBatch,
    AckType,
    AcquiredRecords,
    FetchedBatch,
    SharePartition,
    ShareSettings,
    Transition,
)
from broker.share.inflight import RecordState
from protocol.errors import ErrorCode, KafkaError

S = RecordState
A = AcquiredRecords
LOCK = 30_000


def partition(**settings: object) -> SharePartition:
    sp = SharePartition(ShareSettings(**settings))  # type: ignore[arg-type]
    sp.load(0, 0, [])
    return sp


def log_batches(first: int, last: int, size: int = 1) -> list[FetchedBatch]:
    return [FetchedBatch(o, min(o + size - 1, last)) for o in range(first, last + 1, size)]


def fetch(sp: SharePartition, member: str, last: int, now: int = 0, max_records: int = 500,
          size: int = 1, **kw: object) -> list[AcquiredRecords]:
    offset = sp.next_fetch_offset()
    return sp.acquire(member, offset, log_batches(offset, last, size), max_records, 500, now, **kw)  # type: ignore


def done(sp: SharePartition, t: Transition, now: int = 0, ok: bool = True) -> None:
    sp.complete(t, ok, now)


def ack(sp: SharePartition, member: str, first: int, last: int, *types: int, now: int = 0) -> None:
    done(sp, sp.acknowledge(member, [AckBatch(first, last, list(types))], now), now)


def states(sp: SharePartition, first: int, last: int) -> list[tuple[S, int]]:
    out = []
    for o in range(first, last + 1):
        st = sp.state_of(o)
        assert st is not None
        out.append((st.state, st.delivery_count))
    return out


def test_acquire_accept_moves_the_start_offset() -> None:
    sp = partition()
    assert fetch(sp, "m1", 9) == [A(0, 9, 1)]
    assert sp.next_fetch_offset() == 10
    ack(sp, "m1", 0, 9, AckType.ACCEPT)
    assert (sp.start_offset, sp.next_fetch_offset(), sp.in_flight_count()) == (10, 10, 0)


def test_another_member_gets_the_next_records_not_the_same() -> None:
    sp = partition()
    assert fetch(sp, "m1", 4) == [A(0, 4, 1)]
    assert fetch(sp, "m2", 9) == [A(5, 9, 1)]
    with pytest.raises(KafkaError) as err:
        sp.acknowledge("m2", [AckBatch(0, 4, [1])], 0)
    assert err.value.code is ErrorCode.INVALID_RECORD_STATE


def test_lock_expiry_redelivers_with_the_delivery_counted() -> None:
    sp = partition(record_lock_duration_ms=LOCK)
    fetch(sp, "m1", 4, now=0)
    assert sp.next_lock_deadline() == LOCK
    assert not sp.expire_locks(LOCK - 1)
    t = sp.expire_locks(LOCK)
    assert t.state_batches() == [StateBatch(0, 4, S.AVAILABLE, 1)]
    done(sp, t, LOCK)
    assert fetch(sp, "m2", 4, now=LOCK) == [A(0, 4, 2)]
    with pytest.raises(KafkaError):  # the first member's lock is gone
        sp.acknowledge("m1", [AckBatch(0, 4, [1])], LOCK)


def test_release_until_the_delivery_limit_then_archived() -> None:
    sp = partition(delivery_count_limit=3)
    for attempt in (1, 2, 3):
        assert fetch(sp, "m1", 0) == [A(0, 0, attempt)]
        ack(sp, "m1", 0, 0, AckType.RELEASE)
    assert sp.start_offset == 1  # archived: never delivered again
    assert fetch(sp, "m1", 0) == []


def test_reject_is_never_redelivered() -> None:
    sp = partition()
    fetch(sp, "m1", 2)
    ack(sp, "m1", 0, 2, AckType.ACCEPT, AckType.REJECT, AckType.ACCEPT)
    assert sp.start_offset == 3


def test_partial_acknowledgement_tracks_offsets_and_the_gap_type() -> None:
    sp = partition()
    fetch(sp, "m1", 4, size=5)
    ack(sp, "m1", 1, 2, AckType.RELEASE)
    assert states(sp, 0, 4) == [(S.ACQUIRED, 1), (S.AVAILABLE, 1), (S.AVAILABLE, 1), (S.ACQUIRED, 1), (S.ACQUIRED, 1)]
    assert sp.next_fetch_offset() == 1
    ack(sp, "m1", 0, 0, AckType.GAP)
    assert sp.start_offset == 1
    assert fetch(sp, "m2", 4, size=5) == [A(1, 2, 2)]


def test_a_failed_acknowledgement_changes_nothing() -> None:
    sp = partition()
    fetch(sp, "m1", 9)
    with pytest.raises(KafkaError) as err:  # the second batch reaches past what was acquired
        sp.acknowledge("m1", [AckBatch(0, 4, [1]), AckBatch(5, 12, [1])], 0)
    assert err.value.code is ErrorCode.INVALID_REQUEST
    assert states(sp, 0, 9) == [(S.ACQUIRED, 1)] * 10
    with pytest.raises(KafkaError) as err:
        sp.acknowledge("m1", [AckBatch(0, 0, [7])], 0)
    assert err.value.code is ErrorCode.INVALID_REQUEST


def test_acknowledgement_waits_for_the_persister() -> None:
    sp = partition()
    fetch(sp, "m1", 4)
    t = sp.acknowledge("m1", [AckBatch(0, 4, [1])], 0)
    assert sp.start_offset == 0  # not until it is durable
    with pytest.raises(KafkaError):  # in flight: not again
        sp.acknowledge("m1", [AckBatch(0, 4, [1])], 0)
    done(sp, t, ok=False)  # the write failed: rolled back
    assert states(sp, 0, 4) == [(S.ACQUIRED, 1)] * 5
    ack(sp, "m1", 0, 4, AckType.ACCEPT)
    assert sp.start_offset == 5


def test_max_record_locks_caps_what_is_in_flight() -> None:
    sp = partition(max_record_locks=100)
    assert fetch(sp, "m1", 299, size=10) == [A(0, 99, 1)]
    assert not sp.can_acquire()
    assert fetch(sp, "m2", 299, size=10) == []
    ack(sp, "m1", 0, 9, AckType.ACCEPT)
    assert fetch(sp, "m2", 299, size=10) == [A(100, 109, 1)]


def test_batch_size_cuts_acquired_records_at_log_batch_boundaries() -> None:
    sp = partition()
    offset = sp.next_fetch_offset()
    got = sp.acquire("m1", offset, log_batches(0, 29, 10), 500, 15, 0)
    assert got == [A(0, 19, 1), A(20, 29, 1)]


def test_record_limit_mode_acquires_exactly_max_records() -> None:
    sp = partition()
    assert fetch(sp, "m1", 9, size=10, max_records=3, record_limit=True) == [A(0, 2, 1)]
    assert sp.next_fetch_offset() == 3
    assert fetch(sp, "m2", 9, size=10, max_records=4, record_limit=True) == [A(3, 6, 1)]
    # batch_optimized hands out whole log batches (max records is a soft limit)
    assert fetch(sp, "m3", 19, size=10, max_records=1) == [A(7, 9, 1)]
    assert fetch(sp, "m3", 19, size=10, max_records=1) == [A(10, 19, 1)]


def test_renew_extends_the_lock_without_a_write() -> None:
    sp = partition(record_lock_duration_ms=LOCK)
    fetch(sp, "m1", 0, now=0)
    t = sp.acknowledge("m1", [AckBatch(0, 0, [AckType.RENEW])], 20_000)
    assert not t
    done(sp, t, 20_000)
    assert not sp.expire_locks(LOCK)
    assert sp.expire_locks(20_000 + LOCK)


def test_a_record_often_delivered_goes_alone() -> None:
    sp = SharePartition(ShareSettings(delivery_count_limit=5))
    sp.load(0, 0, [StateBatch(0, 3, S.AVAILABLE, 1), StateBatch(4, 4, S.AVAILABLE, 4), StateBatch(5, 9, S.AVAILABLE, 1)])
    assert fetch(sp, "m1", 9) == [A(0, 3, 2)]
    assert fetch(sp, "m1", 9) == [A(4, 4, 5)]  # its last delivery: a poison record takes no other down
    assert fetch(sp, "m1", 9) == [A(5, 9, 2)]


def test_dead_letter_queue_goes_through_archiving() -> None:
    sp = partition(dlq=True, delivery_count_limit=2)
    fetch(sp, "m1", 2)
    ack(sp, "m1", 0, 2, AckType.REJECT, AckType.RELEASE, AckType.ACCEPT)
    assert states(sp, 0, 2) == [(S.ARCHIVING, 1), (S.AVAILABLE, 1), (S.ACKNOWLEDGED, 1)]
    assert sp.start_offset == 0  # ARCHIVING is not done yet
    assert sp.archiving() == [A(0, 0, 1)]
    t = sp.archived(0, 0)
    assert t.state_batches() == [StateBatch(0, 0, S.ARCHIVED, 1)]
    done(sp, t)
    assert sp.start_offset == 1


def test_a_closed_session_releases_without_counting_the_delivery() -> None:
    sp = partition()
    fetch(sp, "m1", 4)
    fetch(sp, "m2", 9)
    t = sp.release_member("m1", 0)
    assert t.state_batches() == [StateBatch(0, 4, S.AVAILABLE, 0)]
    done(sp, t)
    assert fetch(sp, "m3", 4) == [A(0, 4, 1)]


def test_an_unsent_acquisition_is_undone() -> None:
    """A ShareFetch answered empty for a client quota: its records are AVAILABLE again at once,
    with the delivery counts they had; nothing to persist, another member's records untouched."""
    sp = partition()
    assert fetch(sp, "m1", 4, size=5) == [A(0, 4, 1)]
    assert fetch(sp, "m2", 9) == [A(5, 9, 1)]
    assert sp.unacquire("m1", [A(0, 4, 1), A(5, 9, 1)]) == 5  # 5-9 are m2's
    assert states(sp, 0, 6) == [(S.AVAILABLE, 0)] * 5 + [(S.ACQUIRED, 1)] * 2
    assert fetch(sp, "m3", 4, size=5) == [A(0, 4, 1)]
    ack(sp, "m3", 0, 1, AckType.RELEASE)  # delivered once, released: the next delivery is the 2nd
    got = fetch(sp, "m1", 1)
    assert got == [A(0, 1, 2)]
    assert sp.unacquire("m1", [A(0, 0, 2)]) == 1  # part of what was acquired
    assert states(sp, 0, 1) == [(S.AVAILABLE, 1), (S.ACQUIRED, 2)]
    assert fetch(sp, "m2", 0) == [A(0, 0, 2)]


def test_loading_persisted_state_restores_done_and_redelivers_the_rest() -> None:
    sp = SharePartition(ShareSettings())
    sp.load(10, 1, [StateBatch(10, 12, S.ACKNOWLEDGED, 1), StateBatch(15, 16, S.AVAILABLE, 2),
                    StateBatch(17, 17, S.ARCHIVED, 5)])
    assert sp.start_offset == 13
    assert states(sp, 13, 17) == [(S.AVAILABLE, 0), (S.AVAILABLE, 0), (S.AVAILABLE, 2), (S.AVAILABLE, 2),
                                  (S.ARCHIVED, 5)]
    got = sp.acquire("m1", sp.next_fetch_offset(), log_batches(13, 20), 500, 500, 0)
    assert got == [A(13, 14, 1), A(15, 16, 3), A(18, 20, 1)]


def test_log_start_moving_past_the_start_offset() -> None:
    sp = partition()
    fetch(sp, "m1", 4)
    ack(sp, "m1", 0, 4, AckType.RELEASE)
    sp.on_log_start(3)
    assert sp.start_offset == 3
    assert fetch(sp, "m1", 6) == [A(3, 4, 2), A(5, 6, 1)]
