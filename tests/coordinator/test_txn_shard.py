"""The transaction coordinator shard on a manual clock: Kafka's TransactionCoordinator checks,
the state table, fencing, timeouts, transactions v2, expiry, and replay equivalence."""

from __future__ import annotations

import dataclasses

import pytest

from broker.coordinator.result import Deferred
from broker.coordinator.txn.config import TransactionCoordinatorConfig
from broker.coordinator.txn.records import parse_key, parse_value
from broker.coordinator.txn.shard import compile_pattern
from broker.coordinator.txn.state import (
    SHORT_MAX,
    TRANSITIONS,
    TV_0,
    TV_2,
    IllegalTransition,
    TransactionMetadata,
    TransactionState,
)
from protocol.errors import ErrorCode
from tests.coordinator.txn_harness import TxnHarness, result_of

E = ErrorCode
S = TransactionState
TP = ("t", 0)
TP1 = ("t", 1)


@pytest.fixture
def h() -> TxnHarness:
    return TxnHarness()


def without_last_epoch(txns: dict[str, TransactionMetadata]) -> dict[str, TransactionMetadata]:
    return {k: dataclasses.replace(v, last_producer_epoch=-1) for k, v in txns.items()}


# ----- InitProducerId ----------------------------------------------------------------------
def test_init_producer_id_allocates_then_bumps_the_epoch(h: TxnHarness) -> None:
    r = h.init("tx")
    assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, 1000, 0)
    assert h.meta("tx").state is S.EMPTY and len(h.log) == 1
    r2 = h.init("tx", timeout_ms=5000)
    assert (r2.error, r2.producer_id, r2.producer_epoch) == (E.NONE, 1000, 1)
    assert h.meta("tx").txn_timeout_ms == 5000


@pytest.mark.parametrize("timeout", [0, -1, 900001])
def test_init_producer_id_rejects_timeouts_out_of_range(h: TxnHarness, timeout: int) -> None:
    assert h.init("tx", timeout_ms=timeout).error == E.INVALID_TRANSACTION_TIMEOUT
    assert not h.log and "tx" not in h.shard.txns


def test_init_producer_id_rejects_an_empty_transactional_id(h: TxnHarness) -> None:
    assert h.init("").error == E.INVALID_REQUEST


def test_kip_360_recovery_with_the_expected_epoch(h: TxnHarness) -> None:
    r = h.init("tx")
    bumped = h.init("tx", expected=(r.producer_id, r.producer_epoch))
    assert (bumped.error, bumped.producer_epoch) == (E.NONE, 1)
    # a retry of that call (its response was lost) gets the same epoch again
    retry = h.init("tx", expected=(r.producer_id, r.producer_epoch))
    assert (retry.error, retry.producer_epoch) == (E.NONE, 1)
    # a producer that was fenced since cannot come back
    h.init("tx")  # epoch 2, last epoch forgotten
    assert h.init("tx", expected=(r.producer_id, 0)).error == E.PRODUCER_FENCED
    assert h.init("tx", expected=(999, 0)).error == E.PRODUCER_FENCED


def test_exhausted_epochs_rotate_the_producer_id(h: TxnHarness) -> None:
    h.init("tx")
    h.shard.txns["tx"] = dataclasses.replace(h.meta("tx"), producer_epoch=SHORT_MAX - 1)
    r = h.init("tx")
    assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, 1001, 0)
    assert h.meta("tx").prev_producer_id == 1000


# ----- AddPartitionsToTxn ------------------------------------------------------------------
def test_add_partitions_opens_a_transaction(h: TxnHarness) -> None:
    r = h.init("tx")
    assert h.add("tx", r.producer_id, r.producer_epoch, TP) == E.NONE
    meta = h.meta("tx")
    assert meta.state is S.ONGOING and meta.partitions == {TP} and meta.txn_start_timestamp == h.now
    h.clock.advance(10)
    records = len(h.log)
    assert h.add("tx", r.producer_id, r.producer_epoch, TP) == E.NONE
    assert len(h.log) == records  # nothing new: nothing written
    assert h.add("tx", r.producer_id, r.producer_epoch, TP1) == E.NONE
    assert h.meta("tx").partitions == {TP, TP1} and h.meta("tx").txn_start_timestamp == h.now - 10


