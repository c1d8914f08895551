"""The share groups' server-side assignor (Kafka's SimpleAssignor): balanced, sticky, and shared.

Each partition of the subscribed topics goes to `ceil(members / partitions)` members (the desired
sharing), so that when members outnumber partitions every member still gets one and all make
progress; the assignments are spread evenly (their counts differ by at most one), and a member
keeps what it had as far as that allows. Members with the same subscription share the partitions
of all their topics together (Kafka's homogeneous builder); otherwise each topic is shared among
its own subscribers (the heterogeneous case).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence

from broker.coordinator.group.member import Assignment

TP = tuple[uuid.UUID, int]


def _tp_key(tp: TP) -> tuple[str, int]:
    return str(tp[0]), tp[1]


def balance(partitions: Sequence[TP], members: Sequence[str], current: Mapping[str, set[TP]]) -> dict[str, set[TP]]:
    """Share `partitions` among `members` (in this order of preference), keeping `current`."""
    result: dict[str, set[TP]] = {m: set() for m in members}
    if not partitions or not members:
        return result
    sharing = -(-len(members) // len(partitions))
    slots = sharing * len(partitions)
    desired = {m: slots // len(members) + (1 if i < slots % len(members) else 0) for i, m in enumerate(members)}
    holders: dict[TP, list[str]] = {p: [] for p in partitions}
    for m in members:  # stickiness: keep what is still assignable and not over the limits
        for p in sorted(current.get(m, ()), key=_tp_key):
            if p in holders and len(holders[p]) < sharing and len(result[m]) < desired[m]:
                holders[p].append(m)
                result[m].add(p)
    order = {m: i for i, m in enumerate(members)}
    for p in partitions:
        while len(holders[p]) < sharing:
            free = [m for m in members if p not in result[m]]
            if not free:
                break
            under = [m for m in free if len(result[m]) < desired[m]] or free
            m = min(under, key=lambda x: (len(result[x]), order[x]))
            holders[p].append(m)
            result[m].add(p)
    return result


def assign(subscriptions: Mapping[str, frozenset[uuid.UUID]], partition_counts: Mapping[uuid.UUID, int],
           current: Mapping[str, Assignment]) -> dict[str, Assignment]:
    """The target assignment: member id -> partitions by topic id."""
    members = sorted(subscriptions)
    owned = {m: {(t, p) for t, ps in current.get(m, {}).items() for p in ps} for m in members}
    shares: dict[str, set[TP]] = {m: set() for m in members}
    if len({subscriptions[m] for m in members}) <= 1:
        topics = sorted((t for t in (subscriptions[members[0]] if members else ()) if t in partition_counts), key=str)
        partitions = [(t, p) for t in topics for p in range(partition_counts[t])]
        shares = balance(partitions, members, owned)
    else:
        for topic in sorted({t for s in subscriptions.values() for t in s if t in partition_counts}, key=str):
            subscribers = [m for m in members if topic in subscriptions[m]]
            partitions = [(topic, p) for p in range(partition_counts[topic])]
            mine = {m: {tp for tp in owned[m] if tp[0] == topic} for m in subscribers}
            for m, got in balance(partitions, subscribers, mine).items():
                shares[m] |= got
    out: dict[str, Assignment] = {}
    for m, tps in shares.items():
        by_topic: dict[uuid.UUID, set[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, set()).add(p)
        out[m] = {t: frozenset(ps) for t, ps in by_topic.items()}
    return out
