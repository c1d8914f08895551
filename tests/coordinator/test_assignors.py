"""The server-side assignors: coverage, balance, stickiness (uniform) and co-partitioning (range)."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.coordinator.group.assignors import MemberSpec as Spec
from broker.coordinator.group.assignors import (
    RangeAssignor,
    UniformAssignor,
    assignors_from_names,
)

T = [uuid.uuid5(uuid.NAMESPACE_DNS, "topic-%d" % i) for i in range(6)]
uniform = UniformAssignor()
ranged = RangeAssignor()


def load(assignment: dict[uuid.UUID, frozenset[int]]) -> int:
    return sum(len(ps) for ps in assignment.values())


def pairs(assignment: dict[uuid.UUID, frozenset[int]]) -> set[tuple[uuid.UUID, int]]:
    return {(t, p) for t, ps in assignment.items() for p in ps}


def check_coverage(members: dict[str, Spec], topics: dict[uuid.UUID, int],
                   result: dict[str, dict[uuid.UUID, frozenset[int]]]) -> None:
    """Every partition of a topic with a subscriber goes to exactly one of its subscribers."""
    assert set(result) == set(members)
    seen: set[tuple[uuid.UUID, int]] = set()
    for member_id, assignment in result.items():
        for t, p in pairs(assignment):
            assert t in members[member_id].subscribed_topic_ids
            assert 0 <= p < topics[t]
            assert (t, p) not in seen
            seen.add((t, p))
    wanted = {(t, p) for t, n in topics.items() for p in range(n)
              if any(t in m.subscribed_topic_ids for m in members.values())}
    assert seen == wanted


def specs(subscriptions: dict[str, frozenset[uuid.UUID]],
          previous: dict[str, dict[uuid.UUID, frozenset[int]]] | None = None) -> dict[str, Spec]:
    previous = previous or {}
    return {m: Spec(m, subs, previous.get(m, {})) for m, subs in subscriptions.items()}


topics_st = st.lists(st.integers(1, 12), min_size=1, max_size=4).map(lambda ns: {T[i]: n for i, n in enumerate(ns)})
SETTINGS = settings(max_examples=60, deadline=None)


@SETTINGS
@given(topics=topics_st, n_members=st.integers(1, 7))
def test_uniform_homogeneous_is_balanced_and_complete(topics: dict[uuid.UUID, int], n_members: int) -> None:
    members = specs({"m%d" % i: frozenset(topics) for i in range(n_members)})
    result = uniform.assign(members, topics)
    check_coverage(members, topics, result)
    loads = [load(a) for a in result.values()]
    assert max(loads) - min(loads) <= 1


@SETTINGS
@given(topics=topics_st, data=st.data())
def test_uniform_heterogeneous_is_complete_and_locally_balanced(topics: dict[uuid.UUID, int],
                                                                data: st.DataObject) -> None:
    ids = list(topics)
    n_members = data.draw(st.integers(1, 6))
    subscriptions = {"m%d" % i: frozenset(data.draw(st.lists(st.sampled_from(ids), max_size=len(ids))))
                     for i in range(n_members)}
    members = specs(subscriptions)
    result = uniform.assign(members, topics)
    check_coverage(members, topics, result)
    # No member could take a partition from one holding two more.
    for a, ra in result.items():
        for b, rb in result.items():
            if load(ra) >= load(rb) + 2:
                assert not any(t in members[b].subscribed_topic_ids for t in ra), (a, b, result)


@SETTINGS
@given(topics=topics_st, n_members=st.integers(1, 6), extra=st.integers(1, 3), data=st.data())
def test_uniform_is_sticky(topics: dict[uuid.UUID, int], n_members: int, extra: int, data: st.DataObject) -> None:
    subs = {"m%d" % i: frozenset(topics) for i in range(n_members)}
    first = uniform.assign(specs(subs), topics)
    # The same input with its own output as the current assignment changes nothing.
    assert uniform.assign(specs(subs, first), topics) == first
    # Members join: nobody loses a partition unless its share shrinks.
    more = {**subs, **{"n%d" % i: frozenset(topics) for i in range(extra)}}
    second = uniform.assign(specs(more, first), topics)
    check_coverage(specs(more), topics, second)
    for m in subs:
        lost = pairs(first[m]) - pairs(second[m])
        assert len(lost) == max(0, load(first[m]) - load(second[m]))
    # A member leaves: the others keep everything they had.
    gone = data.draw(st.sampled_from(sorted(more)))
    rest = {m: s for m, s in more.items() if m != gone}
    if rest:
        third = uniform.assign(specs(rest, second), topics)
        for m in rest:
            assert pairs(second[m]) <= pairs(third[m])


def test_uniform_heterogeneous_moves_along_a_chain() -> None:
    """a holds t0 (only it may) and t1; b takes t1 and t2; c only t2: c gets its share only
    when a gives t1 to b and b gives t2 to c."""
    topics = {T[0]: 4, T[1]: 2, T[2]: 2}
    members = {
        "a": Spec("a", frozenset([T[0], T[1]]), {T[0]: frozenset(range(4)), T[1]: frozenset([0, 1])}),
        "b": Spec("b", frozenset([T[1], T[2]]), {T[2]: frozenset([0, 1])}),
        "c": Spec("c", frozenset([T[2]]), {}),
    }
    result = uniform.assign(members, topics)
    check_coverage(members, topics, result)
    assert result == {"a": {T[0]: frozenset(range(4))}, "b": {T[1]: frozenset([0, 1])}, "c": {T[2]: frozenset([0, 1])}}


def test_uniform_ignores_unknown_topics_and_partitions() -> None:
    topics = {T[0]: 2}
    members = {"a": Spec("a", frozenset([T[0], T[1]]), {T[0]: frozenset([0, 1, 5]), T[1]: frozenset([0])})}
    assert uniform.assign(members, topics) == {"a": {T[0]: frozenset([0, 1])}}
    assert uniform.assign({}, topics) == {}
    assert uniform.assign({"a": Spec("a", frozenset())}, topics) == {"a": {}}


def test_range_co_partitions() -> None:
    topics = {T[0]: 3, T[1]: 3}
    members = {m: Spec(m, frozenset(topics)) for m in ("m1", "m0")}
    result = ranged.assign(members, topics)
    assert result == {"m0": {T[0]: frozenset([0, 1]), T[1]: frozenset([0, 1])},
                      "m1": {T[0]: frozenset([2]), T[1]: frozenset([2])}}


def test_range_orders_static_members_by_instance_id() -> None:
    topics = {T[0]: 4}
    members = {
        "z": Spec("z", frozenset(topics), instance_id="i0"),
        "a": Spec("a", frozenset(topics)),
        "y": Spec("y", frozenset(topics), instance_id="i1"),
    }
    result = ranged.assign(members, topics)
    assert result == {"z": {T[0]: frozenset([0, 1])}, "y": {T[0]: frozenset([2])}, "a": {T[0]: frozenset([3])}}


@SETTINGS
@given(topics=topics_st, n_members=st.integers(1, 6))
def test_range_is_complete_and_contiguous(topics: dict[uuid.UUID, int], n_members: int) -> None:
    members = specs({"m%d" % i: frozenset(topics) for i in range(n_members)})
    result = ranged.assign(members, topics)
    check_coverage(members, topics, result)
    for assignment in result.values():
        for ps in assignment.values():
            assert sorted(ps) == list(range(min(ps), max(ps) + 1))
    # Same partition counts: same partitions from every topic.
    if len(set(topics.values())) == 1:
        for assignment in result.values():
            assert len({ps for ps in assignment.values()}) <= 1


def test_assignors_from_names() -> None:
    assert list(assignors_from_names(["range", "uniform"])) == ["range", "uniform"]
    with pytest.raises(ValueError):
        assignors_from_names(["org.example.Custom"])
    with pytest.raises(ValueError):
        assignors_from_names([])
