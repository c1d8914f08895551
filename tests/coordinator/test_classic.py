"""The classic group protocol, handler by handler, on the manual clock."""

from __future__ import annotations

import dataclasses

import pytest

from broker.coordinator.group.classic import VALID_PREVIOUS_STATES, ClassicGroup, GroupState
from broker.coordinator.group.records import parse_record
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.coordinator.harness import TEST_CONFIG, ShardHarness, sub

E = ErrorCode
S = GroupState


@pytest.fixture
def h() -> ShardHarness:
    return ShardHarness()


def test_transitions_are_data() -> None:
    assert VALID_PREVIOUS_STATES[S.EMPTY] == {S.PREPARING_REBALANCE}
    assert VALID_PREVIOUS_STATES[S.PREPARING_REBALANCE] == {S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY}
    assert VALID_PREVIOUS_STATES[S.COMPLETING_REBALANCE] == {S.PREPARING_REBALANCE}
    assert VALID_PREVIOUS_STATES[S.STABLE] == {S.COMPLETING_REBALANCE}
    assert VALID_PREVIOUS_STATES[S.DEAD] == set(S)
    assert [s.value for s in S] == ["Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"]
    group = ClassicGroup("g")
    with pytest.raises(RuntimeError):
        group.transition_to(S.STABLE, 0)
    group.transition_to(S.PREPARING_REBALANCE, 5)
    assert (group.state, group.previous_state, group.current_state_timestamp) == (S.PREPARING_REBALANCE, S.EMPTY, 5)


def test_member_id_required_then_initial_delay(h: ShardHarness) -> None:
    first = h.join("g", client_id="cli").result()
    assert first.error_code == E.MEMBER_ID_REQUIRED
    assert first.member_id == "cli-u0"
    group = h.group("g")
    assert group.state is S.EMPTY and group.is_pending_member("cli-u0")
    # The group's creation is persisted (an empty GroupMetadata record).
    _, _, value = parse_record(*h.log[0])
    assert (value.generation, value.protocol, value.members) == (0, None, [])

    parked = h.join("g", "cli-u0", client_id="cli")
    assert not parked.done()
    assert group.state is S.PREPARING_REBALANCE
    h.advance(2999)
    assert not parked.done()
    h.advance(1)
    response = parked.result()
    assert response.error_code == E.NONE
    assert (response.generation_id, response.protocol_name, response.protocol_type) == (1, "range", "consumer")
    assert response.leader == "cli-u0" and response.member_id == "cli-u0"
    assert [m.member_id for m in response.members] == ["cli-u0"]
    assert group.state is S.COMPLETING_REBALANCE


def test_join_v3_needs_no_member_id_round_trip(h: ShardHarness) -> None:
    parked = h.join("g", version=3)
    assert not parked.done()
    h.advance(3000)
    assert parked.result().error_code == E.NONE
    assert parked.result().member_id == "client-u0"


def test_initial_delay_is_not_extended_when_every_member_has_joined(h: ShardHarness) -> None:
    a = h.join("g", version=3, rebalance_ms=30000)
    h.advance(1000)
    b = h.join("g", version=3, rebalance_ms=30000)
    h.advance(1999)
    assert not a.done() and not b.done()
    h.advance(1)  # t=3000: one delay, and every known member has joined
    assert a.result().error_code == b.result().error_code == E.NONE
    assert len(a.result().members) == 2 or len(b.result().members) == 2


def test_initial_join_waits_for_pending_members_after_the_delay(h: ShardHarness) -> None:
    a = h.join("g", version=3, rebalance_ms=30000)
    pending_id = h.join("g", version=4, rebalance_ms=30000).result().member_id  # MEMBER_ID_REQUIRED
    h.advance(3000)
    assert not a.done()  # the delay is over but a member given an id has not rejoined yet
    b = h.join("g", member_id=pending_id, version=4, rebalance_ms=30000)
    assert a.result().error_code == b.result().error_code == E.NONE
    assert h.now - 1_700_000_000_000 == 3000


def test_initial_join_stops_waiting_at_the_rebalance_timeout() -> None:
    h = ShardHarness()
    a = h.join("g", version=3, rebalance_ms=4000)
    h.join("g", version=4, rebalance_ms=4000)  # pending, never rejoins
    h.advance(3000)
    assert not a.done()
    h.advance(1000)
    assert a.result().error_code == E.NONE


def test_zero_initial_delay_completes_at_once() -> None:
    h = ShardHarness(dataclasses.replace(TEST_CONFIG, initial_rebalance_delay_ms=0))
    parked = h.join("g", version=3)
    h.advance(0)
    assert parked.result().error_code == E.NONE


