"""The share group (KIP-932): members, epochs, target assignment, initialized share-partitions.

Like a KIP-848 consumer group, a ShareGroup changes only by replaying its records (written by
share_heartbeat.py): ShareGroupMetadata (group epoch, metadata hash), ShareGroupMemberMetadata (a
member's subscription), ShareGroupTargetAssignmentMember / ...Metadata (the target assignment and
its epoch), ShareGroupCurrentMemberAssignment (a member's epoch and partitions) and
ShareGroupStatePartitionMetadata (the share-partitions whose state has been initialized, and those
being deleted). Share groups have no revocation: a member takes its target assignment at once, and
a partition may be assigned to several members. The state is EMPTY or STABLE.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from broker.coordinator.group.consumer import TopicMetadata
from broker.coordinator.group.member import EMPTY, Assignment, MemberState, assignment_of, partitions_by_topic
from broker.coordinator.group.modern import ModernGroup
from broker.coordinator.group.records import (
    SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    SHARE_GROUP_MEMBER_METADATA,
    SHARE_GROUP_METADATA,
    SHARE_GROUP_STATE_PARTITION_METADATA,
    SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
    SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
    coordinator_record,
)
from broker.coordinator.result import Record
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

GROUP_TYPE = "share"
PROTOCOL_TYPE = "share"
LEAVE_GROUP_MEMBER_EPOCH = -1
DEFAULT_ASSIGNOR = "simple"

TopicPartitions = dict[uuid.UUID, tuple[str, frozenset[int]]]
"""Share-partitions by topic id: (topic name, partitions)."""


class ShareGroupState(enum.Enum):
    EMPTY = "Empty"
    STABLE = "Stable"
    DEAD = "Dead"


@dataclass(frozen=True)
class ShareGroupMember:
    member_id: str
    member_epoch: int = 0
    previous_member_epoch: int = -1
    state: MemberState = MemberState.STABLE
    rack_id: str | None = None
    client_id: str = ""
    client_host: str = ""
    subscribed_topic_names: frozenset[str] = frozenset()
    assigned: Assignment = field(default_factory=dict)

    def same_metadata(self, other: ShareGroupMember) -> bool:
        return (self.rack_id, self.client_id, self.client_host, self.subscribed_topic_names) == (
            other.rack_id, other.client_id, other.client_host, other.subscribed_topic_names)


class ShareGroup(ModernGroup[ShareGroupMember]):
    type = GROUP_TYPE
    protocol_type = PROTOCOL_TYPE

    def __init__(self, group_id: str) -> None:
        super().__init__(group_id)
        self.initializing: TopicPartitions = {}
        self.initialized: TopicPartitions = {}
        self.deleting: dict[uuid.UUID, str] = {}
        self.has_state_metadata_record = False

    # ----- derived state ------------------------------------------------------------------
    @property
    def state(self) -> ShareGroupState:
        return ShareGroupState.STABLE if self.members else ShareGroupState.EMPTY

    def subscribed_topic_names(self, members: Iterable[ShareGroupMember] | None = None) -> set[str]:
        names: set[str] = set()
        for m in self.members.values() if members is None else members:
            names.update(m.subscribed_topic_names)
        return names

    def initialized_partitions(self) -> set[tuple[uuid.UUID, int]]:
        return {(t, p) for t, (_, ps) in self.initialized.items() for p in ps}

    # ----- what other group kinds ask of a group ------------------------------------------
    def _not_a_consumer_group(self) -> KafkaError:
        return KafkaError(ErrorCode.GROUP_ID_NOT_FOUND, "Group %s is not a consumer group." % self.group_id)

    def validate_offset_commit(self, *args: Any) -> None:
        raise self._not_a_consumer_group()

    def validate_offset_fetch(self, *args: Any) -> None:
        raise self._not_a_consumer_group()

    def validate_offset_delete(self) -> None:
        raise self._not_a_consumer_group()

    def offset_expiration_base(self) -> None:
        return None  # a share group has no committed offsets to expire

    # ----- records ------------------------------------------------------------------------
    def tombstones(self) -> list[Record]:
        g = self.group_id
        records = [current_assignment_tombstone(g, m) for m in self.members]
        records += [target_assignment_tombstone(g, m) for m in self.members]
        records.append(target_assignment_epoch_tombstone(g))
        records += [member_tombstone(g, m) for m in self.members]
        records.append(state_partition_metadata_tombstone(g))
        records.append(group_epoch_tombstone(g))
        return records

    # ----- descriptions -------------------------------------------------------------------
    def describe(self, metadata: TopicMetadata) -> Any:
        R = M.ShareGroupDescribeResponse

        def topic_partitions(assignment: Assignment) -> list[Any]:
            out = []
            for topic_id, partitions in partitions_by_topic(assignment):
                info = metadata.topic_by_id(topic_id)
                if info is not None:
                    out.append(R.TopicPartitions(topic_id=topic_id, topic_name=info.name, partitions=partitions))
            return out

        return R.DescribedGroup(
            group_id=self.group_id, group_state=self.state.value, group_epoch=self.group_epoch,
            assignment_epoch=self.assignment_epoch, assignor_name=DEFAULT_ASSIGNOR,
            members=[R.Member(member_id=m.member_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
                              client_id=m.client_id, client_host=m.client_host,
                              subscribed_topic_names=sorted(m.subscribed_topic_names),
                              assignment=R.Assignment(topic_partitions=topic_partitions(m.assigned)))
                     for m in self.members.values()],
        )


# ----- records ------------------------------------------------------------------------------

def group_epoch_record(group_id: str, epoch: int, metadata_hash: int) -> Record:
    return coordinator_record(SHARE_GROUP_METADATA, M.ShareGroupMetadataKey(group_id=group_id),
                              M.ShareGroupMetadataValue(epoch=epoch, metadata_hash=metadata_hash))


def group_epoch_tombstone(group_id: str) -> Record:
    return coordinator_record(SHARE_GROUP_METADATA, M.ShareGroupMetadataKey(group_id=group_id), None)


def member_record(group_id: str, member: ShareGroupMember) -> Record:
    return coordinator_record(
        SHARE_GROUP_MEMBER_METADATA, M.ShareGroupMemberMetadataKey(group_id=group_id, member_id=member.member_id),
        M.ShareGroupMemberMetadataValue(rack_id=member.rack_id, client_id=member.client_id,
                                        client_host=member.client_host,
                                        subscribed_topic_names=sorted(member.subscribed_topic_names)))


def member_tombstone(group_id: str, member_id: str) -> Record:
    return coordinator_record(SHARE_GROUP_MEMBER_METADATA,
                              M.ShareGroupMemberMetadataKey(group_id=group_id, member_id=member_id), None)


def target_assignment_epoch_record(group_id: str, epoch: int) -> Record:
    return coordinator_record(SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
                              M.ShareGroupTargetAssignmentMetadataKey(group_id=group_id),
                              M.ShareGroupTargetAssignmentMetadataValue(assignment_epoch=epoch))


def target_assignment_epoch_tombstone(group_id: str) -> Record:
    return coordinator_record(SHARE_GROUP_TARGET_ASSIGNMENT_METADATA,
                              M.ShareGroupTargetAssignmentMetadataKey(group_id=group_id), None)


def target_assignment_record(group_id: str, member_id: str, assignment: Assignment) -> Record:
    V = M.ShareGroupTargetAssignmentMemberValue
    return coordinator_record(
        SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER, M.ShareGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id),
        V(topic_partitions=[V.TopicPartition(topic_id=t, partitions=ps) for t, ps in partitions_by_topic(assignment)]))


def target_assignment_tombstone(group_id: str, member_id: str) -> Record:
    return coordinator_record(SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER,
                              M.ShareGroupTargetAssignmentMemberKey(group_id=group_id, member_id=member_id), None)


def current_assignment_record(group_id: str, member: ShareGroupMember) -> Record:
    V = M.ShareGroupCurrentMemberAssignmentValue
    return coordinator_record(
        SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
        M.ShareGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member.member_id),
        V(member_epoch=member.member_epoch, previous_member_epoch=member.previous_member_epoch,
          state=int(member.state),
          assigned_partitions=[V.TopicPartitions(topic_id=t, partitions=ps)
                               for t, ps in partitions_by_topic(member.assigned)]))


def current_assignment_tombstone(group_id: str, member_id: str) -> Record:
    return coordinator_record(SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT,
                              M.ShareGroupCurrentMemberAssignmentKey(group_id=group_id, member_id=member_id), None)


def state_partition_metadata_record(group_id: str, initializing: TopicPartitions, initialized: TopicPartitions,
                                    deleting: Mapping[uuid.UUID, str]) -> Record:
    V = M.ShareGroupStatePartitionMetadataValue

    def infos(tps: TopicPartitions) -> list[Any]:
        return [V.TopicPartitionsInfo(topic_id=t, topic_name=name, partitions=sorted(ps))
                for t, (name, ps) in sorted(tps.items(), key=lambda kv: str(kv[0]))]

    return coordinator_record(
        SHARE_GROUP_STATE_PARTITION_METADATA, M.ShareGroupStatePartitionMetadataKey(group_id=group_id),
        V(initializing_topics=infos(initializing), initialized_topics=infos(initialized),
          deleting_topics=[V.TopicInfo(topic_id=t, topic_name=n) for t, n in sorted(deleting.items(), key=str)]))


def state_partition_metadata_tombstone(group_id: str) -> Record:
    return coordinator_record(SHARE_GROUP_STATE_PARTITION_METADATA,
                              M.ShareGroupStatePartitionMetadataKey(group_id=group_id), None)


# ----- replay -------------------------------------------------------------------------------

def _group(groups: dict[str, Any], group_id: str, create: bool) -> ShareGroup | None:
    group = groups.get(group_id)
    if isinstance(group, ShareGroup):
        return group
    if group is not None:
        raise RuntimeError("group %s is not a share group" % group_id)
    if not create:
        return None
    new = ShareGroup(group_id)
    groups[group_id] = new
    return new


def _topic_partitions(infos: Iterable[Any]) -> TopicPartitions:
    return {i.topic_id: (i.topic_name, frozenset(i.partitions)) for i in infos}


def replay_share_group_record(groups: dict[str, Any], record_type: int, key: Any, value: Any) -> None:
    """Apply one share group record (a None value is a tombstone) to `groups`."""
    group = _group(groups, key.group_id, value is not None)
    if group is None:
        return
    if record_type == SHARE_GROUP_METADATA:
        if value is None:
            if group.members:
                raise RuntimeError("share group %s still has members" % group.group_id)
            del groups[group.group_id]
        else:
            group.group_epoch, group.metadata_hash = value.epoch, value.metadata_hash
    elif record_type == SHARE_GROUP_MEMBER_METADATA:
        old = group.members.get(key.member_id)
        if value is None:
            group.members.pop(key.member_id, None)
        else:
            group.members[key.member_id] = dataclasses.replace(
                old or ShareGroupMember(key.member_id), rack_id=value.rack_id, client_id=value.client_id,
                client_host=value.client_host, subscribed_topic_names=frozenset(value.subscribed_topic_names))
    elif record_type == SHARE_GROUP_TARGET_ASSIGNMENT_METADATA:
        group.assignment_epoch = 0 if value is None else value.assignment_epoch
    elif record_type == SHARE_GROUP_TARGET_ASSIGNMENT_MEMBER:
        if value is None:
            group.target_assignment.pop(key.member_id, None)
        else:
            group.target_assignment[key.member_id] = assignment_of(
                (tp.topic_id, tp.partitions) for tp in value.topic_partitions)
    elif record_type == SHARE_GROUP_CURRENT_MEMBER_ASSIGNMENT:
        old = group.members.get(key.member_id)
        if value is None:
            if old is not None:
                group.members[key.member_id] = dataclasses.replace(
                    old, member_epoch=LEAVE_GROUP_MEMBER_EPOCH, previous_member_epoch=LEAVE_GROUP_MEMBER_EPOCH,
                    assigned=EMPTY)
        else:
            group.members[key.member_id] = dataclasses.replace(
                old or ShareGroupMember(key.member_id), member_epoch=value.member_epoch,
                previous_member_epoch=value.previous_member_epoch, state=MemberState.from_value(value.state),
                assigned=assignment_of((tp.topic_id, tp.partitions) for tp in value.assigned_partitions))
    elif record_type == SHARE_GROUP_STATE_PARTITION_METADATA:
        if value is None:
            group.initializing, group.initialized, group.deleting = {}, {}, {}
            group.has_state_metadata_record = False
        else:
            group.initializing = _topic_partitions(value.initializing_topics)
            group.initialized = _topic_partitions(value.initialized_topics)
            group.deleting = {t.topic_id: t.topic_name for t in value.deleting_topics}
            group.has_state_metadata_record = True
