"""The member state machine (reconciliation.reconcile), state by state."""

from __future__ import annotations

import uuid

import pytest

from broker.coordinator.group.member import NEXT_STATES, ConsumerGroupMember, MemberState, assignment_of
from broker.coordinator.group.reconciliation import reconcile
from protocol.errors import ErrorCode, KafkaError

S = MemberState
A = uuid.uuid5(uuid.NAMESPACE_DNS, "a")
B = uuid.uuid5(uuid.NAMESPACE_DNS, "b")
BOTH = frozenset([A, B])


def asg(**topics: list[int]) -> dict[uuid.UUID, frozenset[int]]:
    ids = {"a": A, "b": B}
    return assignment_of((ids[t], ps) for t, ps in topics.items())


def free(_t: uuid.UUID, _p: int) -> int:
    return -1


def owned_by_other(*taken: tuple[uuid.UUID, int]) -> object:
    return lambda t, p: 7 if (t, p) in taken else -1


def test_states_and_transitions_are_data() -> None:
    assert [(s.name, int(s)) for s in S] == [("STABLE", 0), ("UNREVOKED_PARTITIONS", 1),
                                            ("UNRELEASED_PARTITIONS", 2), ("UNKNOWN", 127)]
    assert S.from_value(42) is S.UNKNOWN
    assert S.UNKNOWN not in set().union(*NEXT_STATES.values())
    assert NEXT_STATES[S.UNKNOWN] == {S.STABLE, S.UNRELEASED_PARTITIONS}


def test_stable_member_reaches_a_new_target_with_free_partitions() -> None:
    m = ConsumerGroupMember("m", member_epoch=1, assigned=asg(a=[0]))
    nxt = reconcile(m, 2, asg(a=[0, 1]), BOTH, free, owned=asg(a=[0]))
    assert (nxt.state, nxt.member_epoch, nxt.previous_member_epoch, nxt.assigned) == (S.STABLE, 2, 1, asg(a=[0, 1]))
    # Already reconciled: the same object comes back.
    assert reconcile(nxt, 2, asg(a=[0, 1]), BOTH, free, owned=None) is nxt


def test_revoke_before_assign() -> None:
    m = ConsumerGroupMember("m", member_epoch=1, assigned=asg(a=[0, 1]))
    # The target moves a-1 away and brings b-0: a-1 must be revoked first, epoch unchanged.
    step = reconcile(m, 2, asg(a=[0], b=[0]), BOTH, free, owned=asg(a=[0, 1]))
    assert (step.state, step.member_epoch, step.assigned, step.pending_revocation) == (
        S.UNREVOKED_PARTITIONS, 1, asg(a=[0]), asg(a=[1]))
    # Still reporting a-1 (or not reporting at all): no progress.
    assert reconcile(step, 2, asg(a=[0], b=[0]), BOTH, free, owned=asg(a=[0, 1])) is step
    assert reconcile(step, 2, asg(a=[0], b=[0]), BOTH, free, owned=None) is step
    # Revoked: the member moves to the target epoch and gets b-0.
    done = reconcile(step, 2, asg(a=[0], b=[0]), BOTH, free, owned=asg(a=[0]))
    assert (done.state, done.member_epoch, done.assigned, done.pending_revocation) == (
        S.STABLE, 2, asg(a=[0], b=[0]), {})


def test_revocation_already_done_by_the_client_skips_the_state() -> None:
    m = ConsumerGroupMember("m", member_epoch=1, assigned=asg(a=[0, 1]))
    nxt = reconcile(m, 2, asg(a=[0]), BOTH, free, owned=asg(a=[0]))
    assert (nxt.state, nxt.member_epoch, nxt.assigned) == (S.STABLE, 2, asg(a=[0]))


def test_unreleased_partitions_wait_for_their_owner() -> None:
    m = ConsumerGroupMember("m", member_epoch=1, assigned=asg(a=[0]))
    taken = owned_by_other((A, 1))
    step = reconcile(m, 2, asg(a=[0, 1], b=[0]), BOTH, taken, owned=asg(a=[0]))  # type: ignore[arg-type]
    assert (step.state, step.member_epoch, step.assigned) == (S.UNRELEASED_PARTITIONS, 2, asg(a=[0], b=[0]))
    # Still owned: it waits (only its previous epoch catches up, as in Kafka); released: it gets
    # the partition and is stable.
    again = reconcile(step, 2, asg(a=[0, 1], b=[0]), BOTH, taken, owned=None)  # type: ignore[arg-type]
    assert (again.state, again.member_epoch, again.previous_member_epoch, again.assigned) == (
        S.UNRELEASED_PARTITIONS, 2, 2, step.assigned)
    assert reconcile(again, 2, asg(a=[0, 1], b=[0]), BOTH, taken, owned=None) == again  # type: ignore[arg-type]
    done = reconcile(step, 2, asg(a=[0, 1], b=[0]), BOTH, free, owned=asg(a=[0], b=[0]))
    assert (done.state, done.assigned) == (S.STABLE, asg(a=[0, 1], b=[0]))


def test_only_nothing_to_do_but_wait() -> None:
    m = ConsumerGroupMember("m", member_epoch=1)
    nxt = reconcile(m, 2, asg(a=[0]), BOTH, owned_by_other((A, 0)), owned={})  # type: ignore[arg-type]
    assert (nxt.state, nxt.member_epoch, nxt.assigned) == (S.UNRELEASED_PARTITIONS, 2, {})


def test_unsubscribed_topics_are_not_assigned_and_are_revoked_at_once() -> None:
    m = ConsumerGroupMember("m", member_epoch=3, assigned=asg(a=[0], b=[0]))
    # The target still lists b (computed before the subscription changed): b is revoked now.
    nxt = reconcile(m, 3, asg(a=[0], b=[0]), frozenset([A]), free, owned=asg(a=[0], b=[0]),
                    has_subscription_changed=True)
    assert (nxt.state, nxt.member_epoch, nxt.assigned, nxt.pending_revocation) == (
        S.UNREVOKED_PARTITIONS, 3, asg(a=[0]), asg(b=[0]))
    # A client that already dropped b just shrinks.
    nxt = reconcile(m, 3, asg(a=[0], b=[0]), frozenset([A]), free, owned=asg(a=[0]), has_subscription_changed=True)
    assert (nxt.state, nxt.assigned, nxt.pending_revocation) == (S.STABLE, asg(a=[0]), {})


def test_unknown_state_is_fenced_unless_the_member_owns_nothing() -> None:
    m = ConsumerGroupMember("m", member_epoch=4, state=S.UNKNOWN, assigned=asg(a=[0]))
    for owned in (None, asg(a=[0])):
        with pytest.raises(KafkaError) as err:
            reconcile(m, 5, asg(a=[0]), BOTH, free, owned=owned)
        assert err.value.code == ErrorCode.FENCED_MEMBER_EPOCH
    nxt = reconcile(m, 5, asg(a=[0, 1]), BOTH, free, owned={})
    assert (nxt.state, nxt.member_epoch, nxt.assigned) == (S.STABLE, 5, asg(a=[0, 1]))
