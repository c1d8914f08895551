"""Committed offsets: commit validation, fetch, delete, retention and expiry."""

from __future__ import annotations

import dataclasses
import struct
import uuid

import pytest

from broker.coordinator.group.classic import GroupState
from broker.coordinator.group.records import parse_record
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.coordinator.harness import TEST_CONFIG, ShardHarness

E = ErrorCode
DAY = 24 * 3600 * 1000


@pytest.fixture
def h() -> ShardHarness:
    return ShardHarness()


def stay_alive(h: ShardHarness, group_id: str, member_id: str, generation: int, ms: int) -> None:
    """Heartbeat every 20 minutes (the session timeout is 30 minutes) for `ms`."""
    step = 20 * 60 * 1000
    for _ in range(ms // step):
        h.advance(step)
        assert h.heartbeat(group_id, member_id, generation) == E.NONE


def codes(response: M.OffsetCommitResponse) -> dict[tuple[str, int], int]:
    return {(t.name, p.partition_index): p.error_code for t in response.topics for p in t.partitions}


def test_simple_group_commit_creates_an_empty_group(h: ShardHarness) -> None:
    response = h.commit("simple", {("t", 0): 10, ("t", 1): 11, ("u", 0): 3})
    assert set(codes(response).values()) == {E.NONE}
    group = h.group("simple")
    assert group.state is GroupState.EMPTY and group.protocol_type is None
    assert h.committed("simple") == {("t", 0): 10, ("t", 1): 11, ("u", 0): 3}
    # The records are Kafka's: key type 1, value version 4.
    key, value = h.log[0]
    assert key[:2] == b"\x00\x01" and value is not None and value[:2] == b"\x00\x04"


def test_commit_to_unknown_group_with_a_generation(h: ShardHarness) -> None:
    with pytest.raises(KafkaError) as exc:
        h.commit("nope", {("t", 0): 1}, generation=3, member_id="m", version=8)
    assert exc.value.code == E.ILLEGAL_GENERATION
    with pytest.raises(KafkaError) as exc:
        h.commit("nope", {("t", 0): 1}, generation=3, member_id="m", version=9)
    assert exc.value.code == E.GROUP_ID_NOT_FOUND
    with pytest.raises(KafkaError) as exc:
        h.commit("", {("t", 0): 1})
    assert exc.value.code == E.INVALID_GROUP_ID


def test_member_commit_checks(h: ShardHarness) -> None:
    (a, b), gen = h.form_group("g", 2)
    assert set(codes(h.commit("g", {("t", 0): 5}, generation=gen, member_id=a)).values()) == {E.NONE}

    def fails(code: ErrorCode, **kw: object) -> None:
        with pytest.raises(KafkaError) as exc:
            h.commit("g", {("t", 0): 6}, **kw)  # type: ignore[arg-type]
        assert exc.value.code == code

    fails(E.ILLEGAL_GENERATION, generation=gen - 1, member_id=a)
    fails(E.UNKNOWN_MEMBER_ID, generation=gen, member_id="stranger")
    fails(E.UNKNOWN_MEMBER_ID, generation=-1, member_id="")  # a simple commit to a live group
    fails(E.UNKNOWN_MEMBER_ID, generation=gen, member_id=a, instance="nobody")
    assert h.committed("g") == {("t", 0): 5}

    h.join("g", a)  # PreparingRebalance: members of the current generation may still commit
    assert set(codes(h.commit("g", {("t", 0): 7}, generation=gen, member_id=a)).values()) == {E.NONE}
    h.join("g", b)  # the join phase completes: CompletingRebalance
    assert h.group("g").state is GroupState.COMPLETING_REBALANCE
    fails(E.REBALANCE_IN_PROGRESS, generation=gen + 1, member_id=a)


def test_static_member_fenced_commit(h: ShardHarness) -> None:
    j = h.join("g", instance="i1")
    h.advance(3000)
    gen, old = j.result().generation_id, j.result().member_id
    h.sync("g", old, gen, instance="i1", assignments={old: b""})
    h.join("g", instance="i1")  # restart: a new member id for i1
    with pytest.raises(KafkaError) as exc:
        h.commit("g", {("t", 0): 1}, generation=gen, member_id=old, instance="i1")
    assert exc.value.code == E.FENCED_INSTANCE_ID


def test_commit_keeps_the_session_alive(h: ShardHarness) -> None:
    (a,), gen = h.form_group("g", 1, session_ms=10000)
    for i in range(5):
        h.advance(6000)
        h.commit("g", {("t", 0): i}, generation=gen, member_id=a)
    assert h.group("g").has_member(a)


def test_offset_metadata_too_large() -> None:
    h = ShardHarness(dataclasses.replace(TEST_CONFIG, offset_metadata_max_bytes=10))
    response = h.commit("g", {("t", 0): 1}, metadata="x" * 11)
    assert codes(response) == {("t", 0): E.OFFSET_METADATA_TOO_LARGE}
    assert h.commit("g", {("t", 1): 1}, metadata="x" * 10).topics[0].partitions[0].error_code == E.NONE
    assert h.commit("g", {("t", 2): 1}, metadata=None).topics[0].partitions[0].error_code == E.NONE
    assert h.committed("g") == {("t", 1): 1, ("t", 2): 1}


def test_fetch(h: ShardHarness) -> None:
    h.commit("g", {("t", 0): 10, ("t", 1): 11}, metadata="meta")
    r = h.fetch("g", {"t": [0, 1, 2], "other": [0]})
    got = {(t.name, p.partition_index): (p.committed_offset, p.committed_leader_epoch, p.metadata, p.error_code)
           for t in r.topics for p in t.partitions}
    assert got == {("t", 0): (10, -1, "meta", 0), ("t", 1): (11, -1, "meta", 0), ("t", 2): (-1, -1, "", 0),
                   ("other", 0): (-1, -1, "", 0)}
    missing = h.fetch("missing", {"t": [0]})
    assert missing.topics[0].partitions[0].committed_offset == -1 and missing.error_code == 0
    assert h.fetch("missing").topics == []
    assert h.fetch("g", require_stable=True).topics[0].partitions[0].error_code == E.NONE


def test_fetch_with_topic_ids(h: ShardHarness) -> None:
    tid, other = uuid.uuid4(), uuid.uuid4()
    request = M.OffsetCommitRequest(group_id="g", topics=[M.OffsetCommitRequest.OffsetCommitRequestTopic(
        name="t", topic_id=tid, partitions=[M.OffsetCommitRequest.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=9, committed_leader_epoch=4, committed_metadata=None)])])
    response = h.call(lambda s, now: s.commit_offsets(request, 10, now))
    assert response.topics[0].topic_id == tid

    def fetch(topic_id: uuid.UUID) -> tuple[int, int]:
        req = M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=[
            M.OffsetFetchRequest.OffsetFetchRequestTopics(name="t", topic_id=topic_id, partition_indexes=[0])])
        p = h.shard.fetch_offsets(req, False).topics[0].partitions[0]
        return p.committed_offset, p.committed_leader_epoch

    assert fetch(tid) == (9, 4)
    assert fetch(uuid.UUID(int=0)) == (9, 4)
    assert fetch(other) == (-1, -1)  # the topic was recreated: the old offset does not apply