def test_add_partitions_checks_the_producer(h: TxnHarness) -> None:
    r = h.init("tx")
    assert h.add("unknown", r.producer_id, 0, TP) == E.INVALID_PRODUCER_ID_MAPPING
    assert h.add("tx", r.producer_id + 1, 0, TP) == E.INVALID_PRODUCER_ID_MAPPING
    assert h.add("tx", r.producer_id, 7, TP) == E.PRODUCER_FENCED
    assert h.add("", r.producer_id, 0, TP) == E.INVALID_REQUEST
    assert h.meta("tx").state is S.EMPTY


def test_verify_partitions(h: TxnHarness) -> None:
    r = h.begin("tx", TP)
    verify = h.shard.verify_partitions
    assert verify("tx", r.producer_id, 0, [TP, TP1]) == {TP: E.NONE, TP1: E.TRANSACTION_ABORTABLE}
    assert verify("tx", r.producer_id, 1, [TP]) == {TP: E.PRODUCER_FENCED}
    assert verify("nope", r.producer_id, 0, [TP]) == {TP: E.INVALID_PRODUCER_ID_MAPPING}


# ----- EndTxn ------------------------------------------------------------------------------
@pytest.mark.parametrize("committed", [True, False])
def test_end_txn_prepares_then_completes_after_the_markers(h: TxnHarness, committed: bool) -> None:
    r = h.begin("tx", TP, TP1)
    response = h.end("tx", r.producer_id, r.producer_epoch, committed)
    assert isinstance(response, Deferred) and not response.done()
    assert h.meta("tx").state is (S.PREPARE_COMMIT if committed else S.PREPARE_ABORT)
    [completion] = h.completions
    assert (completion.producer_id, completion.producer_epoch, completion.committed) == (1000, 0, committed)
    assert completion.partitions == {TP, TP1}
    # meanwhile the producer waits
    assert h.add("tx", r.producer_id, r.producer_epoch, TP) == E.CONCURRENT_TRANSACTIONS
    assert h.init("tx").error == E.CONCURRENT_TRANSACTIONS
    assert result_of(h.end("tx", r.producer_id, r.producer_epoch, committed)).error == E.CONCURRENT_TRANSACTIONS
    assert result_of(h.end("tx", r.producer_id, r.producer_epoch, not committed)).error == E.INVALID_TXN_STATE
    h.complete()
    assert response.done() and response.result().error == E.NONE
    meta = h.meta("tx")
    assert meta.state is (S.COMPLETE_COMMIT if committed else S.COMPLETE_ABORT) and meta.partitions == frozenset()
    # a retry of the same end is answered NONE, the other end is the wrong state
    assert result_of(h.end("tx", r.producer_id, r.producer_epoch, committed)).error == E.NONE
    assert result_of(h.end("tx", r.producer_id, r.producer_epoch, not committed)).error == E.INVALID_TXN_STATE
    # the next transaction starts from the completed one
    assert h.add("tx", r.producer_id, r.producer_epoch, TP1) == E.NONE
    assert h.meta("tx").state is S.ONGOING and h.meta("tx").partitions == {TP1}


def test_end_txn_without_a_transaction_is_an_invalid_state(h: TxnHarness) -> None:
    r = h.init("tx")
    for committed in (True, False):
        assert result_of(h.end("tx", r.producer_id, r.producer_epoch, committed)).error == E.INVALID_TXN_STATE
    assert result_of(h.end("nope", r.producer_id, 0, True)).error == E.INVALID_PRODUCER_ID_MAPPING
    assert result_of(h.end("tx", r.producer_id, 3, True)).error == E.PRODUCER_FENCED
    assert not h.completions and h.meta("tx").state is S.EMPTY


def test_complete_of_a_stale_completion_writes_nothing(h: TxnHarness) -> None:
    r = h.begin("tx", TP)
    h.end("tx", r.producer_id, r.producer_epoch, True)
    [c] = h.completions
    h.complete()
    records = len(h.log)
    assert h.call(lambda s, now: s.complete_txn(c, now)).state is S.COMPLETE_COMMIT
    assert len(h.log) == records


