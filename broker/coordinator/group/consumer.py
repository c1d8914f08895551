"""The KIP-848 consumer group: members, epochs, target assignment and derived state.

A ConsumerGroup is changed only by replaying its records (see `consumer_heartbeat.py` for the
handlers that write them): ConsumerGroupMetadata (group epoch, metadata hash),
ConsumerGroupMemberMetadata (a member's subscription), ConsumerGroupTargetAssignmentMember and
...Metadata (the target assignment and its epoch), ConsumerGroupCurrentMemberAssignment (a
member's epoch, state and partitions) and ConsumerGroupRegularExpression (resolved regexes).

Epochs: the group epoch is bumped when the members or their subscriptions or the subscribed
topics change; the target assignment is computed for a group epoch (the assignment epoch);
each member reaches it at its own pace (its member epoch). The group state is derived:
EMPTY (no member), ASSIGNING (group epoch ahead of the assignment epoch), RECONCILING (some
member not yet at the target), STABLE.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from broker.coordinator.group.classic import ClassicGroup
from broker.coordinator.group.member import (
    EMPTY,
    Assignment,
    ConsumerGroupMember,
    MemberState,
    assignment_of,
    partitions_by_topic,
)
from broker.coordinator.group.modern import ModernGroup
from broker.coordinator.group.records import (
    CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT,
    CONSUMER_GROUP_MEMBER_METADATA,
    CONSUMER_GROUP_METADATA,
    CONSUMER_GROUP_PARTITION_METADATA,
    CONSUMER_GROUP_REGULAR_EXPRESSION,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER,
    CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA,
    ClassicProtocolMetadata,
    OffsetAndMetadata,
    consumer_group_epoch_tombstone,
    consumer_group_member_tombstone,
    consumer_group_partition_metadata_tombstone,
    current_assignment_tombstone,
    regular_expression_tombstone,
    target_assignment_epoch_tombstone,
    target_assignment_tombstone,
)
from broker.coordinator.result import Record
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

GROUP_TYPE = "consumer"
PROTOCOL_TYPE = "consumer"
LEAVE_GROUP_MEMBER_EPOCH = -1
LEAVE_GROUP_STATIC_MEMBER_EPOCH = -2


class ConsumerGroupState(enum.Enum):
    EMPTY = "Empty"
    ASSIGNING = "Assigning"
    RECONCILING = "Reconciling"
    STABLE = "Stable"
    DEAD = "Dead"


# ----- topic metadata --------------------------------------------------------------------
class TopicInfo(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def topic_id(self) -> uuid.UUID: ...

    @property
    def partitions(self) -> int: ...


class TopicMetadata(Protocol):
    """The cluster's topics as the coordinator sees them (the broker's MetadataStore)."""

    def topic(self, name: str) -> TopicInfo | None: ...

    def topic_by_id(self, topic_id: uuid.UUID) -> TopicInfo | None: ...

    @property
    def topics(self) -> Mapping[str, TopicInfo]: ...


@dataclass(frozen=True)
class StaticTopic:
    name: str
    topic_id: uuid.UUID
    partitions: int


class StaticTopicMetadata:
    """A TopicMetadata held in memory (tests, and a coordinator without a broker)."""

    def __init__(self, topics: Iterable[StaticTopic] = ()) -> None:
        self._by_name: dict[str, StaticTopic] = {t.name: t for t in topics}

    def add(self, name: str, partitions: int, topic_id: uuid.UUID | None = None) -> StaticTopic:
        info = StaticTopic(name, topic_id or uuid.uuid4(), partitions)
        self._by_name[name] = info
        return info

    def remove(self, name: str) -> None:
        self._by_name.pop(name, None)

    def topic(self, name: str) -> StaticTopic | None:
        return self._by_name.get(name)

    def topic_by_id(self, topic_id: uuid.UUID) -> StaticTopic | None:
        return next((t for t in self._by_name.values() if t.topic_id == topic_id), None)

    @property
    def topics(self) -> Mapping[str, StaticTopic]:
        return self._by_name


def topic_hash(info: TopicInfo) -> int:
    """A 64-bit hash of what the assignment depends on: id, name, partition count. (Kafka uses
    XXH3 over the same fields; the value only has to change when they do.)"""
    h = hashlib.blake2b(digest_size=8)
    h.update(b"\x00" + info.topic_id.bytes + info.name.encode() + struct.pack(">i", info.partitions))
    return struct.unpack(">q", h.digest())[0]  # type: ignore[no-any-return]


def metadata_hash(topic_names: Iterable[str], metadata: TopicMetadata) -> int:
    """The group's metadata hash over its subscribed topics that exist (0 when none does)."""
    hashes = [topic_hash(info) for name in sorted(set(topic_names)) if (info := metadata.topic(name)) is not None]
    if not hashes:
        return 0
    h = hashlib.blake2b(digest_size=8)
    for value in hashes:
        h.update(struct.pack(">q", value))
    return struct.unpack(">q", h.digest())[0]  # type: ignore[no-any-return]