def test_offset_delete(h: ShardHarness) -> None:
    with pytest.raises(KafkaError) as exc:
        h.run(lambda s, now: s.delete_offsets(M.OffsetDeleteRequest(group_id="missing"), now))
    assert exc.value.code == E.GROUP_ID_NOT_FOUND

    (a,), gen = h.form_group("g", 1, topics=("t",))
    h.commit("g", {("t", 0): 1, ("old", 0): 2}, generation=gen, member_id=a)

    def delete(group_id: str, topic: str, *partitions: int) -> M.OffsetDeleteResponse:
        request = M.OffsetDeleteRequest(group_id=group_id, topics=[M.OffsetDeleteRequest.OffsetDeleteRequestTopic(
            name=topic, partitions=[M.OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=p)
                                    for p in partitions])])
        return h.call(lambda s, now: s.delete_offsets(request, now))

    assert delete("g", "t", 0).topics[0].partitions[0].error_code == E.GROUP_SUBSCRIBED_TO_TOPIC
    assert delete("g", "old", 0, 1).topics[0].partitions[1].error_code == E.NONE
    assert h.committed("g") == {("t", 0): 1}

    # A non-empty group of another protocol type cannot have offsets deleted while it runs.
    j = h.join("c", version=3, protocol_type="connect", protocols=[("p", b"")])
    h.advance(3000)
    h.sync("c", j.result().member_id, j.result().generation_id, assignments={})
    with pytest.raises(KafkaError) as exc:
        delete("c", "t", 0)
    assert exc.value.code == E.NON_EMPTY_GROUP