# ----- fencing and timeouts ----------------------------------------------------------------
@pytest.mark.parametrize("tv, fenced_epoch", [(TV_0, 1), (TV_2, 2)])
def test_a_new_producer_fences_the_open_transaction(tv: int, fenced_epoch: int) -> None:
    h = TxnHarness(TransactionCoordinatorConfig(num_partitions=1, transaction_version=tv))
    old = h.begin("tx", TP)
    response = h.init("tx")
    assert isinstance(response, Deferred) and not response.done()
    meta = h.meta("tx")
    assert meta.state is S.PREPARE_ABORT and meta.producer_epoch == fenced_epoch
    [c] = h.completions
    assert not c.committed and c.producer_epoch == fenced_epoch and c.partitions == {TP}
    h.complete()
    assert response.result().error == E.CONCURRENT_TRANSACTIONS  # the new producer retries
    r = h.init("tx")
    assert (r.error, r.producer_id, r.producer_epoch) == (E.NONE, old.producer_id, fenced_epoch + 1)
    # the zombie is fenced everywhere
    assert h.add("tx", old.producer_id, old.producer_epoch, TP) == E.PRODUCER_FENCED
    assert result_of(h.end("tx", old.producer_id, old.producer_epoch, True)).error == E.PRODUCER_FENCED


def test_timed_out_transactions_are_aborted() -> None:
    h = TxnHarness(TransactionCoordinatorConfig(num_partitions=1, abort_timed_out_interval_ms=1000))
    r = h.init("tx", timeout_ms=5000)
    h.add("tx", r.producer_id, r.producer_epoch, TP)
    other = h.begin("young", TP1)
    h.advance(4000)
    assert not h.completions
    h.add("young", other.producer_id, other.producer_epoch, TP)  # a new partition does not restart the clock
    h.advance(2000)
    assert [c.transactional_id for c in h.completions] == ["tx"]
    assert h.meta("tx").state is S.PREPARE_ABORT and h.meta("young").state is S.ONGOING
    h.complete()
    assert h.meta("tx").state is S.COMPLETE_ABORT
    assert result_of(h.end("tx", r.producer_id, r.producer_epoch, True)).error == E.PRODUCER_FENCED


def test_a_load_resumes_prepared_transactions(h: TxnHarness) -> None:
    r = h.begin("tx", TP)
    h.end("tx", r.producer_id, r.producer_epoch, True)
    o = h.begin("open", TP1)
    h2 = h.reload()
    [c] = h2.completions
    assert (c.transactional_id, c.committed, c.partitions) == ("tx", True, {TP})
    h2.complete()
    assert h2.meta("tx").state is S.COMPLETE_COMMIT and h2.meta("open").state is S.ONGOING
    # the open one is left to its timeout; its producer can go on
    assert h2.add("open", o.producer_id, o.producer_epoch, TP) == E.NONE


# ----- transactions v2 (KIP-890 part 2) ------------------------------------------------------
def test_v2_end_bumps_the_epoch_and_retries_are_recognised(h: TxnHarness) -> None:
    r = h.init("tx")
    assert h.add("tx", r.producer_id, r.producer_epoch, TP, tv=TV_2) == E.NONE
    response = h.end("tx", r.producer_id, r.producer_epoch, True, tv=TV_2)
    [c] = h.completions
    assert c.producer_epoch == r.producer_epoch + 1 and c.transaction_version == TV_2
    # a retry while the markers are written
    assert result_of(h.end("tx", r.producer_id, r.producer_epoch, True, tv=TV_2)).error == E.CONCURRENT_TRANSACTIONS
    h.complete()
    done = response.result()
    assert (done.error, done.producer_id, done.producer_epoch) == (E.NONE, r.producer_id, r.producer_epoch + 1)
    # a retry after completion: NONE and the epoch to go on with
    retry = result_of(h.end("tx", r.producer_id, r.producer_epoch, True, tv=TV_2))
    assert (retry.error, retry.producer_epoch) == (E.NONE, r.producer_epoch + 1)
    # the old epoch may not open the next transaction
    assert h.add("tx", r.producer_id, r.producer_epoch, TP, tv=TV_2) == E.PRODUCER_FENCED
    assert h.add("tx", r.producer_id, r.producer_epoch + 1, TP, tv=TV_2) == E.NONE


def test_v2_abort_without_a_transaction_bumps_the_epoch(h: TxnHarness) -> None:
    r = h.init("tx")
    assert result_of(h.end("tx", r.producer_id, r.producer_epoch, True, tv=TV_2)).error == E.INVALID_TXN_STATE
    response = h.end("tx", r.producer_id, r.producer_epoch, False, tv=TV_2)
    [c] = h.completions
    assert c.partitions == frozenset() and not c.committed
    h.complete()
    assert response.result().producer_epoch == r.producer_epoch + 1
    assert h.meta("tx").state is S.COMPLETE_ABORT


