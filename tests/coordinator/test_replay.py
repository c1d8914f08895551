"""Replay: a shard rebuilt from the records another shard wrote has the same persisted state."""

from __future__ import annotations

import uuid
from functools import partial
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.coordinator.group.classic import GroupState
from broker.coordinator.group.records import (
    OffsetAndMetadata,
    group_metadata_record,
    offset_commit_record,
    parse_offset_commit,
    parse_record,
)
from broker.coordinator.group.shard import GroupCoordinatorShard
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from protocol.primitives import ZERO_UUID
from tests.coordinator.harness import TEST_CONFIG, ShardHarness, sub

E = ErrorCode
S = GroupState


def persisted_view(shard: GroupCoordinatorShard) -> dict[str, Any]:
    """What must survive a restart: groups as of their last completed rebalance, and offsets."""
    groups = {}
    for gid, g in shard.groups.items():
        members = tuple(
            (m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
             m.session_timeout_ms, m.metadata(g.protocol_name) if g.protocol_name else None, m.assignment)
            for m in g.members.values()
        )
        groups[gid] = (g.state, g.generation_id, g.protocol_type, g.protocol_name, g.leader_id, members)
    offsets = {g: {t: dict(ps) for t, ps in topics.items()} for g, topics in shard.offsets.store.by_group.items()}
    return {"groups": groups, "offsets": offsets}


def test_reload_restores_groups_and_offsets() -> None:
    h = ShardHarness()
    (a, b), gen = h.form_group("g1", 2, topics=("t1", "t2"), session_ms=60000)
    h.commit("g1", {("t1", 0): 100, ("t2", 3): 7}, generation=gen, member_id=a, metadata="m")

    js = h.join("g2", instance="s1")
    h.advance(3000)
    s1 = js.result().member_id
    h.sync("g2", s1, js.result().generation_id, instance="s1", assignments={s1: b"S"})
    h.join("g2", instance="s1")  # restart: the takeover is persisted

    h.commit("simple", {("x", 0): 1, ("x", 1): 2})
    delete = M.OffsetDeleteRequest(group_id="simple", topics=[M.OffsetDeleteRequest.OffsetDeleteRequestTopic(
        name="x", partitions=[M.OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=1)])])
    h.run(lambda s, now: s.delete_offsets(delete, now))

    (c,), gen3 = h.form_group("g3", 1)
    h.commit("g3", {("t1", 0): 5}, generation=gen3, member_id=c)
    h.leave("g3", (c, None))

    h.commit("doomed", {("t", 0): 1})
    h.run(lambda s, now: s.delete_groups(["doomed"], now))

    live = persisted_view(h.shard)
    reloaded = h.reload()
    assert persisted_view(reloaded.shard) == live
    assert live["groups"]["g1"][0] is S.STABLE and live["groups"]["g3"][0] is S.EMPTY
    assert "doomed" not in live["groups"] and "doomed" not in live["offsets"]

    # The reloaded group carries on: members heartbeat at their generation; a silent one expires.
    for _ in range(4):
        reloaded.advance(20000)
        assert reloaded.heartbeat("g1", a, gen) in (E.NONE, E.REBALANCE_IN_PROGRESS)
    assert not reloaded.group("g1").has_member(b)
    assert reloaded.group("g1").state is S.PREPARING_REBALANCE


def test_a_rebalance_in_progress_reloads_as_its_last_stable_generation() -> None:
    h = ShardHarness()
    (a, b), gen = h.form_group("g", 2)
    h.join("g", a)  # rebalancing: nothing is persisted until the next sync
    reloaded = h.reload()
    g = reloaded.group("g")
    assert (g.state, g.generation_id, set(g.members)) == (S.STABLE, gen, {a, b})
    assert reloaded.sync("g", b, gen).result().assignment == b"assign-" + b.encode()


def test_replay_of_hand_built_records() -> None:
    shard = ShardHarness().shard
    shard.replay(*offset_commit_record("g", "t", 0, OffsetAndMetadata(5, 2, "md", 1000)))
    assert shard.groups["g"].state is S.EMPTY and shard.groups["g"].protocol_type is None
    shard.replay(*group_metadata_record(
        "g", protocol_type="consumer", generation=4, protocol="range", leader="m1", current_state_timestamp=9,
        members=[],
    ))
    assert shard.groups["g"].generation_id == 4 and shard.offsets.store.get("g", "t", 0) is not None
    # Unknown record types (streams group records, type 17, for instance) are skipped.
    shard.replay(b"\x00\x11\x00\x01g", b"\x00\x00")
    # A legacy (type 0) offset commit.
    key = b"\x00\x00" + M.encode(M.LegacyOffsetCommitKey(group="old", topic="t", partition=1), 0)
    value = b"\x00\x00" + M.encode(M.LegacyOffsetCommitValue(offset=3, metadata="", commit_timestamp=1), 0)
    shard.replay(key, value)
    assert shard.offsets.store.get("old", "t", 1) == OffsetAndMetadata(3, -1, "", 1)
    # Tombstones.
    shard.replay(offset_commit_record("g", "t", 0, OffsetAndMetadata(1, -1, "", 1))[0], None)
    assert shard.offsets.store.get("g", "t", 0) is None
    shard.replay(group_metadata_record("g", protocol_type="", generation=0, protocol=None, leader=None,
                                       current_state_timestamp=None, members=[])[0], None)
    assert "g" not in shard.groups