def test_pending_member_expires_after_session_timeout(h: ShardHarness) -> None:
    member_id = h.join("g", session_ms=7000).result().member_id
    h.advance(6999)
    assert h.group("g").is_pending_member(member_id)
    h.advance(1)
    assert not h.group("g").is_pending_member(member_id)


def test_sync_waits_for_the_leader_and_persists_the_assignment(h: ShardHarness) -> None:
    a = h.join_new("g")
    pa = h.pending
    b = h.join_new("g")
    pb = h.pending
    h.advance(6000)
    gen = pa.result().generation_id
    leader = pa.result().leader
    follower = b if leader == a else a
    assert len((pa if leader == a else pb).result().members) == 2
    assert (pb if leader == a else pa).result().members == []

    fs = h.sync("g", follower, gen)
    assert not fs.done()
    assert h.heartbeat("g", follower, gen) == E.NONE  # heartbeats are fine while completing
    ls = h.sync("g", leader, gen, assignments={leader: b"L", follower: b"F"}, protocol_type="consumer",
                protocol_name="range")
    assert ls.result().assignment == b"L" and fs.result().assignment == b"F"
    assert fs.result().protocol_name == "range" and fs.result().protocol_type == "consumer"
    assert h.group("g").state is S.STABLE
    _, _, value = parse_record(*h.log[-1])
    assert value.generation == gen and value.leader == leader and value.protocol == "range"
    assert {m.member_id: m.assignment for m in value.members} == {leader: b"L", follower: b"F"}
    # Stable: a late SyncGroup gets the stored assignment at once.
    assert h.sync("g", follower, gen).result().assignment == b"F"


def test_leader_leaving_out_a_member_gives_it_an_empty_assignment(h: ShardHarness) -> None:
    leader, follower, gen = h.join_two("g")
    fs = h.sync("g", follower, gen)
    h.sync("g", leader, gen, assignments={leader: b"L"})
    assert fs.result().error_code == E.NONE and fs.result().assignment == b""


def test_sync_errors(h: ShardHarness) -> None:
    assert h.sync("nope", "m", 1).result().error_code == E.UNKNOWN_MEMBER_ID
    assert h.sync("", "m", 1).result().error_code == E.INVALID_GROUP_ID
    (leader, follower), gen = h.form_group("g", 2)
    assert h.sync("g", "stranger", gen).result().error_code == E.UNKNOWN_MEMBER_ID
    assert h.sync("g", follower, gen + 1).result().error_code == E.ILLEGAL_GENERATION
    assert h.sync("g", follower, gen, protocol_type="other").result().error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.sync("g", follower, gen, protocol_name="roundrobin").result().error_code == E.INCONSISTENT_GROUP_PROTOCOL
    h.join("g", leader)  # the leader rejoins: a rebalance starts
    assert h.sync("g", follower, gen).result().error_code == E.REBALANCE_IN_PROGRESS


def test_member_leaving_triggers_rebalance_and_heartbeat_says_so(h: ShardHarness) -> None:
    (a, b), gen = h.form_group("g", 2)
    response = h.leave("g", (b, None))
    assert [(m.member_id, m.error_code) for m in response.members] == [(b, E.NONE)]
    assert h.group("g").state is S.PREPARING_REBALANCE
    assert h.heartbeat("g", a, gen) == E.REBALANCE_IN_PROGRESS
    rejoin = h.join("g", a)
    # Not the initial rebalance: completes as soon as every known member rejoined.
    assert rejoin.result().generation_id == gen + 1
    assert [m.member_id for m in rejoin.result().members] == [a]


def test_leader_leaves_and_a_new_leader_is_elected(h: ShardHarness) -> None:
    (a, b, c), gen = h.form_group("g", 3)
    h.leave("g", (a, None))
    jb, jc = h.join("g", b), h.join("g", c)
    assert jb.result().leader == jc.result().leader == b
    assert jb.result().generation_id == gen + 1


def test_rebalance_timeout_drops_members_that_did_not_rejoin(h: ShardHarness) -> None:
    (a, b), gen = h.form_group("g", 2, rebalance_ms=20000, session_ms=30000)
    ja = h.join("g", a, rebalance_ms=20000, session_ms=30000)  # the leader asks for a rebalance; b never rejoins
    assert h.group("g").state is S.PREPARING_REBALANCE
    h.advance(19999)
    assert not ja.done()
    h.advance(1)
    assert ja.result().generation_id == gen + 1
    assert [m.member_id for m in ja.result().members] == [a]
    assert h.heartbeat("g", b, gen) == E.UNKNOWN_MEMBER_ID