def test_v2_epoch_overflow_moves_to_a_new_producer_id(h: TxnHarness) -> None:
    r = h.init("tx")
    h.shard.txns["tx"] = dataclasses.replace(h.meta("tx"), producer_epoch=SHORT_MAX - 1)
    assert h.add("tx", r.producer_id, SHORT_MAX - 1, TP, tv=TV_2) == E.NONE
    response = h.end("tx", r.producer_id, SHORT_MAX - 1, True, tv=TV_2)
    assert h.completions[0].producer_epoch == SHORT_MAX  # the markers fence the old id's epochs
    h.complete()
    done = response.result()
    assert (done.producer_id, done.producer_epoch) == (1001, 0)
    assert h.meta("tx").producer_id == 1001 and h.meta("tx").prev_producer_id == r.producer_id
    # a retry of that end with the old producer id is recognised
    retry = result_of(h.end("tx", r.producer_id, SHORT_MAX - 1, True, tv=TV_2))
    assert (retry.error, retry.producer_id, retry.producer_epoch) == (E.NONE, 1001, 0)


# ----- expiry, reads, replay -----------------------------------------------------------------
def test_idle_transactional_ids_expire() -> None:
    config = TransactionCoordinatorConfig(num_partitions=1, transactional_id_expiration_ms=10_000,
                                          remove_expired_interval_ms=5_000, abort_timed_out_interval_ms=60_000)
    h = TxnHarness(config)
    h.init("idle")
    busy = h.begin("busy", TP)
    h.advance(15_000)
    assert "idle" not in h.shard.txns and "busy" in h.shard.txns
    key, value = h.log[-1]
    assert parse_key(key) == "idle" and value is None
    assert h.add("busy", busy.producer_id, busy.producer_epoch, TP1) == E.NONE
    assert h.reload().shard.txns.keys() == {"busy"}


def test_describe_and_list(h: TxnHarness) -> None:
    a = h.begin("a-1", TP, TP1)
    h.init("b-1")
    h.clock.advance(1000)
    assert h.shard.describe("a-1").partitions == {TP, TP1}
    assert h.shard.describe("zz") is None

    def names(states: set[TransactionState] = set(), pids: set[int] = set(),  # noqa: B006
              duration: int = -1, pattern: str | None = None) -> list[str]:
        return sorted(m.transactional_id for m in h.shard.list_transactions(
            states, pids, duration, compile_pattern(pattern), h.now))

    assert names() == ["a-1", "b-1"]
    assert names({S.ONGOING}) == ["a-1"]
    assert names(pids={a.producer_id}) == ["a-1"]
    assert names(duration=500) == ["a-1", "b-1"]  # b-1 never started: its start time is -1
    assert names({S.ONGOING}, duration=5000) == []
    assert names(pattern="b-.*") == ["b-1"]
    assert names(pattern="b") == []  # matched in full


def test_replay_equivalence(h: TxnHarness) -> None:
    r = h.begin("c", TP)
    h.end("c", r.producer_id, r.producer_epoch, True)
    h.complete()
    s = h.begin("a", TP1)
    h.end("a", s.producer_id, s.producer_epoch, False)
    h.begin("o", TP, TP1)
    v = h.init("v2")
    h.add("v2", v.producer_id, v.producer_epoch, TP, tv=TV_2)
    h.end("v2", v.producer_id, v.producer_epoch, True, tv=TV_2)
    h.complete(h.completions[-1])
    h.init("c")
    assert without_last_epoch(h.reload().shard.txns) == without_last_epoch(h.shard.txns)


def test_records_round_trip(h: TxnHarness) -> None:
    h.begin("tx", TP, TP1)
    key, value = h.log[-1]
    assert value is not None and value[:2] == b"\x00\x01"  # TransactionLogValue v1
    assert parse_value(parse_key(key), value) == dataclasses.replace(h.meta("tx"), last_producer_epoch=-1)


def test_the_state_table_forbids_what_kafka_forbids() -> None:
    meta = TransactionMetadata("x", 1, producer_epoch=0)
    with pytest.raises(IllegalTransition):
        meta.transition(S.PREPARE_COMMIT)  # Empty cannot commit
    with pytest.raises(IllegalTransition):
        meta.prepare_complete(0)
    assert TRANSITIONS[S.COMPLETE_COMMIT] == {S.PREPARE_COMMIT}
    assert S.from_name("PrepareCommit") is S.PREPARE_COMMIT and S.PREPARE_COMMIT.kafka_name == "PrepareCommit"
