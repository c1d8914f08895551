"""Classic and consumer-protocol members in one group: classic members served by a consumer
group, online upgrade of a classic group, downgrade when the last consumer member leaves, and
the migration policy."""

from __future__ import annotations

import dataclasses
import struct
from typing import Any

import pytest

from broker.coordinator.group.classic import ClassicGroup, GroupState
from broker.coordinator.group.consumer import ConsumerGroup, ConsumerGroupState
from broker.coordinator.group.consumer_classic import encode_assignment, parse_assignment, parse_subscription
from protocol.errors import ErrorCode, ProtocolError
from tests.coordinator.consumer_harness import CONFIG, Client, ConsumerHarness

E = ErrorCode


def subscription(topics: list[str], owned: list[tuple[str, list[int]]] | None = None, version: int = 1) -> bytes:
    """A ConsumerProtocolSubscription v1 (topics, no user data, owned partitions)."""
    out = [struct.pack(">hi", version, len(topics))]
    for t in topics:
        out.append(struct.pack(">h", len(t)) + t.encode())
    out.append(struct.pack(">i", -1))
    if version >= 1:
        owned = owned or []
        out.append(struct.pack(">i", len(owned)))
        for t, ps in owned:
            out.append(struct.pack(">h", len(t)) + t.encode() + struct.pack(">i", len(ps)))
            out += [struct.pack(">i", p) for p in ps]
    return b"".join(out)


@dataclasses.dataclass
class ClassicClient:
    """An eager classic consumer: revokes everything, rejoins, syncs, heartbeats."""

    h: ConsumerHarness
    topics: list[str]
    member_id: str = ""
    generation: int = -1
    owned: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    session_ms: int = 10000

    def protocols(self) -> list[tuple[str, bytes]]:
        return [("range", subscription(self.topics))]

    def rejoin(self) -> Any:
        self.owned = set()  # eager: everything is revoked before joining
        response = self.h.join("g", self.member_id, protocols=self.protocols(), session_ms=self.session_ms).result()
        if response.error_code == E.MEMBER_ID_REQUIRED:
            self.member_id = response.member_id
            response = self.h.join("g", self.member_id, protocols=self.protocols(),
                                   session_ms=self.session_ms).result()
        assert response.error_code == 0, response
        self.generation = response.generation_id
        sync = self.h.sync("g", self.member_id, self.generation, protocol_type="consumer",
                           protocol_name=response.protocol_name).result()
        if sync.error_code == E.REBALANCE_IN_PROGRESS:
            return sync
        assert sync.error_code == 0, sync
        partitions, _ = parse_assignment(sync.assignment)
        self.owned = {(t, p) for t, ps in partitions for p in ps}
        return sync

    def poll(self) -> int:
        code = self.h.heartbeat("g", self.member_id, self.generation)
        if code in (E.REBALANCE_IN_PROGRESS, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID):
            if code == E.UNKNOWN_MEMBER_ID:
                self.member_id = ""
            self.rejoin()
        return code


def names(h: ConsumerHarness, c: Client) -> set[tuple[str, int]]:
    out = set()
    for t, p in c.partitions():
        info = h.metadata.topic_by_id(t)
        assert info is not None
        out.add((info.name, p))
    return out


def settle(h: ConsumerHarness, classic: list[ClassicClient], consumers: list[Client], rounds: int = 8) -> None:
    for _ in range(rounds):
        for c in classic:
            c.poll()
        for k in consumers:
            k.poll()
        h.advance(1000)
    owned = [c.owned for c in classic] + [names(h, k) for k in consumers]
    flat = [tp for o in owned for tp in o]
    assert len(flat) == len(set(flat)), owned  # nobody shares a partition


@pytest.fixture
def h() -> ConsumerHarness:
    harness = ConsumerHarness()
    harness.topic("t", 6)
    return harness


