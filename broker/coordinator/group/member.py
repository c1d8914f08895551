"""A KIP-848 consumer-group member and its assignments: the state types that the group
(consumer.py), reconciliation (reconciliation.py) and the heartbeat handlers share.

`Assignment` is partitions by topic id; `MemberState` and `NEXT_STATES` are Kafka's member
states with their legal moves as data; `ConsumerGroupMember` is immutable (handlers build the
next version with dataclasses.replace) and writes its ConsumerGroupCurrentMemberAssignment record.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from broker.coordinator.group.records import (
    ClassicProtocolMetadata,
    PartitionsByTopic,
    current_assignment_record,
)
from broker.coordinator.result import Record

Assignment = Mapping[uuid.UUID, frozenset[int]]
"""Partitions by topic id; a topic with no partition is left out."""

EMPTY: Assignment = {}


class MemberState(enum.IntEnum):
    """Kafka's MemberState, with its int8 value in ConsumerGroupCurrentMemberAssignment records."""

    STABLE = 0
    UNREVOKED_PARTITIONS = 1
    UNRELEASED_PARTITIONS = 2
    UNKNOWN = 127

    @classmethod
    def from_value(cls, value: int) -> MemberState:
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN  # a state written by a newer coordinator


M = MemberState

# The states reconciliation may move a member to, from each state. UNKNOWN is only ever read
# from a record; such a member is fenced unless it owns nothing, and then starts afresh.
NEXT_STATES: dict[MemberState, frozenset[MemberState]] = {
    M.STABLE: frozenset([M.STABLE, M.UNREVOKED_PARTITIONS, M.UNRELEASED_PARTITIONS]),
    M.UNREVOKED_PARTITIONS: frozenset([M.STABLE, M.UNREVOKED_PARTITIONS, M.UNRELEASED_PARTITIONS]),
    M.UNRELEASED_PARTITIONS: frozenset([M.STABLE, M.UNREVOKED_PARTITIONS, M.UNRELEASED_PARTITIONS]),
    M.UNKNOWN: frozenset([M.STABLE, M.UNRELEASED_PARTITIONS]),
}


# ----- assignments -----------------------------------------------------------------------
def assignment_of(pairs: Iterable[tuple[uuid.UUID, Iterable[int]]]) -> dict[uuid.UUID, frozenset[int]]:
    """An Assignment from (topic id, partitions) pairs; repeated topics are merged."""
    out: dict[uuid.UUID, set[int]] = {}
    for topic_id, partitions in pairs:
        out.setdefault(topic_id, set()).update(partitions)
    return {t: frozenset(ps) for t, ps in out.items() if ps}


def union(a: Assignment, b: Assignment) -> dict[uuid.UUID, frozenset[int]]:
    return assignment_of([*a.items(), *b.items()])


def partitions_count(a: Assignment) -> int:
    return sum(len(ps) for ps in a.values())


def is_subset(owned: Assignment | None, target: Assignment) -> bool:
    """Whether the member owns only partitions of `target` (None: it did not say)."""
    if owned is None:
        return True
    return all(ps <= target.get(t, frozenset()) for t, ps in owned.items())


def partitions_by_topic(assignment: Assignment) -> PartitionsByTopic:
    return [(t, sorted(ps)) for t, ps in sorted(assignment.items(), key=lambda kv: str(kv[0]))]


@dataclass(frozen=True)
class ConsumerGroupMember:
    """A member; immutable: handlers build the next version with dataclasses.replace."""

    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    instance_id: str | None = None
    rack_id: str | None = None
    rebalance_timeout_ms: int = -1
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: frozenset[str] = frozenset()
    subscribed_topic_regex: str | None = None
    server_assignor: str | None = None
    assigned: Assignment = field(default_factory=dict)
    pending_revocation: Assignment = field(default_factory=dict)
    classic: ClassicProtocolMetadata | None = None  # set for a member that joined with JoinGroup
    # KIP-1251 (Kafka 4.3): the member epoch at which each partition it holds (assigned or pending
    # revocation) was assigned to it; a partition missing here counts as assigned at member_epoch
    assignment_epochs: Mapping[uuid.UUID, Mapping[int, int]] = field(default_factory=dict)

    def assignment_epoch(self, topic_id: uuid.UUID, partition: int) -> int | None:
        """The epoch the member was given the partition at, None if it does not hold it."""
        if partition not in self.assigned.get(topic_id, ()) and partition not in self.pending_revocation.get(
                topic_id, ()):
            return None
        return self.assignment_epochs.get(topic_id, {}).get(partition, self.member_epoch)

    @property
    def uses_classic_protocol(self) -> bool:
        return self.classic is not None

    def is_reconciled_to(self, target_epoch: int) -> bool:
        return self.state is MemberState.STABLE and self.member_epoch == target_epoch

    def same_metadata(self, other: ConsumerGroupMember) -> bool:
        """Whether the fields a ConsumerGroupMemberMetadata record holds are equal."""
        return (self.instance_id, self.rack_id, self.client_id, self.client_host, self.subscribed_topic_names,
                self.subscribed_topic_regex, self.rebalance_timeout_ms, self.server_assignor, self.classic) == (
                other.instance_id, other.rack_id, other.client_id, other.client_host, other.subscribed_topic_names,
                other.subscribed_topic_regex, other.rebalance_timeout_ms, other.server_assignor, other.classic)

    def current_assignment_record(self, group_id: str) -> Record:
        return current_assignment_record(
            group_id, self.member_id, member_epoch=self.member_epoch, previous_member_epoch=self.previous_member_epoch,
            state=int(self.state), assigned=partitions_by_topic(self.assigned),
            pending_revocation=partitions_by_topic(self.pending_revocation),
            epoch_of=lambda t, p: self.assignment_epochs.get(t, {}).get(p, self.member_epoch),
        )