def test_session_expiry_removes_a_silent_member(h: ShardHarness) -> None:
    (a, b), gen = h.form_group("g", 2, session_ms=10000)
    for _ in range(3):
        h.advance(4000)
        assert h.heartbeat("g", a, gen) in (E.NONE, E.REBALANCE_IN_PROGRESS)
    assert not h.group("g").has_member(b)
    assert h.group("g").state is S.PREPARING_REBALANCE
    assert h.heartbeat("g", b, gen) == E.UNKNOWN_MEMBER_ID
    assert h.join("g", a).result().members[0].member_id == a


def test_new_member_parked_join_times_out(h: ShardHarness) -> None:
    (a,), gen = h.form_group("g", 1, rebalance_ms=600000, session_ms=600000)
    late = h.join("g", version=3, rebalance_ms=600000, session_ms=600000)  # a waits for a, who never rejoins
    assert h.group("g").state is S.PREPARING_REBALANCE
    h.advance(5 * 60 * 1000)
    assert late.result().error_code == E.UNKNOWN_MEMBER_ID
    assert late.result().member_id == ""


def test_protocol_selection_by_vote(h: ShardHarness) -> None:
    def form(prefs: list[list[str]]) -> str:
        hh = ShardHarness()
        parked = [hh.join("g", version=3, protocols=[(p, sub("t")) for p in ps]) for ps in prefs]
        hh.advance(3000 * (len(prefs) + 1))
        names = {d.result().protocol_name for d in parked}
        assert len(names) == 1
        return names.pop()

    assert form([["range", "roundrobin"], ["range", "roundrobin"], ["roundrobin", "range"]]) == "range"
    assert form([["range", "roundrobin"], ["roundrobin", "range"], ["roundrobin"]]) == "roundrobin"
    assert form([["cooperative-sticky", "range"], ["cooperative-sticky"]]) == "cooperative-sticky"


def test_inconsistent_group_protocol(h: ShardHarness) -> None:
    assert h.join("g", version=3, protocol_type="").result().error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.join("g2", version=3, protocols=[]).result().error_code == E.INCONSISTENT_GROUP_PROTOCOL
    h.form_group("g", 1)
    r = h.join("g", protocols=[("roundrobin", sub("t"))]).result()
    assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL and r.member_id == ""
    assert h.join("g", protocol_type="connect").result().error_code == E.INCONSISTENT_GROUP_PROTOCOL


def test_session_timeout_bounds(h: ShardHarness) -> None:
    assert h.join("g", session_ms=5999).result().error_code == E.INVALID_SESSION_TIMEOUT
    assert h.join("g", session_ms=1800001).result().error_code == E.INVALID_SESSION_TIMEOUT
    assert h.join("g", session_ms=45000).result().error_code == E.MEMBER_ID_REQUIRED
    assert h.join("", session_ms=45000).result().error_code == E.INVALID_GROUP_ID


def test_unknown_member_and_illegal_generation(h: ShardHarness) -> None:
    assert h.join("nope", "someone").result().error_code == E.UNKNOWN_MEMBER_ID
    assert h.heartbeat("nope", "someone", 1) == E.UNKNOWN_MEMBER_ID
    (a,), gen = h.form_group("g", 1)
    assert h.heartbeat("g", a, gen - 1) == E.ILLEGAL_GENERATION
    assert h.heartbeat("g", "someone", gen) == E.UNKNOWN_MEMBER_ID
    assert h.heartbeat("g", a, gen) == E.NONE
    assert h.join("g", "someone").result().error_code == E.UNKNOWN_MEMBER_ID


def test_group_max_size() -> None:
    h = ShardHarness(dataclasses.replace(TEST_CONFIG, max_size=2))
    h.form_group("g", 2)
    r = h.join("g", version=3).result()
    assert r.error_code == E.GROUP_MAX_SIZE_REACHED and r.member_id == ""
    # During a rebalance, members beyond the limit are turned away as well.
    h2 = ShardHarness(dataclasses.replace(TEST_CONFIG, max_size=2))
    h2.join("g", version=3), h2.join("g", version=3)
    assert h2.join("g", version=3).result().error_code == E.GROUP_MAX_SIZE_REACHED


def test_follower_rejoin_when_stable_returns_current_generation(h: ShardHarness) -> None:
    (a, b), gen = h.form_group("g", 2)
    r = h.join("g", b).result()
    assert (r.error_code, r.generation_id, r.members, r.leader) == (E.NONE, gen, [], a)
    assert h.group("g").state is S.STABLE
    # With changed metadata it triggers a rebalance instead.
    h.join("g", b, protocols=[("range", sub("t", "u"))])
    assert h.group("g").state is S.PREPARING_REBALANCE