def test_codecs() -> None:
    sub = parse_subscription(subscription(["a", "b"], [("a", [1, 2])]))
    assert (sub.version, sub.topics, sub.owned, sub.rack_id) == (1, ["a", "b"], [("a", [1, 2])], None)
    data = encode_assignment([("a", [0, 3])], 3)
    assert data[:2] == b"\x00\x03" and parse_assignment(data) == ([("a", [0, 3])], None)
    for bad in (b"", b"\x00", b"\x00\x00\x00\x00\x00\x09x"):
        with pytest.raises(ProtocolError):
            parse_subscription(bad)


def test_empty_classic_group_becomes_a_consumer_group(h: ConsumerHarness) -> None:
    first = h.join("g")  # MEMBER_ID_REQUIRED: the group is created, empty
    assert first.result().error_code == E.MEMBER_ID_REQUIRED
    assert isinstance(h.group(), ClassicGroup)
    h.commit9("g", "", -1, {("t", 1): 3})
    assert h.cjoin("a", ["t"]).error_code == 0
    assert isinstance(h.group(), ConsumerGroup)
    assert h.shard.offsets.store.get("g", "t", 1) is not None  # committed offsets stay


def test_empty_consumer_group_becomes_a_classic_group(h: ConsumerHarness) -> None:
    c = Client(h, "a", ["t"])
    c.poll()
    c.leave()
    assert isinstance(h.group(), ConsumerGroup) and h.group().state is ConsumerGroupState.EMPTY
    k = ClassicClient(h, ["t"])
    first = h.join("g", protocols=k.protocols()).result()
    assert first.error_code == E.MEMBER_ID_REQUIRED and isinstance(h.group(), ClassicGroup)
    assert "g" in h.reload().shard.groups and isinstance(h.reload().group(), ClassicGroup)


def test_classic_members_join_a_consumer_group(h: ConsumerHarness) -> None:
    consumers = [Client(h, "c1", ["t"])]
    consumers[0].poll()
    classic = [ClassicClient(h, ["t"]), ClassicClient(h, ["t"])]
    for k in classic:
        k.rejoin()
    settle(h, classic, consumers)
    group = h.group()
    assert isinstance(group, ConsumerGroup) and group.state is ConsumerGroupState.STABLE
    assert sorted(len(x) for x in [classic[0].owned, classic[1].owned, names(h, consumers[0])]) == [2, 2, 2]
    members = h.shard.consumer_group_describe(["g"])[0].members
    assert sorted(m.member_type for m in members) == [0, 0, 1]  # classic, classic, consumer
    # A classic member's JoinGroup answers with its member epoch; a stale generation is refused.
    assert h.heartbeat("g", classic[0].member_id, classic[0].generation - 1) == E.ILLEGAL_GENERATION
    assert h.heartbeat("g", consumers[0].member_id, consumers[0].epoch) == E.UNKNOWN_MEMBER_ID  # not classic
    # Classic members commit with their generation (ILLEGAL_GENERATION when stale, not STALE_MEMBER_EPOCH).
    assert h.commit9("g", classic[0].member_id, classic[0].generation, {("t", 0): 1}) == {("t", 0): 0}
    assert h.commit9("g", classic[0].member_id, 0, {("t", 0): 1}) == {("t", 0): E.ILLEGAL_GENERATION}
    # A classic member leaves with LeaveGroup.
    response = h.leave("g", (classic[1].member_id, None))
    assert [m.error_code for m in response.members] == [0]
    settle(h, classic[:1], consumers)
    assert len(classic[0].owned) + len(names(h, consumers[0])) == 6


def test_classic_member_session_expires(h: ConsumerHarness) -> None:
    c = Client(h, "c1", ["t"])
    c.poll()
    k = ClassicClient(h, ["t"], session_ms=8000)
    k.rejoin()
    for _ in range(5):
        h.advance(2000)
        c.poll()
    assert k.member_id not in h.group().members