def test_simple_group_offsets_expire_and_the_group_goes(h: ShardHarness) -> None:
    h.commit("simple", {("t", 0): 1})
    retention = TEST_CONFIG.offsets_retention_ms
    h.advance(DAY)
    h.commit("simple", {("t", 1): 2})
    h.advance(retention - DAY + TEST_CONFIG.offsets_retention_check_interval_ms)  # a sweep after the first expired
    assert h.committed("simple") == {("t", 1): 2}
    h.advance(DAY)
    assert "simple" not in h.shard.groups
    assert h.log[-1] == (h.log[-1][0], None) and parse_record(*h.log[-1])[0] == 2  # group tombstone


def test_empty_group_offsets_expire_from_when_it_became_empty(h: ShardHarness) -> None:
    (a,), gen = h.form_group("g", 1, session_ms=1800000, topics=("t",))
    h.commit("g", {("t", 0): 1}, generation=gen, member_id=a)
    stay_alive(h, "g", a, gen, 10 * DAY)  # its subscribed topic's offset stays meanwhile
    h.leave("g", (a, None))
    assert h.group("g").state is GroupState.EMPTY
    emptied = h.group("g").current_state_timestamp
    assert h.committed("g") == {("t", 0): 1}  # older than the retention, but the group just emptied
    retention = TEST_CONFIG.offsets_retention_ms
    h.advance(emptied + retention - h.now - 1)
    h.run(lambda s, now: s.cleanup_group_metadata(now))
    assert h.committed("g") == {("t", 0): 1}
    h.advance(TEST_CONFIG.offsets_retention_check_interval_ms)
    assert "g" not in h.shard.groups


def test_stable_group_expires_only_unsubscribed_topics(h: ShardHarness) -> None:
    (a,), gen = h.form_group("g", 1, session_ms=1800000, topics=("t",))
    h.commit("g", {("t", 0): 1, ("gone", 0): 2}, generation=gen, member_id=a)
    stay_alive(h, "g", a, gen, 8 * DAY)
    assert h.committed("g") == {("t", 0): 1}
    assert h.group("g").state is GroupState.STABLE


def test_explicit_retention_time_v2_to_v4(h: ShardHarness) -> None:
    h.commit("g", {("t", 0): 1}, retention_ms=60000, version=2)
    _, value = h.log[-1]
    assert value is not None and struct.unpack(">h", value[:2])[0] == 1  # OffsetCommitValue v1 with expiry
    assert parse_record(*h.log[-1])[2].expire_timestamp == h.now + 60000
    h.advance(TEST_CONFIG.offsets_retention_check_interval_ms)
    assert "g" not in h.shard.groups


def test_sweep_reschedules_itself(h: ShardHarness) -> None:
    for _ in range(3):
        h.advance(TEST_CONFIG.offsets_retention_check_interval_ms)
        assert h.timer.is_scheduled("expire-group-metadata")