# ----- members ---------------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionCheck:
    """The partitions a member committing with an older epoch may commit (KIP-1251)."""

    member: ConsumerGroupMember
    epoch: int

    def error(self, topic_id: uuid.UUID | None, partition: int) -> KafkaError | None:
        assigned_at = self.member.assignment_epoch(topic_id, partition) if topic_id is not None else None
        if assigned_at is None:
            return KafkaError(ErrorCode.STALE_MEMBER_EPOCH, "Partition %s-%d is not assigned or pending revocation "
                              "for member." % (topic_id, partition))
        if self.epoch < assigned_at:
            return KafkaError(ErrorCode.STALE_MEMBER_EPOCH, "Received member epoch %d is older than assignment epoch "
                              "%d for partition %s-%d." % (self.epoch, assigned_at, topic_id, partition))
        return None


class RegexUpdate(enum.Enum):
    """What a heartbeat did to the group's regular expressions."""

    NO_CHANGE = 0
    UPDATED = 1
    UPDATED_AND_RESOLVED = 2


@dataclass(frozen=True)
class ResolvedRegex:
    topics: frozenset[str]
    version: int
    timestamp_ms: int


def is_regex(value: str | None) -> bool:
    return bool(value)


# ----- the group -------------------------------------------------------------------------
class ConsumerGroup(ModernGroup[ConsumerGroupMember]):
    type = GROUP_TYPE
    protocol_type = PROTOCOL_TYPE

    def __init__(self, group_id: str) -> None:
        super().__init__(group_id)
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.partition_epochs: dict[uuid.UUID, dict[int, int]] = {}  # the epoch of each owned partition
        self.resolved_regexes: dict[str, ResolvedRegex] = {}
        self.has_partition_metadata_record = False  # a pre-4.1 ConsumerGroupPartitionMetadata to tombstone
        self.last_assignment_ms: int | None = None  # when the target assignment was last computed

    # ----- derived state ------------------------------------------------------------------
    @property
    def state(self) -> ConsumerGroupState:
        if not self.members:
            return ConsumerGroupState.EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ConsumerGroupState.ASSIGNING
        if all(m.is_reconciled_to(self.assignment_epoch) for m in self.members.values()):
            return ConsumerGroupState.STABLE
        return ConsumerGroupState.RECONCILING

    # ----- members ------------------------------------------------------------------------
    def static_member(self, instance_id: str | None) -> ConsumerGroupMember | None:
        member_id = None if instance_id is None else self.static_members.get(instance_id)
        return None if member_id is None else self.members.get(member_id)

    def update_member(self, member: ConsumerGroupMember) -> None:
        old = self.members.get(member.member_id)
        if old is not None:
            self._remove_partition_epochs(old)
        self.members[member.member_id] = member
        self._add_partition_epochs(member)
        if member.instance_id is not None:
            self.static_members[member.instance_id] = member.member_id

    def remove_member(self, member_id: str) -> None:
        old = self.members.pop(member_id, None)
        if old is None:
            return
        self._remove_partition_epochs(old)
        if old.instance_id is not None and self.static_members.get(old.instance_id) == member_id:
            del self.static_members[old.instance_id]

    def _add_partition_epochs(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for topic_id, partitions in assignment.items():
                epochs = self.partition_epochs.setdefault(topic_id, {})
                for p in partitions:
                    previous = epochs.get(p)
                    if previous is not None and previous >= member.member_epoch:
                        raise RuntimeError("cannot set the epoch of %s-%d to %d: it is still owned at epoch %d"
                                           % (topic_id, p, member.member_epoch, previous))
                    epochs[p] = member.member_epoch

    def _remove_partition_epochs(self, member: ConsumerGroupMember) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for topic_id, partitions in assignment.items():
                epochs = self.partition_epochs.get(topic_id)
                if epochs is None:
                    continue
                for p in partitions:
                    if epochs.get(p) == member.member_epoch:
                        del epochs[p]
                if not epochs:
                    del self.partition_epochs[topic_id]

    def current_partition_epoch(self, topic_id: uuid.UUID, partition: int) -> int:
        """The epoch of the member owning the partition, or -1 if it is free."""
        return self.partition_epochs.get(topic_id, {}).get(partition, -1)

    def target_assignment_of(self, member_id: str, instance_id: str | None) -> Assignment:
        """A static member's target is found by its instance id (it may be replacing a member)."""
        if instance_id is not None:
            previous = self.static_members.get(instance_id)
            return self.target_assignment.get(previous, EMPTY) if previous is not None else EMPTY
        return self.target_assignment.get(member_id, EMPTY)

    # ----- subscriptions ------------------------------------------------------------------
    def subscribed_regexes(self, members: Iterable[ConsumerGroupMember] | None = None) -> Counter[str]:
        return Counter(m.subscribed_topic_regex for m in (self.members.values() if members is None else members)
                       if m.subscribed_topic_regex)

    def subscribed_topic_names(self, members: Iterable[ConsumerGroupMember] | None = None,
                               resolved: Mapping[str, ResolvedRegex] | None = None) -> set[str]:
        """Topic names subscribed by name or through a resolved regex."""
        members = list(self.members.values() if members is None else members)
        resolved = self.resolved_regexes if resolved is None else resolved
        names: set[str] = set()
        for m in members:
            names.update(m.subscribed_topic_names)
            regex = m.subscribed_topic_regex
            if regex and regex in resolved:
                names.update(resolved[regex].topics)
        return names

    def member_topic_names(self, member: ConsumerGroupMember) -> set[str]:
        names = set(member.subscribed_topic_names)
        regex = member.subscribed_topic_regex
        if regex and regex in self.resolved_regexes:
            names.update(self.resolved_regexes[regex].topics)
        return names

    def last_regex_refresh_ms(self) -> int:
        return max((r.timestamp_ms for r in self.resolved_regexes.values()), default=0)

    def last_regex_version(self) -> int:
        return min((r.version for r in self.resolved_regexes.values()), default=0)

    def preferred_server_assignor(self, members: Iterable[ConsumerGroupMember] | None = None) -> str | None:
        """The assignor most members asked for (None: none asked)."""
        counts = Counter(m.server_assignor for m in (self.members.values() if members is None else members)
                         if m.server_assignor)
        if not counts:
            return None
        return min(counts, key=lambda name: (-counts[name], name))

    # ----- offsets, deletion --------------------------------------------------------------
    def validate_offset_commit(self, member_id: str, instance_id: str | None, member_epoch: int,
                               api_version: int) -> PartitionCheck | None:
        """Kafka 4.3's rule (KIP-1251): a consumer-protocol member may commit with an older epoch
        than its own for the partitions it held at that epoch already (a commit from the revocation
        callback, or one in flight while a heartbeat moved the member on); the returned check
        (None: every partition passes) fails the others with STALE_MEMBER_EPOCH. A newer epoch
        fails the whole request; classic members need their exact generation."""
        if member_epoch < 0 and not self.members:
            return None  # the admin client, or a consumer outside group management
        member = self.member_or_raise(member_id)
        if not member.uses_classic_protocol and api_version < 9:
            raise KafkaError(ErrorCode.UNSUPPORTED_VERSION,
                             "OffsetCommit version 9 or above must be used by members using the modern group protocol")
        if member.uses_classic_protocol or member_epoch >= member.member_epoch:
            self._validate_member_epoch(member, member_epoch)
            return None
        return PartitionCheck(member, member_epoch)

    def validate_offset_fetch(self, member_id: str | None, member_epoch: int) -> None:
        if member_id is None and member_epoch < 0:
            return  # librdkafka and the admin client send no member
        member = self.members.get(member_id or "")
        if member is None:
            raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID,
                             "Member %s is not a member of group %s." % (member_id, self.group_id))
        self._validate_member_epoch(member, member_epoch)

    @staticmethod
    def _validate_member_epoch(member: ConsumerGroupMember, received: int) -> None:
        if received != member.member_epoch:
            code = ErrorCode.ILLEGAL_GENERATION if member.uses_classic_protocol else ErrorCode.STALE_MEMBER_EPOCH
            raise KafkaError(code, "The received member epoch %d does not match the expected member epoch %d."
                             % (received, member.member_epoch))

    def validate_offset_delete(self) -> None:
        return None  # offsets of topics the group does not subscribe to can always go

    def offset_expiration_base(self) -> Callable[[OffsetAndMetadata], int] | None:
        return lambda om: om.commit_timestamp_ms

    def tombstones(self) -> list[Record]:
        """The records deleting the group (its offsets are deleted separately)."""
        g = self.group_id
        records = [current_assignment_tombstone(g, m) for m in self.members]
        records += [target_assignment_tombstone(g, m) for m in self.members]
        records.append(target_assignment_epoch_tombstone(g))
        records += [consumer_group_member_tombstone(g, m) for m in self.members]
        records += [regular_expression_tombstone(g, r) for r in self.resolved_regexes]
        records.append(consumer_group_partition_metadata_tombstone(g))
        records.append(consumer_group_epoch_tombstone(g))
        return records

    # ----- descriptions -------------------------------------------------------------------
    def describe(self, default_assignor: str, metadata: TopicMetadata) -> Any:
        R = M.ConsumerGroupDescribeResponse

        def topic_partitions(assignment: Assignment) -> list[Any]:
            out = []
            for topic_id, partitions in partitions_by_topic(assignment):
                info = metadata.topic_by_id(topic_id)
                if info is not None:  # a deleted topic is left out
                    out.append(R.TopicPartitions(topic_id=topic_id, topic_name=info.name, partitions=partitions))
            return out

        return R.DescribedGroup(
            group_id=self.group_id,
            group_state=self.state.value,
            group_epoch=self.group_epoch,
            assignment_epoch=self.assignment_epoch,
            assignor_name=self.preferred_server_assignor() or default_assignor,
            members=[
                R.Member(
                    member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, member_epoch=m.member_epoch,
                    client_id=m.client_id, client_host=m.client_host,
                    subscribed_topic_names=sorted(m.subscribed_topic_names),
                    subscribed_topic_regex=m.subscribed_topic_regex,
                    assignment=R.Assignment(topic_partitions=topic_partitions(m.assigned)),
                    target_assignment=R.Assignment(
                        topic_partitions=topic_partitions(self.target_assignment.get(m.member_id, EMPTY))),
                    member_type=0 if m.uses_classic_protocol else 1,
                )
                for m in self.members.values()
            ],
        )


