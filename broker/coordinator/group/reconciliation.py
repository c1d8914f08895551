"""Reconciliation of a KIP-848 member towards its target assignment (Kafka's CurrentAssignmentBuilder).

A member moves towards the target assignment of the group in steps, and never receives a
partition that another member still owns:

- partitions it must give up are revoked first: it stays at its epoch in UNREVOKED_PARTITIONS
  until a heartbeat no longer reports them among its owned partitions;
- it then moves to the target epoch and receives the target partitions nobody owns
  (STABLE), or those that are free while it waits for the others (UNRELEASED_PARTITIONS);
- a partition's owner is known by `current_partition_epoch(topic_id, partition)` (-1: free).

`reconcile` is a pure function: the member in, the next member out (the same object when
nothing changes). The states and their legal moves are data (`MemberState`, `NEXT_STATES`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable

from broker.coordinator.group.member import (
    EMPTY,
    NEXT_STATES,
    Assignment,
    ConsumerGroupMember,
    MemberState,
    union,
)
from protocol.errors import ErrorCode, KafkaError

M = MemberState


def _owns_any(owned: Assignment | None, partitions: Assignment) -> bool:
    """Whether a member still owns any of `partitions`; a member that did not report its owned
    partitions is assumed to own them all."""
    if owned is None:
        return True
    return any(owned.get(t, frozenset()) & ps for t, ps in partitions.items())


# ----- the state machine -----------------------------------------------------------------
def reconcile(
    member: ConsumerGroupMember,
    target_epoch: int,
    target: Assignment,
    subscribed_topic_ids: frozenset[uuid.UUID],
    current_partition_epoch: Callable[[uuid.UUID, int], int],
    owned: Assignment | None,
    has_subscription_changed: bool = False,
) -> ConsumerGroupMember:
    """The member's next state given the group's target assignment.

    subscribed_topic_ids: the member's subscription resolved to existing topics; target
        partitions of other topics are not handed out and owned ones are revoked.
    owned: the partitions the member reported owning in this heartbeat (None: not reported).
    Raises FENCED_MEMBER_EPOCH for a member in an UNKNOWN state that still owns partitions.
    """
    state = member.state
    if state is M.STABLE:
        if member.member_epoch != target_epoch:
            nxt = _next_assignment(member, member.member_epoch, target_epoch, target, subscribed_topic_ids,
                                   current_partition_epoch, owned)
        elif has_subscription_changed:
            nxt = _drop_unsubscribed(member, subscribed_topic_ids, owned)
        else:
            nxt = member
    elif state is M.UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            # Still revoking; a changed subscription may add partitions to revoke.
            nxt = _drop_unsubscribed(member, subscribed_topic_ids, owned) if has_subscription_changed else member
        else:
            nxt = _next_assignment(member, member.member_epoch, target_epoch, target, subscribed_topic_ids,
                                   current_partition_epoch, owned)
    elif state is M.UNRELEASED_PARTITIONS:
        nxt = _next_assignment(member, member.member_epoch, target_epoch, target, subscribed_topic_ids,
                               current_partition_epoch, owned)
    else:
        if owned is None or any(owned.values()):
            raise KafkaError(ErrorCode.FENCED_MEMBER_EPOCH,
                             "The consumer group member is in a unknown state. "
                             "The member must abandon all its partitions and rejoin.")
        nxt = _next_assignment(member, target_epoch, target_epoch, target, subscribed_topic_ids,
                               current_partition_epoch, owned)
    if nxt.state not in NEXT_STATES[state]:
        raise AssertionError("illegal member transition %s -> %s" % (state.name, nxt.state.name))
    return stamp_assignment_epochs(member, nxt)


def stamp_assignment_epochs(before: ConsumerGroupMember, after: ConsumerGroupMember) -> ConsumerGroupMember:
    """KIP-1251: a partition the member held already keeps the epoch it was given at (also once
    pending revocation); a new one is given at the member's new epoch."""
    if after is before:
        return after
    epochs: dict[uuid.UUID, dict[int, int]] = {}
    for assignment in (after.assigned, after.pending_revocation):
        for topic_id, partitions in assignment.items():
            for p in partitions:
                held_at = before.assignment_epoch(topic_id, p)
                epochs.setdefault(topic_id, {})[p] = after.member_epoch if held_at is None else held_at
    return dataclasses.replace(after, assignment_epochs=epochs)


def _drop_unsubscribed(member: ConsumerGroupMember, subscribed: frozenset[uuid.UUID],
                       owned: Assignment | None) -> ConsumerGroupMember:
    """The member's subscription changed: revoke what it holds of topics it left, at once
    (without waiting for a new target assignment)."""
    kept = {t: ps for t, ps in member.assigned.items() if t in subscribed}
    if len(kept) == len(member.assigned):
        return member
    removed = {t: ps for t, ps in member.assigned.items() if t not in subscribed}
    pending = union(member.pending_revocation, removed)
    if pending and _owns_any(owned, pending):
        return dataclasses.replace(member, state=M.UNREVOKED_PARTITIONS, assigned=kept, pending_revocation=pending)
    return dataclasses.replace(member, assigned=kept)  # already revoked by the client


def _next_assignment(
    member: ConsumerGroupMember,
    member_epoch: int,
    target_epoch: int,
    target: Assignment,
    subscribed: frozenset[uuid.UUID],
    current_partition_epoch: Callable[[uuid.UUID, int], int],
    owned: Assignment | None,
) -> ConsumerGroupMember:
    assigned: dict[uuid.UUID, frozenset[int]] = {}
    revoking: dict[uuid.UUID, frozenset[int]] = {}
    to_assign: dict[uuid.UUID, frozenset[int]] = {}
    unreleased = False
    for topic_id in set(target) | set(member.assigned):
        wanted = target.get(topic_id, frozenset()) if topic_id in subscribed else frozenset()
        current = member.assigned.get(topic_id, frozenset())
        keep = current & wanted
        give_up = current - keep
        # A partition still owned by another member waits; one this member is itself revoking
        # is not "owned by another" (only one member can own a partition at a time).
        pending_own = member.pending_revocation.get(topic_id, frozenset())
        free = frozenset(p for p in wanted - keep
                         if current_partition_epoch(topic_id, p) == -1 or p in pending_own)
        unreleased = unreleased or len(free) < len(wanted - keep)
        if keep:
            assigned[topic_id] = keep
        if give_up:
            revoking[topic_id] = give_up
        if free:
            to_assign[topic_id] = free

    if revoking and _owns_any(owned, revoking):
        # Revoke first: the member keeps its epoch until the client confirms the revocation.
        return dataclasses.replace(
            member, state=M.UNREVOKED_PARTITIONS, member_epoch=member_epoch,
            previous_member_epoch=member.member_epoch, assigned=assigned, pending_revocation=revoking,
        )
    new_state = M.UNRELEASED_PARTITIONS if unreleased else M.STABLE
    return dataclasses.replace(
        member, state=new_state, member_epoch=target_epoch, previous_member_epoch=member.member_epoch,
        assigned=union(assigned, to_assign), pending_revocation=EMPTY,
    )
