"""Transactional offset commits in the group coordinator shard: pending until the marker, KIP-447
member checks, RequireStable, tombstones, expiry and replay (transactional batches and markers)."""

from __future__ import annotations

from typing import Any

import pytest

from broker.coordinator.result import TransactionalRecord, TxnMarker
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.coordinator.harness import ShardHarness

E = ErrorCode
PID = 77


@pytest.fixture
def h() -> ShardHarness:
    return ShardHarness()


def txn_commit(h: ShardHarness, group_id: str, offsets: dict[tuple[str, int], int], *, pid: int = PID,
               generation: int = -1, member_id: str = "", instance: str | None = None,
               metadata: str | None = "", markers_seen: int | None = None) -> Any:
    R = M.TxnOffsetCommitRequest
    topics: dict[str, list[Any]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append(R.TxnOffsetCommitRequestPartition(
            partition_index=partition, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=metadata))
    request = R(transactional_id="tx", group_id=group_id, producer_id=pid, producer_epoch=0, generation_id=generation,
                member_id=member_id, group_instance_id=instance,
                topics=[R.TxnOffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in topics.items()])
    seen = h.shard.markers_seen(pid) if markers_seen is None else markers_seen
    return h.call(lambda s, now: s.commit_transactional_offsets(request, seen, now))


def end(h: ShardHarness, committed: bool, pid: int = PID) -> None:
    h.run(lambda s, now: s.complete_transaction(pid, 0, committed, 0, now))


def stable(h: ShardHarness, group_id: str, topic: str, partition: int) -> tuple[int, int]:
    """(error, offset) of an OffsetFetch with RequireStable."""
    response = h.fetch(group_id, {topic: [partition]}, require_stable=True)
    p = response.topics[0].partitions[0]
    return p.error_code, p.committed_offset


def test_transactional_offsets_wait_for_the_commit_marker(h: ShardHarness) -> None:
    response = txn_commit(h, "g", {("t", 0): 5, ("t", 1): 6})
    assert {p.error_code for t in response.topics for p in t.partitions} == {E.NONE}
    assert isinstance(h.log[-1], TransactionalRecord) and h.log[-1].producer_id == PID
    assert h.committed("g") == {}  # not visible yet
    assert stable(h, "g", "t", 0) == (E.UNSTABLE_OFFSET_COMMIT, -1)
    end(h, committed=True)
    assert h.log[-1] == TxnMarker(PID, 0, True, 0)
    assert h.committed("g") == {("t", 0): 5, ("t", 1): 6}
    assert stable(h, "g", "t", 0) == (E.NONE, 5)


def test_an_abort_drops_them(h: ShardHarness) -> None:
    h.commit("g", {("t", 0): 1})
    txn_commit(h, "g", {("t", 0): 9})
    end(h, committed=False)
    assert h.committed("g") == {("t", 0): 1}
    assert stable(h, "g", "t", 0) == (E.NONE, 1)


def test_a_later_plain_commit_wins(h: ShardHarness) -> None:
    txn_commit(h, "g", {("t", 0): 9, ("t", 1): 9})
    h.commit("g", {("t", 0): 3})  # written after the transactional one
    end(h, committed=True)
    assert h.committed("g") == {("t", 0): 3, ("t", 1): 9}


def test_two_producers_and_a_tombstone(h: ShardHarness) -> None:
    txn_commit(h, "g", {("t", 0): 1}, pid=1)
    txn_commit(h, "g", {("t", 1): 2}, pid=2)
    assert stable(h, "g", "t", 1)[0] == E.UNSTABLE_OFFSET_COMMIT
    h.call(lambda s, now: s.delete_offsets(M.OffsetDeleteRequest(group_id="g", topics=[
        M.OffsetDeleteRequest.OffsetDeleteRequestTopic(name="t", partitions=[
            M.OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=1)])]), now))
    assert stable(h, "g", "t", 1) == (E.NONE, -1)  # the tombstone took the pending commit too
    end(h, committed=True, pid=2)
    end(h, committed=True, pid=1)
    assert h.committed("g") == {("t", 0): 1}


def test_a_marker_between_verification_and_commit_is_caught(h: ShardHarness) -> None:
    seen = h.shard.markers_seen(PID)
    end(h, committed=False)  # e.g. the transaction timed out meanwhile
    with pytest.raises(KafkaError) as exc:
        txn_commit(h, "g", {("t", 0): 1}, markers_seen=seen)
    assert exc.value.code == E.INVALID_TXN_STATE


def test_kip_447_member_checks(h: ShardHarness) -> None:
    (leader, other), generation = h.form_group("g", 2)
    assert txn_commit(h, "g", {("t", 0): 1}, generation=generation, member_id=leader).topics[0].partitions[0] \
        .error_code == E.NONE
    with pytest.raises(KafkaError) as exc:
        txn_commit(h, "g", {("t", 0): 1}, generation=generation - 1, member_id=leader)
    assert exc.value.code == E.ILLEGAL_GENERATION
    with pytest.raises(KafkaError) as exc:
        txn_commit(h, "g", {("t", 0): 1}, generation=generation, member_id="zombie")
    assert exc.value.code == E.UNKNOWN_MEMBER_ID
    # TxnOffsetCommit before v3 carries no member: accepted whatever the group's state
    assert txn_commit(h, "g", {("t", 0): 2}).topics[0].partitions[0].error_code == E.NONE
    with pytest.raises(KafkaError) as exc:
        txn_commit(h, "unknown", {("t", 0): 1}, generation=1, member_id="m")
    assert exc.value.code == E.ILLEGAL_GENERATION
    with pytest.raises(KafkaError) as exc:
        txn_commit(h, "", {("t", 0): 1})
    assert exc.value.code == E.INVALID_GROUP_ID


def test_metadata_too_large(h: ShardHarness) -> None:
    response = txn_commit(h, "g", {("t", 0): 1}, metadata="x" * 5000)
    assert response.topics[0].partitions[0].error_code == E.OFFSET_METADATA_TOO_LARGE


def test_pending_offsets_keep_the_group_from_expiring() -> None:
    h = ShardHarness()
    txn_commit(h, "g", {("t", 0): 1})
    h.advance(h.config.offsets_retention_ms + 2 * h.config.offsets_retention_check_interval_ms)
    assert "g" in h.shard.groups
    end(h, committed=True)
    assert h.committed("g") == {("t", 0): 1}


def test_replay_restores_pending_and_completed_transactions(h: ShardHarness) -> None:
    txn_commit(h, "g", {("t", 0): 5}, pid=1)
    end(h, committed=True, pid=1)
    txn_commit(h, "g", {("t", 1): 6}, pid=2)
    end(h, committed=False, pid=2)
    txn_commit(h, "g", {("t", 2): 7}, pid=3)  # still open
    h2 = h.reload()
    assert h2.committed("g") == h.committed("g") == {("t", 0): 5}
    assert stable(h2, "g", "t", 2)[0] == E.UNSTABLE_OFFSET_COMMIT
    assert h2.shard.markers_seen(1) == h.shard.markers_seen(1) == 1
    end(h2, committed=True, pid=3)
    assert h2.committed("g") == {("t", 0): 5, ("t", 2): 7}
