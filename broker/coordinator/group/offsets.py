"""Committed offsets: the store, OffsetCommit / OffsetFetch / OffsetDelete, and expiry.

Follows Kafka's OffsetMetadataManager. Every change is an OffsetCommit record (a tombstone
deletes) applied by replay, so the handlers here only validate and build records. A commit for a
group that does not exist, with generation -1, creates a "simple" group (Empty, no protocol
type) when the record is replayed, as Kafka does.

Transactional offsets (TxnOffsetCommit, KIP-98/KIP-447) are written as the producer's
transactional batch and kept pending per producer id until the transaction's marker: a COMMIT
moves them to the store (unless a plain commit of the same partition came later: the latest
record wins, as Kafka's record offsets decide), an ABORT drops them. While some are pending,
OffsetFetch with RequireStable answers UNSTABLE_OFFSET_COMMIT for those partitions and they do
not expire.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from broker.coordinator.group.classic import ClassicGroup, GroupState
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import ConsumerGroup, PartitionCheck
from broker.coordinator.group.membership import ClassicGroupManager
from broker.coordinator.group.records import (
    OffsetAndMetadata,
    OffsetCommitRun,
    group_metadata_tombstone,
    offset_commit_record,
    offset_commit_tombstone,
)
from broker.coordinator.group.share_group import ShareGroup
from broker.coordinator.result import CoordinatorResult, Record
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from protocol.primitives import ZERO_UUID

E = ErrorCode
INVALID_OFFSET = -1


class OffsetStore:
    """group -> topic -> partition -> OffsetAndMetadata."""

    def __init__(self) -> None:
        self.by_group: dict[str, dict[str, dict[int, OffsetAndMetadata]]] = {}

    def get(self, group_id: str, topic: str, partition: int) -> OffsetAndMetadata | None:
        return self.by_group.get(group_id, {}).get(topic, {}).get(partition)

    def put(self, group_id: str, topic: str, partition: int, om: OffsetAndMetadata) -> None:
        topics = self.by_group.get(group_id)
        if topics is None:
            topics = self.by_group[group_id] = {}
        partitions = topics.get(topic)
        if partitions is None:
            partitions = topics[topic] = {}
        partitions[partition] = om

    def put_all(self, group_id: str, topic: str, offsets: list[tuple[int, OffsetAndMetadata]]) -> None:
        """put of each (partition, offset) in order."""
        self.by_group.setdefault(group_id, {}).setdefault(topic, {}).update(offsets)

    def remove(self, group_id: str, topic: str, partition: int) -> bool:
        topics = self.by_group.get(group_id)
        if topics is None or partition not in topics.get(topic, {}):
            return False
        partitions = topics[topic]
        del partitions[partition]
        if not partitions:
            del topics[topic]
        if not topics:
            del self.by_group[group_id]
        return True

    def group(self, group_id: str) -> dict[str, dict[int, OffsetAndMetadata]]:
        return self.by_group.get(group_id, {})

    def count(self) -> int:
        return sum(len(p) for topics in self.by_group.values() for p in topics.values())


def _mismatched_topic_id(stored: Any, requested: Any) -> bool:
    return stored != ZERO_UUID and requested != ZERO_UUID and stored != requested


def _partition_response(partition: int, om: OffsetAndMetadata | None, code: ErrorCode = E.NONE) -> Any:
    if om is None:
        return M.OffsetFetchResponse.OffsetFetchResponsePartitions(
            partition_index=partition, committed_offset=INVALID_OFFSET, committed_leader_epoch=-1, metadata="",
            error_code=code,
        )
    return M.OffsetFetchResponse.OffsetFetchResponsePartitions(
        partition_index=partition, committed_offset=om.committed_offset, committed_leader_epoch=om.leader_epoch,
        metadata=om.metadata, error_code=code,
    )


class PendingOffset:
    """A transactional offset waiting for its transaction's marker; `superseded` once a plain
    commit of the same partition was written after it."""

    __slots__ = ("om", "superseded")

    def __init__(self, om: OffsetAndMetadata) -> None:
        self.om = om
        self.superseded = False


class OffsetManager:
    def __init__(self, groups: dict[str, ClassicGroup], membership: ClassicGroupManager,
                 config: GroupCoordinatorConfig) -> None:
        self.groups = groups
        self.membership = membership
        self.config = config
        self.store = OffsetStore()
        # producer id -> group -> (topic, partition) -> the pending transactional offset
        self.pending: dict[int, dict[str, dict[tuple[str, int], PendingOffset]]] = {}
        self.open_transactions: dict[str, set[int]] = {}  # group -> producer ids with pending offsets
        self.markers: dict[int, int] = {}  # producer id -> markers replayed (TxnOffsetCommit's guard)
        # a topic's id by its name (the shard sets it from the topic metadata): KIP-1251's check
        # of a commit by topic name against an assignment kept by topic id
        self.topic_id_of: Callable[[str], uuid.UUID | None] = lambda name: None

    # ----- replay -------------------------------------------------------------------------
    def replay(self, group_id: str, topic: str, partition: int, om: OffsetAndMetadata | None) -> None:
        open_pids = self.open_transactions.get(group_id)
        if om is None:
            self.store.remove(group_id, topic, partition)
            if open_pids:  # a tombstone removes the pending commits of the partition too
                for pid in open_pids:
                    self.pending[pid][group_id].pop((topic, partition), None)
            return
        if group_id not in self.groups:
            # Offsets without membership: a simple group (Empty, no protocol type).
            self.groups[group_id] = ClassicGroup(group_id)
        self.store.put(group_id, topic, partition, om)
        if open_pids:  # written after them: it wins over pending transactional commits
            for pid in open_pids:
                pending = self.pending[pid][group_id].get((topic, partition))
                if pending is not None:
                    pending.superseded = True

    def replay_run(self, run: OffsetCommitRun) -> None:
        """replay of each offset of the run in order: at once, unless it has tombstones or the
        group has pending transactional offsets."""
        if run.tombstones or self.open_transactions.get(run.group):
            for partition, om in run.offsets:
                self.replay(run.group, run.topic, partition, om)
            return
        if run.group not in self.groups:
            self.groups[run.group] = ClassicGroup(run.group)
        self.store.put_all(run.group, run.topic, run.offsets)  # type: ignore[arg-type]  # no tombstones

    def replay_transactional(self, producer_id: int, group_id: str, topic: str, partition: int,
                             om: OffsetAndMetadata | None) -> None:
        if om is None:
            self.replay(group_id, topic, partition, None)
            return
        if group_id not in self.groups:
            self.groups[group_id] = ClassicGroup(group_id)
        self.pending.setdefault(producer_id, {}).setdefault(group_id, {})[(topic, partition)] = PendingOffset(om)
        self.open_transactions.setdefault(group_id, set()).add(producer_id)

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        self.markers[producer_id] = self.markers.get(producer_id, 0) + 1
        by_group = self.pending.pop(producer_id, None)
        if by_group is None:
            return
        for group_id, offsets in by_group.items():
            open_pids = self.open_transactions.get(group_id)
            if open_pids is not None:
                open_pids.discard(producer_id)
                if not open_pids:
                    del self.open_transactions[group_id]
            if committed:
                for (topic, partition), pending in offsets.items():
                    if not pending.superseded:
                        self.store.put(group_id, topic, partition, pending.om)

    def has_pending_transactional_offsets(self, group_id: str, topic: str, partition: int) -> bool:
        open_pids = self.open_transactions.get(group_id)
        if not open_pids:
            return False
        return any((topic, partition) in self.pending[pid][group_id] for pid in open_pids)

    # ----- OffsetCommit -------------------------------------------------------------------
    def commit_offsets(self, request: M.OffsetCommitRequest, api_version: int,
                       now: int) -> CoordinatorResult[M.OffsetCommitResponse]:
        """request: an OffsetCommitRequest whose topics carry names (the API layer resolves v10
        topic ids). A group-level failure raises KafkaError (every partition gets its code)."""
        check = self._validate_commit(request, api_version)
        group_id = request.group_id
        expire = None if request.retention_time_ms == -1 else now + request.retention_time_ms
        max_metadata = self.config.offset_metadata_max_bytes
        Partition = M.OffsetCommitResponse.OffsetCommitResponsePartition  # built positionally below:
        Topic = M.OffsetCommitResponse.OffsetCommitResponseTopic  # (partition index, error code), (name, id, partitions)
        records: list[Record] = []
        topics = []
        for topic in request.topics:
            name = topic.name
            partitions = []
            topic_id = topic.topic_id if check is not None and topic.topic_id.int else None
            if check is not None and topic_id is None:
                topic_id = self.topic_id_of(name)
            for p in topic.partitions:
                index = p.partition_index
                stale = check.error(topic_id, index) if check is not None else None
                if stale is not None:
                    partitions.append(Partition(index, stale.code))
                    continue
                metadata = p.committed_metadata
                if metadata is not None and len(metadata) > max_metadata:
                    partitions.append(Partition(index, E.OFFSET_METADATA_TOO_LARGE))
                    continue
                # (offset, leader epoch, metadata, commit time, expiry, topic id)
                om = OffsetAndMetadata(p.committed_offset, p.committed_leader_epoch, metadata or "", now, expire,
                                       topic.topic_id)
                records.append(offset_commit_record(group_id, name, index, om))
                # Replayed from the values the record was made of rather than decoded back from its
                # bytes by the runtime: the same replay, minus a decode per offset on every commit.
                self.replay(group_id, name, index, om)
                partitions.append(Partition(index, E.NONE))
            topics.append(Topic(name, topic.topic_id, partitions))
        return CoordinatorResult(records, M.OffsetCommitResponse(topics=topics), replay=False)

    def _validate_commit(self, request: M.OffsetCommitRequest, api_version: int) -> PartitionCheck | None:
        """The group-level checks (KafkaError for the whole request); for a consumer-protocol member
        committing with an older epoch, the per-partition check that follows (KIP-1251)."""
        generation = request.generation_id_or_member_epoch
        # From OffsetCommit v9 an unknown group is GROUP_ID_NOT_FOUND; before, ILLEGAL_GENERATION.
        group = self._group_for_commit(request.group_id, generation,
                                       E.GROUP_ID_NOT_FOUND if api_version >= 9 else E.ILLEGAL_GENERATION)
        if group is None:
            return None
        if isinstance(group, ConsumerGroup):
            # KIP-848 members commit with their member epoch, or an older one for partitions they held then
            return group.validate_offset_commit(request.member_id, request.group_instance_id, generation, api_version)
        group.validate_offset_commit(request.member_id, request.group_instance_id, generation)
        # A commit from a member of a Stable (or rebalancing) group keeps its session alive.
        if group.in_state(GroupState.STABLE, GroupState.PREPARING_REBALANCE):
            member = group.members.get(request.member_id)
            if member is not None:
                self.membership.reschedule_heartbeat(group, member)
        return None

    def _group_for_commit(self, group_id: str, generation: int, unknown: ErrorCode) -> Any:
        """The group a commit goes to; None for a commit outside group management to a group
        that does not exist yet (a simple group, created when the first record is replayed)."""
        if not group_id:
            raise KafkaError(E.INVALID_GROUP_ID)
        group = self.groups.get(group_id)
        if group is None and generation >= 0:
            raise KafkaError(unknown)
        return group

    # ----- TxnOffsetCommit ----------------------------------------------------------------
    def commit_transactional_offsets(self, request: Any, now: int, markers_seen: int) -> CoordinatorResult[Any]:
        """request: a TxnOffsetCommitRequest whose topics all exist. `markers_seen`: how many
        markers of the producer this shard had replayed when the transaction was verified; one
        more since means the transaction ended meanwhile (Kafka's verification guard)."""
        if self.markers.get(request.producer_id, 0) != markers_seen:
            raise KafkaError(E.INVALID_TXN_STATE, "the transaction ended while the offsets were verified")
        check = self._validate_transactional_commit(request)
        group_id = request.group_id
        max_metadata = self.config.offset_metadata_max_bytes
        R = M.TxnOffsetCommitResponse
        records: list[Record] = []
        topics = []
        for topic in request.topics:
            partitions = []
            topic_id = self.topic_id_of(topic.name) if check is not None else None
            for p in topic.partitions:
                if check is not None and check.error(topic_id, p.partition_index) is not None:
                    # TxnOffsetCommit has no STALE_MEMBER_EPOCH: Kafka answers ILLEGAL_GENERATION
                    partitions.append(R.TxnOffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=E.ILLEGAL_GENERATION))
                    continue
                metadata = p.committed_metadata
                if metadata is not None and len(metadata) > max_metadata:
                    partitions.append(R.TxnOffsetCommitResponsePartition(
                        partition_index=p.partition_index, error_code=E.OFFSET_METADATA_TOO_LARGE))
                    continue
                om = OffsetAndMetadata(committed_offset=p.committed_offset, leader_epoch=p.committed_leader_epoch,
                                       metadata=metadata or "", commit_timestamp_ms=now)
                records.append(offset_commit_record(group_id, topic.name, p.partition_index, om))
                self.replay_transactional(request.producer_id, group_id, topic.name, p.partition_index, om)
                partitions.append(R.TxnOffsetCommitResponsePartition(partition_index=p.partition_index,
                                                                     error_code=E.NONE))
            topics.append(R.TxnOffsetCommitResponseTopic(name=topic.name, partitions=partitions))
        return CoordinatorResult(records=records, response=R(topics=topics), replay=False,
                                 producer=(request.producer_id, request.producer_epoch))

    def _validate_transactional_commit(self, request: Any) -> PartitionCheck | None:
        """KIP-447: a member's commit is checked against the group's generation and members."""
        generation = request.generation_id
        group = self._group_for_commit(request.group_id, generation, E.ILLEGAL_GENERATION)
        if group is None:
            return None
        if isinstance(group, ConsumerGroup):
            try:
                return group.validate_offset_commit(request.member_id, request.group_instance_id, generation, 9)
            except KafkaError as exc:
                raise KafkaError(E.ILLEGAL_GENERATION) if exc.code is E.STALE_MEMBER_EPOCH else exc from None
        group.validate_offset_commit(request.member_id, request.group_instance_id, generation, transactional=True)
        return None

    # ----- OffsetFetch --------------------------------------------------------------------
    def fetch_offsets(self, request: Any, require_stable: bool) -> Any:
        """request: an OffsetFetchRequest.OffsetFetchRequestGroup (topics None: all of them);
        returns an OffsetFetchResponse.OffsetFetchResponseGroup."""
        group = self.groups.get(request.group_id)
        if isinstance(group, ConsumerGroup):
            # A member id and epoch are checked when given; librdkafka sends null and -1.
            group.validate_offset_fetch(request.member_id, request.member_epoch)
        known = group is not None and group.state is not GroupState.DEAD
        stored = self.store.group(request.group_id) if known else {}
        topics = []
        if request.topics is None:
            for name, partitions in stored.items():
                topics.append(M.OffsetFetchResponse.OffsetFetchResponseTopics(
                    name=name, topic_id=ZERO_UUID,
                    partitions=[self._fetched(request.group_id, name, p, om, require_stable)
                                for p, om in partitions.items()],
                ))
        else:
            for t in request.topics:
                offsets = stored.get(t.name, {})
                fetched = []
                for p in t.partition_indexes:
                    om = offsets.get(p)
                    if om is not None and _mismatched_topic_id(om.topic_id, t.topic_id):
                        om = None
                    fetched.append(self._fetched(request.group_id, t.name, p, om, require_stable))
                topics.append(M.OffsetFetchResponse.OffsetFetchResponseTopics(
                    name=t.name, topic_id=t.topic_id, partitions=fetched))
        return M.OffsetFetchResponse.OffsetFetchResponseGroup(group_id=request.group_id, topics=topics)

    def _fetched(self, group_id: str, topic: str, partition: int, om: OffsetAndMetadata | None,
                 require_stable: bool) -> Any:
        if require_stable and self.has_pending_transactional_offsets(group_id, topic, partition):
            return _partition_response(partition, None, E.UNSTABLE_OFFSET_COMMIT)
        return _partition_response(partition, om)

    # ----- OffsetDelete -------------------------------------------------------------------
    def delete_offsets(self, request: Any) -> CoordinatorResult[Any]:
        """A group-level failure raises KafkaError (the response's top-level error code)."""
        if not request.group_id:
            raise KafkaError(E.INVALID_GROUP_ID)
        group = self.groups.get(request.group_id)
        if group is None:
            raise KafkaError(E.GROUP_ID_NOT_FOUND)
        group.validate_offset_delete()
        records: list[Record] = []
        topics = []
        for t in request.topics:
            subscribed = group.is_subscribed_to_topic(t.name)
            partitions = []
            for p in t.partitions:
                if subscribed:
                    code = E.GROUP_SUBSCRIBED_TO_TOPIC
                else:
                    code = E.NONE
                    if self.store.get(request.group_id, t.name, p.partition_index) is not None or \
                            self.has_pending_transactional_offsets(request.group_id, t.name, p.partition_index):
                        records.append(offset_commit_tombstone(request.group_id, t.name, p.partition_index))
                partitions.append(M.OffsetDeleteResponse.OffsetDeleteResponsePartition(
                    partition_index=p.partition_index, error_code=code))
            topics.append(M.OffsetDeleteResponse.OffsetDeleteResponseTopic(name=t.name, partitions=partitions))
        return CoordinatorResult(records=records, response=M.OffsetDeleteResponse(topics=topics))

    def delete_all_offsets(self, group_id: str, records: list[Record]) -> int:
        n = 0
        stored = self.store.group(group_id)
        for topic, partitions in stored.items():
            for partition in partitions:
                records.append(offset_commit_tombstone(group_id, topic, partition))
                n += 1
        # pending transactional offsets too (one tombstone for a partition in both)
        for pid in sorted(self.open_transactions.get(group_id, ())):
            for topic, partition in self.pending[pid][group_id]:
                if partition not in stored.get(topic, {}):
                    records.append(offset_commit_tombstone(group_id, topic, partition))
                    n += 1
        return n

    # ----- expiry -------------------------------------------------------------------------
    def cleanup_expired_offsets(self, group_id: str, now: int, records: list[Record]) -> bool:
        """Add tombstones for the group's expired offsets; True if none is left."""
        stored = self.store.group(group_id)
        if not stored:
            return True
        group = self.groups[group_id]
        base = group.offset_expiration_base()
        if base is None:
            return False
        retention = self.config.offsets_retention_ms
        all_expired = True
        for topic, partitions in stored.items():
            if group.is_subscribed_to_topic(topic):
                all_expired = False
                continue
            for partition, om in partitions.items():
                if om.expire_timestamp_ms is not None:
                    expired = now >= om.expire_timestamp_ms  # an explicit retention (OffsetCommit v2-v4)
                else:
                    expired = now - base(om) >= retention
                if expired and not self.has_pending_transactional_offsets(group_id, topic, partition):
                    records.append(offset_commit_tombstone(group_id, topic, partition))
                else:
                    all_expired = False
        return all_expired

    def cleanup_expired_offsets_and_groups(self, now: int) -> list[Record]:
        """The periodic sweep: expired offsets, then empty groups left without offsets (and
        without transactional offsets pending)."""
        records: list[Record] = []
        for group_id, group in list(self.groups.items()):
            if isinstance(group, ShareGroup):
                continue  # a share group has no offsets; its share state does not expire
            if self.cleanup_expired_offsets(group_id, now, records) and group.is_empty() and \
                    group_id not in self.open_transactions:
                if isinstance(group, ConsumerGroup):
                    records.extend(group.tombstones())
                else:
                    records.append(group_metadata_tombstone(group_id))
        return records
