"""The group coordinator's part of the share group offset admin APIs (KIP-932):
AlterShareGroupOffsets (91), DeleteShareGroupOffsets (92) and the share-partitions
DescribeShareGroupOffsets (90) lists when no topics are named.

As Kafka's GroupMetadataManager / GroupCoordinatorShard: both changes need a share group with no
members (NON_EMPTY_GROUP "The group is not empty."; a group of another type is GROUP_ID_NOT_FOUND
"Group <id> is not a share group."). Deleting needs the group to exist ("Group <id> not found.");
altering creates it when it does not exist yet (Kafka 4.2, KAFKA-19662: an operator positions a
group before its first member starts), at group epoch 0, through the share-partition metadata
record it writes as soon as one named topic exists.

Altering records the named partitions as initialized and asks the share coordinator (the caller
does that) to initialize their state at the new start offsets under the group epoch as state
epoch. Deleting moves the group's initialized topics named in the request to "deleting" (a topic
already there is retried over all its partitions); once the share coordinator has deleted their
state, `complete_delete` drops them from "deleting". Unknown topics and partitions are answered
UNKNOWN_TOPIC_OR_PARTITION.

Pure functions over the group and the cluster's topics; they return the records to write.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from broker.coordinator.group.consumer import TopicMetadata
from broker.coordinator.group.share_group import ShareGroup, TopicPartitions, state_partition_metadata_record
from broker.coordinator.result import Record
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode
AR = M.AlterShareGroupOffsetsResponse
DR = M.DeleteShareGroupOffsetsResponse
UNKNOWN_TOPIC_MESSAGE = "This server does not host this topic-partition."
NO_OFFSETS_MESSAGE = "There is no offset information to delete."


def share_group_or_raise(groups: dict[str, Any], group_id: str) -> ShareGroup:
    group = groups.get(group_id)
    if group is None:
        raise KafkaError(E.GROUP_ID_NOT_FOUND, "Group %s not found." % group_id)
    if not isinstance(group, ShareGroup):
        raise KafkaError(E.GROUP_ID_NOT_FOUND, "Group %s is not a share group." % group_id)
    return group


def _share_group_or_new(groups: dict[str, Any], group_id: str) -> ShareGroup:
    """The share group, or a new one (not in `groups`: replaying its records makes it)."""
    if group_id not in groups:
        return ShareGroup(group_id)
    return share_group_or_raise(groups, group_id)


def _validate_empty(group: ShareGroup) -> None:
    if not group.is_empty():
        raise KafkaError(E.NON_EMPTY_GROUP, "The group is not empty.")


@dataclass
class AlterResult:
    response: M.AlterShareGroupOffsetsResponse  # before the share coordinator's answers
    state_epoch: int  # the group epoch: the new state epoch of the altered share-partitions
    offsets: dict[tuple[uuid.UUID, int], int] = field(default_factory=dict)  # share-partition -> start offset


def alter_offsets(groups: dict[str, Any], group_id: str, request: M.AlterShareGroupOffsetsRequest, metadata: TopicMetadata
                  ) -> tuple[list[Record], AlterResult]:
    group = _share_group_or_new(groups, group_id)
    _validate_empty(group)
    topics = []
    named = False  # a named topic exists: the metadata record is written (and creates a new group)
    added: TopicPartitions = {}
    result = AlterResult(AR(), group.group_epoch)
    for t in request.topics:
        info = metadata.topic(t.topic_name)
        partitions = []
        if info is None:
            for p in t.partitions:
                partitions.append(AR.AlterShareGroupOffsetsResponsePartition(
                    partition_index=p.partition_index, error_code=E.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=UNKNOWN_TOPIC_MESSAGE))
            topics.append(AR.AlterShareGroupOffsetsResponseTopic(topic_name=t.topic_name, partitions=partitions))
            continue
        named = True
        valid: set[int] = set()
        for p in t.partitions:
            if 0 <= p.partition_index < info.partitions:
                valid.add(p.partition_index)
                result.offsets[(info.topic_id, p.partition_index)] = p.start_offset
                partitions.append(AR.AlterShareGroupOffsetsResponsePartition(partition_index=p.partition_index))
            else:
                partitions.append(AR.AlterShareGroupOffsetsResponsePartition(
                    partition_index=p.partition_index, error_code=E.UNKNOWN_TOPIC_OR_PARTITION,
                    error_message=UNKNOWN_TOPIC_MESSAGE))
        if valid:
            known = group.initialized.get(info.topic_id)
            added[info.topic_id] = (info.name, (known[1] if known else frozenset()) | valid)
        topics.append(AR.AlterShareGroupOffsetsResponseTopic(topic_name=t.topic_name, topic_id=info.topic_id,
                                                             partitions=partitions))
    result.response.responses = topics
    records: list[Record] = []
    if named:
        deleting = {t: n for t, n in group.deleting.items() if t not in added}
        records.append(state_partition_metadata_record(group_id, group.initializing, {**group.initialized, **added},
                                                       deleting))
    return records, result


@dataclass
class DeleteResult:
    errors: list[M.DeleteShareGroupOffsetsResponse.DeleteShareGroupOffsetsResponseTopic]  # those that cannot be
    to_delete: dict[uuid.UUID, tuple[str, list[int]]] = field(default_factory=dict)  # topic -> (name, partitions)


def initiate_delete(groups: dict[str, Any], group_id: str, request: M.DeleteShareGroupOffsetsRequest,
                    metadata: TopicMetadata
                    ) -> tuple[list[Record], DeleteResult]:
    group = share_group_or_raise(groups, group_id)
    _validate_empty(group)
    result = DeleteResult(errors=[])
    initialized = dict(group.initialized)
    deleting = dict(group.deleting)
    for t in request.topics:
        info = metadata.topic(t.topic_name)
        if info is None:
            result.errors.append(DR.DeleteShareGroupOffsetsResponseTopic(
                topic_name=t.topic_name, error_code=E.UNKNOWN_TOPIC_OR_PARTITION, error_message=UNKNOWN_TOPIC_MESSAGE))
        elif info.topic_id in initialized:
            name, partitions = initialized.pop(info.topic_id)
            result.to_delete[info.topic_id] = (name, sorted(partitions))
            deleting[info.topic_id] = name
        elif info.topic_id in deleting:
            result.to_delete[info.topic_id] = (info.name, list(range(info.partitions)))
        else:
            result.errors.append(DR.DeleteShareGroupOffsetsResponseTopic(
                topic_name=t.topic_name, error_code=E.UNKNOWN_TOPIC_OR_PARTITION, error_message=NO_OFFSETS_MESSAGE))
    records = [state_partition_metadata_record(group_id, group.initializing, initialized, deleting)]
    return records, result


def complete_delete(groups: dict[str, Any], group_id: str, deleted: list[uuid.UUID]) -> list[Record]:
    """The share coordinator deleted the state of `deleted`: they leave "deleting"."""
    group = groups.get(group_id)
    if not isinstance(group, ShareGroup):
        return []
    deleting = {t: n for t, n in group.deleting.items() if t not in deleted}
    return [state_partition_metadata_record(group_id, group.initializing, group.initialized, deleting)]


def forget_topics(groups: dict[str, Any], topic_ids: set[uuid.UUID]) -> list[Record]:
    """Deleted topics leave every share group's initializing, initialized and deleting sets (Kafka's
    maybeCleanupShareGroupState; the share coordinator deletes their state)."""
    records: list[Record] = []
    for group in groups.values():
        if not isinstance(group, ShareGroup):
            continue
        if not topic_ids & (group.initializing.keys() | group.initialized.keys() | group.deleting.keys()):
            continue
        records.append(state_partition_metadata_record(
            group.group_id, {t: v for t, v in group.initializing.items() if t not in topic_ids},
            {t: v for t, v in group.initialized.items() if t not in topic_ids},
            {t: n for t, n in group.deleting.items() if t not in topic_ids}))
    return records


def initialized_partitions(groups: dict[str, Any], group_id: str) -> dict[uuid.UUID, list[int]]:
    """The share-partitions whose state is initialized (none for an unknown group, as Kafka)."""
    group = groups.get(group_id)
    if not isinstance(group, ShareGroup):
        return {}
    return {t: sorted(ps) for t, (_, ps) in group.initialized.items()}


def state_keys(groups: dict[str, Any], group_id: str) -> list[tuple[str, uuid.UUID, int]]:
    """The share-partitions of a share group whose state the share coordinators may hold: the
    initialized and initializing ones (Kafka's shareGroupBuildPartitionDeleteRequest, what a
    deleted share group's DeleteShareGroupState names); none for another group or an unknown one."""
    group = groups.get(group_id)
    if not isinstance(group, ShareGroup):
        return []
    partitions: dict[uuid.UUID, set[int]] = {}
    for topics in (group.initialized, group.initializing):
        for topic_id, (_, ps) in topics.items():
            partitions.setdefault(topic_id, set()).update(ps)
    return [(group_id, t, p) for t, ps in partitions.items() for p in sorted(ps)]


__all__ = ["AlterResult", "DeleteResult", "alter_offsets", "complete_delete", "forget_topics", "initialized_partitions",
           "initiate_delete", "share_group_or_raise", "state_keys"]