# ----- replay ------------------------------------------------------------------------------

def _persisted_group(groups: dict[str, Any], group_id: str, create: bool) -> ConsumerGroup | None:
    group = groups.get(group_id)
    if isinstance(group, ConsumerGroup):
        return group
    if group is not None and not (isinstance(group, ClassicGroup) and group.protocol_type is None
                                  and not group.members):
        raise RuntimeError("group %s is not a consumer group" % group_id)
    if not create:
        return None
    # A "simple" classic group only holds offsets: the consumer group replaces it.
    new = ConsumerGroup(group_id)
    groups[group_id] = new
    return new


def replay_consumer_group_record(groups: dict[str, Any], record_type: int, key: Any, value: Any) -> None:
    """Apply one consumer group record (a None value is a tombstone) to `groups`."""
    group = _persisted_group(groups, key.group_id, value is not None)
    if group is None:
        return  # a tombstone for a group that is gone
    if record_type == CONSUMER_GROUP_METADATA:
        if value is not None:
            group.group_epoch = value.epoch
            group.metadata_hash = value.metadata_hash
        else:
            if group.members or group.target_assignment or group.assignment_epoch != -1:
                raise RuntimeError("tombstone for consumer group %s which still has members" % key.group_id)
            del groups[key.group_id]
    elif record_type == CONSUMER_GROUP_PARTITION_METADATA:
        group.has_partition_metadata_record = value is not None
    elif record_type == CONSUMER_GROUP_MEMBER_METADATA:
        _replay_member(group, key.member_id, value)
    elif record_type == CONSUMER_GROUP_TARGET_ASSIGNMENT_METADATA:
        group.assignment_epoch = -1 if value is None else value.assignment_epoch
    elif record_type == CONSUMER_GROUP_TARGET_ASSIGNMENT_MEMBER:
        if value is None:
            group.target_assignment.pop(key.member_id, None)
        else:
            group.target_assignment[key.member_id] = assignment_of(
                (tp.topic_id, tp.partitions) for tp in value.topic_partitions)
    elif record_type == CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT:
        _replay_current_assignment(group, key.member_id, value)
    elif record_type == CONSUMER_GROUP_REGULAR_EXPRESSION:
        if value is None:
            group.resolved_regexes.pop(key.regular_expression, None)
        else:
            group.resolved_regexes[key.regular_expression] = ResolvedRegex(
                frozenset(value.topics), value.version, value.timestamp)