def test_rejoin_while_completing_with_same_metadata(h: ShardHarness) -> None:
    leader, follower, gen = h.join_two("g")
    again = h.join("g", leader).result()
    assert again.generation_id == gen and len(again.members) == 2
    assert h.join("g", follower).result().members == []
    assert h.group("g").state is S.COMPLETING_REBALANCE


def test_new_member_during_completing_rebalance_resets_parked_syncs(h: ShardHarness) -> None:
    leader, follower, gen = h.join_two("g")
    fs = h.sync("g", follower, gen)
    h.join("g", version=3)  # a newcomer: the group rebalances
    assert fs.result().error_code == E.REBALANCE_IN_PROGRESS
    assert h.group("g").state is S.PREPARING_REBALANCE


def test_members_that_never_sync_are_removed(h: ShardHarness) -> None:
    leader, follower, gen = h.join_two("g", rebalance_ms=20000, session_ms=60000)
    h.sync("g", leader, gen, assignments={leader: b"x", follower: b"y"})
    assert h.group("g").state is S.STABLE
    h.advance(20000)
    assert not h.group("g").has_member(follower)
    assert h.group("g").state is S.PREPARING_REBALANCE


def test_static_member_restart_without_rebalance(h: ShardHarness) -> None:
    ja = h.join("g", instance="i1")  # static members skip MEMBER_ID_REQUIRED
    jb = h.join("g", instance="i2")
    h.advance(6000)
    a, b = ja.result().member_id, jb.result().member_id
    assert a == "i1-u0" and b == "i2-u1"
    gen = ja.result().generation_id
    leader = ja.result().leader
    h.sync("g", leader, gen, instance="i1" if leader == a else "i2", assignments={a: b"A", b: b"B"})
    assert h.group("g").state is S.STABLE

    restarted = h.join("g", instance="i2").result()  # b restarts: same instance, unknown member id
    assert restarted.error_code == E.NONE
    assert restarted.generation_id == gen and restarted.member_id == "i2-u2"
    assert restarted.leader == leader and restarted.members == []
    assert h.group("g").state is S.STABLE
    # The takeover is persisted; the old member id is fenced.
    _, _, value = parse_record(*h.log[-1])
    assert {m.group_instance_id: m.member_id for m in value.members} == {"i1": a, "i2": "i2-u2"}
    assert h.heartbeat("g", b, gen, instance="i2") == E.FENCED_INSTANCE_ID
    assert h.heartbeat("g", "i2-u2", gen, instance="i2") == E.NONE
    assert h.sync("g", "i2-u2", gen, instance="i2").result().assignment == b"B"
    # An instance id that is not in the group is unknown.
    assert h.heartbeat("g", a, gen, instance="i9") == E.UNKNOWN_MEMBER_ID


def test_static_leader_restart_v9_skips_assignment(h: ShardHarness) -> None:
    ja = h.join("g", instance="i1", version=9)
    h.advance(3000)
    gen = ja.result().generation_id
    h.sync("g", ja.result().member_id, gen, instance="i1", assignments={ja.result().member_id: b"A"})
    r = h.join("g", instance="i1", version=9).result()
    assert r.skip_assignment is True and r.leader == r.member_id and len(r.members) == 1
    r8 = h.join("g", instance="i1", version=8).result()
    assert r8.skip_assignment is False and r8.leader == r.member_id and r8.members == []


def test_static_member_parked_join_is_fenced_by_its_replacement(h: ShardHarness) -> None:
    (a,), gen = h.form_group("g", 1)
    old = h.join("g", instance="s", version=5)  # a static member joins: rebalance, it is parked
    assert not old.done()
    h.join("g", instance="s", version=5)  # the same instance restarts before the join completes
    assert old.result().error_code == E.FENCED_INSTANCE_ID


def test_static_member_with_different_protocol_rebalances(h: ShardHarness) -> None:
    j = h.join("g", instance="i1", protocols=[("range", sub("t")), ("roundrobin", sub("t"))])
    h.advance(3000)
    gen = j.result().generation_id
    h.sync("g", j.result().member_id, gen, instance="i1", assignments={})
    again = h.join("g", instance="i1", protocols=[("roundrobin", sub("t"))])
    assert h.group("g").state in (S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE)
    assert again.result().protocol_name == "roundrobin"
    assert again.result().generation_id == gen + 1