def test_malformed_records_raise_protocol_errors() -> None:
    shard = ShardHarness().shard
    for key, value in [(b"\x00", None), (b"\x00\x01\x00", b"\x00\x04"), (b"\x00\x02\x00\x01g", b"\x00\x09xx"),
                       (b"\x00\x01\x00\x01g\x00\x01t\x00\x00\x00\x00", b"\x00")]:
        try:
            shard.replay(key, value)
        except KafkaError:
            pass
        else:
            raise AssertionError("accepted %r/%r" % (key, value))


def test_records_round_trip_through_parse() -> None:
    key, value = offset_commit_record("g", "t", 3, OffsetAndMetadata(9, 1, "x", 5, None))
    kind, k, v = parse_record(key, value)
    assert (kind, k.group, k.topic, k.partition, v.offset, v.leader_epoch, v.metadata) == (1, "g", "t", 3, 9, 1, "x")


def delete_offsets(request: Any, shard: GroupCoordinatorShard, now: int) -> Any:
    return shard.delete_offsets(request, now)


def delete_groups(group_ids: list[str], shard: GroupCoordinatorShard, now: int) -> Any:
    return shard.delete_groups(group_ids, now)


_ops = st.lists(
    st.one_of(
        st.tuples(st.just("commit"), st.sampled_from("ab"), st.sampled_from("tu"), st.integers(0, 2),
                  st.integers(0, 1000)),
        st.tuples(st.just("delete_offset"), st.sampled_from("ab"), st.sampled_from("tu"), st.integers(0, 2)),
        st.tuples(st.just("delete_group"), st.sampled_from("ab")),
        st.tuples(st.just("advance"), st.integers(0, 3 * TEST_CONFIG.offsets_retention_ms // 2)),
        st.tuples(st.just("join"), st.sampled_from("ab")),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(_ops)
def test_random_operations_reload_to_the_same_state(ops: list[tuple[Any, ...]]) -> None:
    h = ShardHarness()
    members: dict[str, tuple[str, int]] = {}
    for op in ops:
        kind = op[0]
        if kind == "commit":
            _, g, t, p, offset = op
            m = members.get(g)
            try:
                if m is not None and h.shard.groups.get(g) is not None and h.group(g).has_member(m[0]):
                    h.commit(g, {(t, p): offset}, generation=m[1], member_id=m[0])
                else:
                    h.commit(g, {(t, p): offset})
            except KafkaError:
                pass
        elif kind == "delete_offset":
            _, g, t, p = op
            request = M.OffsetDeleteRequest(group_id=g, topics=[M.OffsetDeleteRequest.OffsetDeleteRequestTopic(
                name=t, partitions=[M.OffsetDeleteRequest.OffsetDeleteRequestPartition(partition_index=p)])])
            try:
                h.call(partial(delete_offsets, request))
            except KafkaError:
                pass
        elif kind == "delete_group":
            h.call(partial(delete_groups, [op[1]]))
        elif kind == "advance":
            h.advance(op[1])
        elif kind == "join" and op[1] not in members:
            first = h.join(op[1], version=3, protocols=[("range", sub("t"))], session_ms=1800000)
            h.advance(TEST_CONFIG.initial_rebalance_delay_ms)
            r = first.result()
            if r.error_code == E.NONE:
                h.sync(op[1], r.member_id, r.generation_id, assignments={r.member_id: b"a"})
                members[op[1]] = (r.member_id, r.generation_id)
        # Compare only when no rebalance is half-way (those reload as their last stable state).
        if all(g.state in (S.EMPTY, S.STABLE) for g in h.shard.groups.values()):
            assert persisted_view(h.reload().shard) == persisted_view(h.shard)


@settings(max_examples=200, deadline=None)
@given(
    group=st.text(max_size=30), topic=st.text(min_size=1, max_size=30), partition=st.integers(0, 2**31 - 1),
    offset=st.integers(-1, 2**63 - 1), epoch=st.integers(-1, 2**31 - 1), metadata=st.text(max_size=200),
    commit_ts=st.integers(0, 2**50), expire=st.one_of(st.none(), st.integers(0, 2**50)),
    topic_id=st.sampled_from([ZERO_UUID, uuid.UUID(int=7), uuid.uuid4()]),
)
def test_the_fast_offset_commit_reader_agrees_with_the_generic_one(
    group: str, topic: str, partition: int, offset: int, epoch: int, metadata: str, commit_ts: int,
    expire: int | None, topic_id: uuid.UUID,
) -> None:
    om = OffsetAndMetadata(offset, epoch, metadata, commit_ts, expire, topic_id)
    key, value = offset_commit_record(group, topic, partition, om)
    # the record's value is written by hand for the common case: as the generic encoder writes it
    generic_value = M.encode(M.OffsetCommitValue(
        offset=offset, leader_epoch=epoch, metadata=metadata, commit_timestamp=commit_ts,
        expire_timestamp=-1 if expire is None else expire, topic_id=topic_id), 4 if expire is None else 1)
    assert value == (b"\x00\x04" if expire is None else b"\x00\x01") + generic_value
    for v in (value, None):
        fast = parse_offset_commit(key, v)
        _, k, parsed = parse_record(key, v)
        generic = (k.group, k.topic, k.partition, None if parsed is None else OffsetAndMetadata.from_value(parsed))
        assert fast is None or fast == generic  # None: the generic reader takes it
    if expire is None and len(metadata.encode()) < 127:
        assert parse_offset_commit(key, value) is not None  # the common case takes the fast path
    # damaged bytes never come back from the fast reader as an offset
    assert parse_offset_commit(key[:-1], value) is None and parse_offset_commit(key, value[:-1]) is None