def test_online_upgrade_and_downgrade(h: ConsumerHarness) -> None:
    classic = [ClassicClient(h, ["t"]), ClassicClient(h, ["t"])]
    # A classic group with its assignment, made by the leader.
    ids = []
    for k in classic:
        r = h.join("g", protocols=k.protocols()).result()
        k.member_id = r.member_id
        ids.append(h.join("g", k.member_id, protocols=k.protocols()))
    h.advance(9000)  # the initial rebalance delay, extended by the second member
    joined = [d.result() for d in ids]
    leader = joined[0].leader
    assignments = {classic[0].member_id: encode_assignment([("t", [0, 1, 2])], 1),
                   classic[1].member_id: encode_assignment([("t", [3, 4, 5])], 1)}
    syncs = [h.sync("g", k.member_id, r.generation_id, assignments=assignments if k.member_id == leader else None)
             for k, r in zip(classic, joined, strict=True)]
    for k, s, r in zip(classic, syncs, joined, strict=True):
        k.generation = r.generation_id
        k.owned = {("t", p) for _, ps in parse_assignment(s.result().assignment)[0] for p in ps}
    generation = joined[0].generation_id
    assert isinstance(h.group(), ClassicGroup) and h.group().state is GroupState.STABLE

    # Upgrade: a consumer-protocol member joins.
    consumer = Client(h, "c1", ["t"])
    r = consumer.poll()
    group = h.group()
    assert r.error_code == 0 and isinstance(group, ConsumerGroup)
    assert group.members[classic[0].member_id].member_epoch == generation
    # The classic members keep their generation as epoch and their partitions.
    assert group.members[classic[1].member_id].assigned == {h.metadata.topic("t").topic_id: frozenset([3, 4, 5])}
    assert h.reload().group().members.keys() == group.members.keys()
    settle(h, classic, [consumer])
    assert sorted(len(x) for x in [classic[0].owned, classic[1].owned, names(h, consumer)]) == [2, 2, 2]

    # Downgrade: the only consumer-protocol member leaves; the classic members rebalance.
    consumer.leave()
    group = h.group()
    assert isinstance(group, ClassicGroup) and group.state is GroupState.PREPARING_REBALANCE
    assert isinstance(h.reload().group(), ClassicGroup)
    for k in classic:
        assert h.heartbeat("g", k.member_id, k.generation) == E.REBALANCE_IN_PROGRESS
    # Both rejoin (eager); the join phase completes once both are in.
    parked = [h.join("g", k.member_id, protocols=k.protocols()) for k in classic]
    responses = [p.result() for p in parked]
    assert all(x.error_code == 0 for x in responses)
    assert h.group().state is GroupState.COMPLETING_REBALANCE


@pytest.mark.parametrize("policy", ["disabled", "downgrade"])
def test_migration_policy_forbids_upgrade(policy: str) -> None:
    h = ConsumerHarness(dataclasses.replace(CONFIG, consumer_migration_policy=policy))
    h.topic("t", 2)
    k = ClassicClient(h, ["t"])
    r = h.join("g", protocols=k.protocols()).result()
    h.join("g", r.member_id, protocols=k.protocols())
    h.advance(3000)
    assert h.cjoin("c1", ["t"]).error_code == E.GROUP_ID_NOT_FOUND
    assert isinstance(h.group(), ClassicGroup)


def test_migration_disabled_keeps_classic_members_out() -> None:
    h = ConsumerHarness(dataclasses.replace(CONFIG, consumer_migration_policy="disabled"))
    h.topic("t", 2)
    Client(h, "c1", ["t"]).poll()
    response = h.join("g", protocols=ClassicClient(h, ["t"]).protocols(), version=3).result()
    assert response.error_code == E.INCONSISTENT_GROUP_PROTOCOL


def test_upgrade_policy_keeps_the_consumer_group_when_consumers_leave() -> None:
    h = ConsumerHarness(dataclasses.replace(CONFIG, consumer_migration_policy="upgrade"))
    h.topic("t", 2)
    consumer = Client(h, "c1", ["t"])
    consumer.poll()
    k = ClassicClient(h, ["t"])
    k.rejoin()
    consumer.leave()
    assert isinstance(h.group(), ConsumerGroup)
    settle(h, [k], [])
    assert len(k.owned) == 2