def test_batched_leave_group(h: ShardHarness) -> None:
    js = h.join("g", instance="s1")
    jd = h.join("g", version=3)
    h.advance(6000)
    s1, d = js.result().member_id, jd.result().member_id
    response = h.leave("g", ("", "s1"), (d, None), ("ghost", None), ("wrong", "s1"), ("", "nobody"))
    assert [(m.member_id, m.group_instance_id, m.error_code) for m in response.members] == [
        ("", "s1", E.NONE), (d, None, E.NONE), ("ghost", None, E.UNKNOWN_MEMBER_ID),
        ("wrong", "s1", E.UNKNOWN_MEMBER_ID), ("", "nobody", E.UNKNOWN_MEMBER_ID),
    ]
    assert not h.group("g").members and s1 not in h.group("g").members
    unknown = h.leave("missing", ("m", None))
    assert unknown.members[0].error_code == E.UNKNOWN_MEMBER_ID
    # The group completes its join phase empty and persists that.
    h.advance(30000)
    assert h.group("g").state is S.EMPTY
    _, _, value = parse_record(*h.log[-1])
    assert value.members == [] and value.protocol is None and value.protocol_type == "consumer"


def test_leave_of_a_pending_member(h: ShardHarness) -> None:
    pending = h.join("g").result().member_id
    assert h.leave("g", (pending, None)).members[0].error_code == E.NONE
    assert not h.group("g").is_pending_member(pending)


def test_describe_and_list_groups(h: ShardHarness) -> None:
    (a, b), gen = h.form_group("g", 2, topics=("t1",))
    h.commit("simple", {("t", 0): 1})
    d = {x.group_id: x for x in h.shard.describe_groups(["g", "simple", "missing"], 5)}
    assert (d["g"].group_state, d["g"].protocol_type, d["g"].protocol_data) == ("Stable", "consumer", "range")
    assert {m.member_id: (m.member_assignment, m.member_metadata) for m in d["g"].members} == {
        a: (b"assign-" + a.encode(), sub("t1")), b: (b"assign-" + b.encode(), sub("t1"))}
    assert d["g"].members[0].client_host == "/127.0.0.1" and d["g"].members[0].client_id == "client"
    assert (d["simple"].group_state, d["simple"].protocol_type, d["simple"].members) == ("Empty", "", [])
    assert (d["missing"].group_state, d["missing"].error_code) == ("Dead", E.NONE)
    v6 = h.shard.describe_groups(["missing"], 6)[0]
    assert (v6.group_state, v6.error_code) == ("Dead", E.GROUP_ID_NOT_FOUND)
    # A rebalancing group shows members without metadata.
    h.join("g", a)
    d2 = h.shard.describe_groups(["g"], 5)[0]
    assert d2.group_state == "PreparingRebalance" and d2.protocol_data == "" and d2.members[0].member_metadata == b""

    listed = {g.group_id: (g.group_state, g.protocol_type, g.group_type) for g in h.shard.list_groups([], [])}
    assert listed == {"g": ("PreparingRebalance", "consumer", "classic"), "simple": ("Empty", "", "classic")}
    assert [g.group_id for g in h.shard.list_groups(["EMPTY "], [])] == ["simple"]
    assert [g.group_id for g in h.shard.list_groups([], ["Classic"])] == ["g", "simple"]
    assert h.shard.list_groups([], ["consumer"]) == []


def test_delete_groups(h: ShardHarness) -> None:
    h.form_group("busy", 1)
    h.commit("idle", {("t", 0): 5, ("t", 1): 6})
    result = h.call(lambda s, now: s.delete_groups(["busy", "idle", "missing"], now))
    assert [(r.group_id, r.error_code) for r in result] == [
        ("busy", E.NON_EMPTY_GROUP), ("idle", E.NONE), ("missing", E.GROUP_ID_NOT_FOUND)]
    assert "idle" not in h.shard.groups
    assert h.fetch("idle").topics == []
    tombstones = [parse_record(*r)[1] for r in h.log if r[1] is None]
    assert {type(t).__name__ for t in tombstones} == {"OffsetCommitKey", "GroupMetadataKey"}


def test_unloading_answers_parked_requests_not_coordinator(h: ShardHarness) -> None:
    parked = h.join("g", version=3)
    h.shard.on_unloaded()
    assert parked.result().error_code == E.NOT_COORDINATOR


def test_join_response_message_encodes_at_every_version(h: ShardHarness) -> None:
    """The shard's responses are wire messages; the API layer only fixes per-version nullability."""
    (a,), gen = h.form_group("g", 1)
    r = h.join("g", a).result()
    for v in range(0, 10):
        r2 = M.JoinGroupResponse(**{f: getattr(r, f) for f in r.FIELDS})
        if v < 7 and r2.protocol_name is None:
            r2.protocol_name = ""
        M.encode(r2, v)