def _replay_member(group: ConsumerGroup, member_id: str, value: Any) -> None:
    old = group.members.get(member_id)
    if value is None:
        if old is None:
            return
        if old.member_epoch != LEAVE_GROUP_MEMBER_EPOCH:
            raise RuntimeError("member %s removed before its assignment" % member_id)
        group.remove_member(member_id)
        return
    classic = value.classic_member_metadata
    group.update_member(dataclasses.replace(
        old or ConsumerGroupMember(member_id),
        instance_id=value.instance_id, rack_id=value.rack_id, client_id=value.client_id,
        client_host=value.client_host, subscribed_topic_names=frozenset(value.subscribed_topic_names),
        subscribed_topic_regex=value.subscribed_topic_regex, rebalance_timeout_ms=value.rebalance_timeout_ms,
        server_assignor=value.server_assignor,
        classic=None if classic is None else ClassicProtocolMetadata(
            classic.session_timeout_ms, tuple((p.name, bytes(p.metadata)) for p in classic.supported_protocols)),
    ))


def _replay_current_assignment(group: ConsumerGroup, member_id: str, value: Any) -> None:
    old = group.members.get(member_id)
    if value is None:
        if old is not None:
            group.update_member(dataclasses.replace(
                old, member_epoch=LEAVE_GROUP_MEMBER_EPOCH, previous_member_epoch=LEAVE_GROUP_MEMBER_EPOCH,
                assigned=EMPTY, pending_revocation=EMPTY, assignment_epochs={}))
        return
    epochs: dict[uuid.UUID, dict[int, int]] = {}
    for tp in [*value.assigned_partitions, *value.partitions_pending_revocation]:
        given = tp.assignment_epochs
        # records written before KIP-1251 (or by a coordinator without it) have none: the member epoch
        for i, p in enumerate(tp.partitions):
            epochs.setdefault(tp.topic_id, {})[p] = (
                given[i] if given is not None and i < len(given) else value.member_epoch)
    group.update_member(dataclasses.replace(
        old or ConsumerGroupMember(member_id),
        member_epoch=value.member_epoch, previous_member_epoch=value.previous_member_epoch,
        state=MemberState.from_value(value.state),
        assigned=assignment_of((tp.topic_id, tp.partitions) for tp in value.assigned_partitions),
        pending_revocation=assignment_of((tp.topic_id, tp.partitions) for tp in value.partitions_pending_revocation),
        assignment_epochs=epochs,
    ))
