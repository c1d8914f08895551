"""Server-side assignors of KIP-848 consumer groups: `uniform` (the default) and `range`.

An assignor maps every member to the partitions it should own (the target assignment), from
the members' subscriptions (resolved to topic ids), their current target assignments and the
partition counts of the subscribed topics. Pure functions, deterministic for given inputs.

uniform: every partition of a subscribed topic goes to exactly one of its subscribers; the
    load (number of partitions) is as even as the subscriptions allow; members keep what they
    had unless balance requires moving it (sticky), so a member loses partitions only when its
    share shrinks. Homogeneous groups end with loads differing by at most one.
range: per topic, the subscribers (static members by instance id first, then the others by
    member id) receive contiguous ranges, the first ones one extra partition: members subscribed
    to topics of equal partition counts get the same partition numbers (co-partitioning).
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol

from broker.coordinator.group.member import Assignment

UNIFORM = "uniform"
RANGE = "range"


@dataclass(frozen=True)
class MemberSpec:
    """What an assignor knows of a member."""

    member_id: str
    subscribed_topic_ids: frozenset[uuid.UUID]
    assignment: Assignment = field(default_factory=dict)  # its current target assignment
    instance_id: str | None = None
    rack_id: str | None = None


class PartitionAssignor(Protocol):
    name: str

    def assign(self, members: Mapping[str, MemberSpec], topics: Mapping[uuid.UUID, int]) -> dict[str, Assignment]:
        """members by member id; topics: partition count of every existing subscribed topic.
        Returns every member's new target assignment."""
        ...


def _sort_key(topic_id: uuid.UUID, partition: int) -> tuple[str, int]:
    return str(topic_id), partition


def _to_assignment(owned: set[tuple[uuid.UUID, int]]) -> Assignment:
    out: dict[uuid.UUID, set[int]] = {}
    for topic_id, partition in owned:
        out.setdefault(topic_id, set()).add(partition)
    return {t: frozenset(ps) for t, ps in out.items()}


class UniformAssignor:
    name = UNIFORM

    def assign(self, members: Mapping[str, MemberSpec], topics: Mapping[uuid.UUID, int]) -> dict[str, Assignment]:
        ids = sorted(members)
        subs = {m: members[m].subscribed_topic_ids & topics.keys() for m in ids}
        owned: dict[str, set[tuple[uuid.UUID, int]]] = {m: set() for m in ids}
        taken: set[tuple[uuid.UUID, int]] = set()

        # 1. Stickiness: members keep the partitions they still may have.
        for m in ids:
            for topic_id, partitions in members[m].assignment.items():
                if topic_id not in subs[m]:
                    continue
                for p in partitions:
                    if p < topics[topic_id] and (topic_id, p) not in taken:
                        taken.add((topic_id, p))
                        owned[m].add((topic_id, p))

        # 2. Unowned partitions go to the least loaded subscriber; topics with fewer
        #    subscribers first, as they leave the least choice.
        subscribers: dict[uuid.UUID, list[str]] = {t: [m for m in ids if t in subs[m]] for t in topics}
        free = sorted(
            ((t, p) for t, count in topics.items() if subscribers[t] for p in range(count) if (t, p) not in taken),
            key=lambda tp: (len(subscribers[tp[0]]), _sort_key(*tp)),
        )
        for t, p in free:
            receiver = min(subscribers[t], key=lambda m: (len(owned[m]), m))
            owned[receiver].add((t, p))

        # 3. Balance: move partitions from a member to one with at least two fewer, along a
        #    chain of members when no direct move is possible (heterogeneous subscriptions).
        while self._move_once(ids, subs, owned):
            pass
        return {m: _to_assignment(owned[m]) for m in ids}

    @staticmethod
    def _move_once(ids: list[str], subs: dict[str, frozenset[uuid.UUID]],
                   owned: dict[str, set[tuple[uuid.UUID, int]]]) -> bool:
        """One improving move (or chain of moves); False when the loads are balanced as far as
        the subscriptions allow."""
        by_load = sorted(ids, key=lambda m: (-len(owned[m]), m))
        for giver in by_load:
            load = len(owned[giver])
            # Breadth-first search from the giver: an edge u -> v when u holds a partition of
            # a topic v subscribes to. The first member reached with load <= load - 2 ends it.
            parent: dict[str, tuple[str, tuple[uuid.UUID, int]]] = {}
            seen = {giver}
            queue = deque([giver])
            while queue:
                u = queue.popleft()
                held = sorted(owned[u], key=lambda tp: _sort_key(*tp), reverse=True)
                for v in sorted(ids, key=lambda m: (len(owned[m]), m)):
                    if v in seen:
                        continue
                    tp = next((x for x in held if x[0] in subs[v]), None)
                    if tp is None:
                        continue
                    seen.add(v)
                    parent[v] = (u, tp)
                    if len(owned[v]) <= load - 2:
                        while v != giver:  # apply the chain backwards: each hop moves one partition
                            u_, tp_ = parent[v]
                            owned[u_].remove(tp_)
                            owned[v].add(tp_)
                            v = u_
                        return True
                    queue.append(v)
            if load <= min(len(owned[m]) for m in ids) + 1:
                return False
        return False


class RangeAssignor:
    name = RANGE

    def assign(self, members: Mapping[str, MemberSpec], topics: Mapping[uuid.UUID, int]) -> dict[str, Assignment]:
        # Static members first, by instance id (stable across restarts), then the others by id.
        order = sorted(members.values(), key=lambda m: (m.instance_id is None, m.instance_id or m.member_id))
        out: dict[str, dict[uuid.UUID, frozenset[int]]] = {m.member_id: {} for m in order}
        for topic_id in sorted(topics, key=str):
            count = topics[topic_id]
            subscribers = [m.member_id for m in order if topic_id in m.subscribed_topic_ids]
            if not subscribers:
                continue
            quota, extra = divmod(count, len(subscribers))
            start = 0
            for i, member_id in enumerate(subscribers):
                end = min(start + quota + (1 if i < extra else 0), count)
                if start < end:
                    out[member_id][topic_id] = frozenset(range(start, end))
                start = end
        return dict(out)


BUILTIN_ASSIGNORS: dict[str, PartitionAssignor] = {UNIFORM: UniformAssignor(), RANGE: RangeAssignor()}


def assignors_from_names(names: list[str]) -> dict[str, PartitionAssignor]:
    """The configured assignors in order (the first one is the default). Unknown names raise
    ValueError: custom assignor classes are not supported."""
    out: dict[str, PartitionAssignor] = {}
    for name in names:
        if name not in BUILTIN_ASSIGNORS:
            raise ValueError("unknown consumer group assignor %r (supported: %s)" % (name, ", ".join(BUILTIN_ASSIGNORS)))
        out[name] = BUILTIN_ASSIGNORS[name]
    if not out:
        raise ValueError("group.consumer.assignors must name at least one assignor")
    return out
