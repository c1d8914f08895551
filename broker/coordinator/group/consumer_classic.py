"""Classic and consumer-protocol members together (Kafka's online migration, KIP-848).

- A member using JoinGroup/SyncGroup/Heartbeat/LeaveGroup in a non-empty consumer group is
  served inside it: its subscription comes from its ConsumerProtocolSubscription, its JoinGroup
  is answered at once with its member epoch as the generation, SyncGroup returns its current
  assignment (as a ConsumerProtocolAssignment) and Heartbeat answers REBALANCE_IN_PROGRESS
  when it must rejoin to move on (revoke, or collect partitions now released).
- Upgrade: a ConsumerGroupHeartbeat joining a non-empty classic group of the consumer protocol
  converts it into a consumer group (members keep their generation as epoch and their
  assignment); the classic members then rejoin as above.
- Downgrade: when the last consumer-protocol member leaves and only classic members remain,
  the group becomes a classic group again (Stable with the target assignment) and rebalances.

`group.consumer.migration.policy` (bidirectional, upgrade, downgrade, disabled) gates the
conversions of non-empty groups; with `disabled` a classic member cannot join a consumer group.
"""

from __future__ import annotations

import base64
import dataclasses
import struct
import uuid
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from broker.coordinator.group.classic import ClassicGroup, ClassicMember, GroupState
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import ConsumerGroup, RegexUpdate, TopicMetadata, metadata_hash
from broker.coordinator.group.consumer_wait import HeldHeartbeats
from broker.coordinator.group.member import EMPTY, Assignment, ConsumerGroupMember, MemberState, assignment_of
from broker.coordinator.group.membership import (
    ClassicGroupManager,
    RequestInfo,
    heartbeat_key,
    join_key,
    sync_key,
)
from broker.coordinator.group.records import (
    ClassicProtocolMetadata,
    consumer_group_epoch_record,
    group_metadata_record,
    group_metadata_tombstone,
    target_assignment_epoch_record,
    target_assignment_record,
)
from broker.coordinator.group.subscription import CONSUMER_PROTOCOL_TYPE
from broker.coordinator.result import CoordinatorResult, Deferred, Record
from broker.coordinator.timer import Timer
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError, ProtocolError

log = get_logger("broker.coordinator.group")


class ConsumerGroupManager(Protocol):
    """What classic members of a consumer group need of the consumer-group manager
    (consumer_heartbeat.py, which owns them): its groups, timers and held heartbeats, and the
    steps a heartbeat takes, which a JoinGroup/SyncGroup of a classic member takes alike."""

    groups: dict[str, Any]
    config: GroupCoordinatorConfig
    metadata: TopicMetadata
    timer: Timer
    waits: HeldHeartbeats

    def member_record(self, group_id: str, m: ConsumerGroupMember) -> Record: ...

    def maybe_update_regexes(self, group: ConsumerGroup, member: ConsumerGroupMember,
                             updated: ConsumerGroupMember, records: list[Record], now: int) -> RegexUpdate: ...

    def members_after(self, group: ConsumerGroup, updated: ConsumerGroupMember) -> dict[str, ConsumerGroupMember]: ...

    def update_metadata(self, group: ConsumerGroup, members: Iterable[ConsumerGroupMember], bump: bool,
                        records: list[Record]) -> int: ...

    def may_assign(self, group: ConsumerGroup, now: int) -> bool: ...

    def update_target_assignment(self, group: ConsumerGroup, epoch: int, members: Mapping[str, ConsumerGroupMember],
                                 records: list[Record], now: int) -> dict[str, Assignment]: ...

    def maybe_reconcile(self, group: ConsumerGroup, member: ConsumerGroupMember, target_epoch: int,
                        target: Assignment, subscription_changed: bool, owned: Assignment | None,
                        records: list[Record]) -> ConsumerGroupMember: ...

    def schedule_session_timeout(self, group_id: str, member_id: str, timeout_ms: int | None = None) -> None: ...

    def replace_member(self, records: list[Record], group: ConsumerGroup, old: ConsumerGroupMember,
                       new: ConsumerGroupMember) -> None: ...

    def fence_members(self, group: ConsumerGroup, members: list[ConsumerGroupMember], response: Any,
                      now: int) -> CoordinatorResult[Any]: ...

    def cancel_group_timers(self, group: ConsumerGroup) -> None: ...

E = ErrorCode
Result = CoordinatorResult[Any]
MAX_PROTOCOL_VERSION = 3  # ConsumerProtocolSubscription/Assignment v0-3


def new_member_id() -> str:
    """Kafka's Uuid.toString(): URL-safe base64 of 16 random bytes, unpadded."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def classic_join_key(group_id: str, member_id: str) -> str:
    return "classic-join-%s-%s" % (group_id, member_id)


def classic_sync_key(group_id: str, member_id: str) -> str:
    return "classic-sync-%s-%s" % (group_id, member_id)


def upgrade_enabled(policy: str) -> bool:
    return policy in ("bidirectional", "upgrade")


def downgrade_enabled(policy: str) -> bool:
    return policy in ("bidirectional", "downgrade")


# ----- the embedded consumer protocol ------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Subscription:
    version: int
    topics: list[str]
    owned: list[tuple[str, list[int]]]  # v1+
    rack_id: str | None = None  # v3+


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def _take(self, fmt: struct.Struct) -> Any:
        try:
            (value,) = fmt.unpack_from(self.data, self.pos)
        except struct.error:
            raise ProtocolError("embedded consumer protocol: truncated") from None
        self.pos += fmt.size
        return value

    def int16(self) -> int:
        return int(self._take(_I16))

    def int32(self) -> int:
        return int(self._take(_I32))

    def string(self, nullable: bool = False) -> str | None:
        n = self.int16()
        if n < 0:
            if nullable:
                return None
            raise ProtocolError("embedded consumer protocol: null string")
        raw = self.data[self.pos:self.pos + n]
        if len(raw) != n:
            raise ProtocolError("embedded consumer protocol: truncated string")
        self.pos += n
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("embedded consumer protocol: bad string") from None

    def bytes_(self) -> bytes | None:
        n = self.int32()
        if n < 0:
            return None
        raw = self.data[self.pos:self.pos + n]
        if len(raw) != n:
            raise ProtocolError("embedded consumer protocol: truncated bytes")
        self.pos += n
        return raw

    def count(self) -> int:
        n = self.int32()
        if n < 0 or n > len(self.data):
            raise ProtocolError("embedded consumer protocol: bad array length")
        return n

    def topic_partitions(self) -> list[tuple[str, list[int]]]:
        out = []
        for _ in range(self.count()):
            topic = self.string() or ""
            out.append((topic, [self.int32() for _ in range(self.count())]))
        return out

    @property
    def done(self) -> bool:
        return self.pos >= len(self.data)


_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def parse_subscription(data: bytes) -> Subscription:
    """A ConsumerProtocolSubscription (later versions only append fields)."""
    r = _Reader(bytes(data))
    version = r.int16()
    if version < 0:
        raise ProtocolError("embedded consumer protocol: bad version")
    topics = [r.string() or "" for _ in range(r.count())]
    r.bytes_()  # user data
    owned: list[tuple[str, list[int]]] = []
    rack = None
    if version >= 1 and not r.done:
        owned = r.topic_partitions()
    if version >= 2 and not r.done:
        r.int32()  # generation id
    if version >= 3 and not r.done:
        rack = r.string(nullable=True)
    return Subscription(version, topics, owned, rack)


def parse_assignment(data: bytes) -> tuple[list[tuple[str, list[int]]], bytes | None]:
    """A ConsumerProtocolAssignment: (topic partitions, user data)."""
    r = _Reader(bytes(data))
    if r.int16() < 0:
        raise ProtocolError("embedded consumer protocol: bad version")
    partitions = r.topic_partitions()
    return partitions, r.bytes_()


def encode_assignment(partitions: list[tuple[str, list[int]]], version: int) -> bytes:
    out = [_I16.pack(max(0, min(version, MAX_PROTOCOL_VERSION))), _I32.pack(len(partitions))]
    for topic, ps in partitions:
        raw = topic.encode()
        out += [_I16.pack(len(raw)), raw, _I32.pack(len(ps))]
        out += [_I32.pack(p) for p in ps]
    out.append(_I32.pack(-1))  # no user data
    return b"".join(out)


def protocol_version(metadata: bytes) -> int:
    return int(_I16.unpack_from(metadata, 0)[0]) if len(metadata) >= 2 else 0


class ClassicMembers:
    """Classic-protocol members of consumer groups, and the conversions between group types."""

    def __init__(self, manager: ConsumerGroupManager, classic: ClassicGroupManager) -> None:
        self.m = manager
        self.classic = classic

    @property
    def policy(self) -> str:
        return self.m.config.consumer_migration_policy

    # ----- topic names <-> ids ------------------------------------------------------------
    def _by_name(self, partitions: list[tuple[str, list[int]]]) -> Assignment:
        pairs = []
        for topic, ps in partitions:
            info = self.m.metadata.topic(topic)
            if info is not None:
                pairs.append((info.topic_id, ps))
        return assignment_of(pairs)

    def _names(self, assignment: Assignment) -> list[tuple[str, list[int]]]:
        out = []
        for topic_id, ps in assignment.items():
            info = self.m.metadata.topic_by_id(topic_id)
            if info is not None:
                out.append((info.name, sorted(ps)))
        return sorted(out)

    def _assignment_bytes(self, assignment: Assignment, member: ConsumerGroupMember) -> bytes:
        assert member.classic is not None
        return encode_assignment(self._names(assignment), protocol_version(member.classic.protocols[0][1]))

    # ----- JoinGroup ----------------------------------------------------------------------
    def join(self, group: ConsumerGroup, request: Any, info: RequestInfo, now: int) -> Result:
        deferred: Deferred[Any] = Deferred()

        def fail(code: ErrorCode, member_id: str = "", message: str | None = None) -> Result:
            deferred.complete(M.JoinGroupResponse(error_code=code, member_id=member_id, protocol_type=None,
                                                  protocol_name=None))
            if message:
                log.info("classic member cannot join the consumer group", group_id=group.group_id, reason=message)
            return CoordinatorResult(response=deferred, replay=False)

        if self.policy == "disabled":
            return fail(E.INCONSISTENT_GROUP_PROTOCOL, message="group migration is disabled")
        member_id = request.member_id
        unknown = member_id == ""
        if unknown:
            member_id = new_member_id()
        if len(group.members) >= self.m.config.consumer_max_size and member_id not in group.members:
            return fail(E.GROUP_MAX_SIZE_REACHED)
        protocols = tuple((p.name, bytes(p.metadata)) for p in request.protocols)
        if not self._supports(group, request.protocol_type, {n for n, _ in protocols}):
            return fail(E.INCONSISTENT_GROUP_PROTOCOL, member_id)
        if unknown and request.group_instance_id is None and info.api_version >= 4:
            deferred.complete(M.JoinGroupResponse(error_code=E.MEMBER_ID_REQUIRED, member_id=member_id,
                                                  protocol_type=None, protocol_name=None))
            return CoordinatorResult(response=deferred, replay=False)
        try:
            subscription = parse_subscription(protocols[0][1])
        except ProtocolError:
            return fail(E.INCONSISTENT_GROUP_PROTOCOL, member_id)

        records: list[Record] = []
        try:
            if request.group_instance_id is None:
                member = group.members.get(member_id) or ConsumerGroupMember(member_id)
            else:
                member = self._static_member(group, member_id, request.group_instance_id, unknown, records)
        except KafkaError as exc:
            return fail(exc.code, member_id)

        updated = dataclasses.replace(
            member,
            instance_id=request.group_instance_id if request.group_instance_id is not None else member.instance_id,
            rack_id=subscription.rack_id if subscription.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(request.rebalance_timeout_ms if request.rebalance_timeout_ms != -1
                                  else member.rebalance_timeout_ms),
            subscribed_topic_names=frozenset(subscription.topics),
            subscribed_topic_regex="",  # classic members cannot subscribe by regex
            client_id=info.client_id,
            client_host=info.client_host,
            classic=ClassicProtocolMetadata(request.session_timeout_ms, protocols),
        )
        names_changed = False
        if updated != member:
            records.append(self.m.member_record(group.group_id, updated))
            names_changed = updated.subscribed_topic_names != member.subscribed_topic_names
        regex_changed = self.m.maybe_update_regexes(group, member, updated, records, now).value != 0
        bump = names_changed or regex_changed
        group_epoch = group.group_epoch
        members_after = self.m.members_after(group, updated)
        if bump or group.has_metadata_expired(now):
            group_epoch = self.m.update_metadata(group, members_after.values(), bump, records)
        if group_epoch > group.assignment_epoch and self.m.may_assign(group, now):
            target = self.m.update_target_assignment(group, group_epoch, members_after, records, now)
            target_epoch, mine = group_epoch, target.get(updated.member_id, EMPTY)
        else:
            target_epoch = group.assignment_epoch
            mine = group.target_assignment_of(updated.member_id, updated.instance_id)
        updated = self.m.maybe_reconcile(group, updated, target_epoch, mine, bump, self._by_name(subscription.owned),
                                         records)
        response = M.JoinGroupResponse(
            error_code=E.NONE, generation_id=updated.member_epoch, protocol_type=CONSUMER_PROTOCOL_TYPE,
            protocol_name=protocols[0][0], leader="", skip_assignment=False, member_id=updated.member_id, members=[],
        )
        group_id, joined_id = group.group_id, updated.member_id
        session_ms, rebalance_ms = request.session_timeout_ms, request.rebalance_timeout_ms

        def answer() -> None:
            self.m.timer.cancel(classic_join_key(group_id, joined_id))
            self.m.schedule_session_timeout(group_id, joined_id, session_ms)
            self.m.timer.schedule(classic_sync_key(group_id, joined_id), rebalance_ms,
                                  lambda shard, now_: shard.consumer.fence_member(
                                      group_id, joined_id, "the member failed to sync within its rebalance timeout",
                                      now_))
            deferred.complete(response)

        log.info("classic member joins the consumer group", group_id=group_id, member_id=joined_id,
                 epoch=updated.member_epoch)
        if records:
            self.m.waits.group_changed(group_id)  # it may have given up partitions others wait for
        return CoordinatorResult(records=records, response=deferred, on_durable=answer)

    def _supports(self, group: ConsumerGroup, protocol_type: str, names: set[str]) -> bool:
        if protocol_type != CONSUMER_PROTOCOL_TYPE or not names:
            return False
        classic = [m for m in group.members.values() if m.classic is not None]
        return any(all(name in {n for n, _ in m.classic.protocols} for m in classic if m.classic) for name in names)

    def _static_member(self, group: ConsumerGroup, member_id: str, instance_id: str, joining: bool,
                       records: list[Record]) -> ConsumerGroupMember:
        existing = group.static_member(instance_id)
        if joining:
            if existing is None:
                return ConsumerGroupMember(member_id)
            new = dataclasses.replace(existing, member_id=member_id, member_epoch=0, previous_member_epoch=0)
            self.m.replace_member(records, group, existing, new)
            return new
        if existing is None:
            raise KafkaError(E.UNKNOWN_MEMBER_ID)
        if existing.member_id != member_id:
            raise KafkaError(E.FENCED_INSTANCE_ID)
        return existing

    # ----- SyncGroup / Heartbeat / LeaveGroup ---------------------------------------------
    def _validate(self, group: ConsumerGroup, member_id: str, instance_id: str | None) -> ConsumerGroupMember:
        if instance_id is None:
            member = group.member_or_raise(member_id)
        else:
            member_or_none = group.static_member(instance_id)
            if member_or_none is None:
                raise KafkaError(E.UNKNOWN_MEMBER_ID)
            member = member_or_none
            if member.member_id != member_id:
                raise KafkaError(E.FENCED_INSTANCE_ID)
        if member.classic is None:
            raise KafkaError(E.UNKNOWN_MEMBER_ID, "Member %s does not use the classic protocol." % member.member_id)
        return member

    def _rejoin_later(self, group: ConsumerGroup, member: ConsumerGroupMember) -> None:
        """The member must rejoin within its rebalance timeout or be fenced."""
        key = classic_join_key(group.group_id, member.member_id)
        if not self.m.timer.is_scheduled(key):
            group_id, member_id = group.group_id, member.member_id
            self.m.timer.schedule(key, member.rebalance_timeout_ms, lambda shard, now: shard.consumer.fence_member(
                group_id, member_id, "the classic member failed to rejoin within its rebalance timeout", now))

    def sync(self, group: ConsumerGroup, request: Any) -> Result:
        deferred: Deferred[Any] = Deferred()
        try:
            member = self._validate(group, request.member_id, request.group_instance_id)
            if request.generation_id != member.member_epoch:
                raise KafkaError(E.ILLEGAL_GENERATION)
            assert member.classic is not None
            if (request.protocol_type is not None and request.protocol_type != CONSUMER_PROTOCOL_TYPE) or (
                    request.protocol_name is not None and request.protocol_name != member.classic.protocols[0][0]):
                raise KafkaError(E.INCONSISTENT_GROUP_PROTOCOL)
            if group.group_epoch > member.member_epoch and member.state is not MemberState.UNREVOKED_PARTITIONS:
                self._rejoin_later(group, member)
                raise KafkaError(E.REBALANCE_IN_PROGRESS)
        except KafkaError as exc:
            deferred.complete(M.SyncGroupResponse(error_code=exc.code, protocol_type=None, protocol_name=None))
            return CoordinatorResult(response=deferred, replay=False)
        group_id, member_id = group.group_id, member.member_id
        response = M.SyncGroupResponse(error_code=E.NONE, protocol_type=request.protocol_type,
                                       protocol_name=request.protocol_name,
                                       assignment=self._assignment_bytes(member.assigned, member))
        session_ms = member.classic.session_timeout_ms

        def answer() -> None:
            self.m.timer.cancel(classic_sync_key(group_id, member_id))
            self.m.schedule_session_timeout(group_id, member_id, session_ms)
            deferred.complete(response)

        return CoordinatorResult(response=deferred, replay=False, on_durable=answer)

    def heartbeat(self, group: ConsumerGroup, request: Any) -> Result:
        try:
            member = self._validate(group, request.member_id, request.group_instance_id)
            if request.generation_id != member.member_epoch:
                raise KafkaError(E.ILLEGAL_GENERATION)
        except KafkaError as exc:
            return CoordinatorResult(response=M.HeartbeatResponse(error_code=exc.code), replay=False)
        assert member.classic is not None
        self.m.schedule_session_timeout(group.group_id, member.member_id, member.classic.session_timeout_ms)
        code = E.NONE
        # Rejoin when the group moved on, to revoke, or to collect partitions now released.
        if (member.member_epoch < group.group_epoch or member.state is MemberState.UNREVOKED_PARTITIONS
                or (member.state is MemberState.UNRELEASED_PARTITIONS and not self._waiting(group, member))):
            code = E.REBALANCE_IN_PROGRESS
            self._rejoin_later(group, member)
        return CoordinatorResult(response=M.HeartbeatResponse(error_code=code), replay=False)

    @staticmethod
    def _waiting(group: ConsumerGroup, member: ConsumerGroupMember) -> bool:
        """Whether a partition of the member's target is still owned by another member."""
        for topic_id, ps in group.target_assignment.get(member.member_id, EMPTY).items():
            mine = member.assigned.get(topic_id, frozenset())
            if any(p not in mine and group.current_partition_epoch(topic_id, p) != -1 for p in ps):
                return True
        return False

    def leave(self, group: ConsumerGroup, identities: list[Any], now: int) -> Result:
        responses = []
        leaving: dict[str, ConsumerGroupMember] = {}
        for identity in identities:
            code = E.NONE
            try:
                if identity.group_instance_id is None:
                    member = group.member_or_raise(identity.member_id)
                else:
                    found = group.static_member(identity.group_instance_id)
                    if found is None:
                        raise KafkaError(E.UNKNOWN_MEMBER_ID)
                    member = found
                    if identity.member_id and member.member_id != identity.member_id:
                        raise KafkaError(E.FENCED_INSTANCE_ID)
                leaving[member.member_id] = member
            except KafkaError as exc:
                code = exc.code
            responses.append(M.LeaveGroupResponse.MemberResponse(
                member_id=identity.member_id, group_instance_id=identity.group_instance_id, error_code=code))
        return self.m.fence_members(group, list(leaving.values()), M.LeaveGroupResponse(members=responses), now)

    # ----- conversions --------------------------------------------------------------------
    def upgrade(self, classic: ClassicGroup, records: list[Record]) -> ConsumerGroup:
        """A consumer group from a live classic group (a ConsumerGroupHeartbeat joins it)."""
        group_id = classic.group_id
        if not upgrade_enabled(self.policy):
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Cannot upgrade classic group %s to consumer group because "
                             "online upgrade is disabled." % group_id)
        if not classic.uses_consumer_protocol():
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Cannot upgrade classic group %s to consumer group because the "
                             "group does not use the consumer embedded protocol." % group_id)
        if len(classic.members) > self.m.config.consumer_max_size:
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Cannot upgrade classic group %s to consumer group because the "
                             "group size exceeds the consumer group maximum size." % group_id)
        classic.release_heartbeats(E.REBALANCE_IN_PROGRESS)  # the members learn of the new group now
        group = ConsumerGroup(group_id)
        group.group_epoch = group.assignment_epoch = classic.generation_id
        for cm in classic.members.values():
            try:
                name = classic.protocol_name or cm.protocols[0][0]
                subscription = parse_subscription(cm.metadata(name))
                partitions, user_data = parse_assignment(cm.assignment) if cm.assignment else ([], None)
            except (ProtocolError, KafkaError):
                raise KafkaError(E.GROUP_ID_NOT_FOUND, "Cannot upgrade classic group %s to consumer group because "
                                 "the embedded consumer protocol is malformed." % group_id) from None
            if user_data:
                raise KafkaError(E.GROUP_ID_NOT_FOUND, "Cannot upgrade classic group %s to consumer group because an "
                                 "unsupported custom assignor is in use." % group_id)
            assigned = self._by_name(partitions)
            member = ConsumerGroupMember(
                cm.member_id, member_epoch=classic.generation_id, previous_member_epoch=classic.generation_id,
                state=MemberState.STABLE, instance_id=cm.group_instance_id, rack_id=subscription.rack_id,
                rebalance_timeout_ms=cm.rebalance_timeout_ms, client_id=cm.client_id, client_host=cm.client_host,
                subscribed_topic_names=frozenset(subscription.topics), assigned=assigned,
                classic=ClassicProtocolMetadata(cm.session_timeout_ms, tuple(cm.protocols)),
            )
            group.target_assignment[member.member_id] = assigned
            group.update_member(member)
        group.metadata_hash = metadata_hash(group.subscribed_topic_names(), self.m.metadata)

        # Parked classic requests are told to rejoin; the classic group's timers are dropped.
        for cm in list(classic.members.values()):
            classic.complete_join(cm, M.JoinGroupResponse(error_code=E.REBALANCE_IN_PROGRESS, member_id=cm.member_id,
                                                          protocol_type=None, protocol_name=None))
            classic.complete_sync(cm, M.SyncGroupResponse(error_code=E.REBALANCE_IN_PROGRESS))
            self.m.timer.cancel(heartbeat_key(group_id, cm.member_id))
        self.m.timer.cancel(join_key(group_id))
        self.m.timer.cancel(sync_key(group_id))

        records.append(group_metadata_tombstone(group_id))
        records.extend(self.m.member_record(group_id, m) for m in group.members.values())
        records.append(consumer_group_epoch_record(group_id, group.group_epoch, group.metadata_hash))
        records.extend(target_assignment_record(group_id, m, [(t, sorted(ps)) for t, ps in a.items()])
                       for m, a in group.target_assignment.items())
        records.append(target_assignment_epoch_record(group_id, group.group_epoch))
        records.extend(m.current_assignment_record(group_id) for m in group.members.values())
        for m in group.members.values():
            assert m.classic is not None
            self.m.schedule_session_timeout(group_id, m.member_id, m.classic.session_timeout_ms)
        log.info("converted the classic group to a consumer group", group_id=group_id, members=len(group.members))
        return group

    def can_downgrade(self, group: ConsumerGroup, leaving: set[str]) -> bool:
        remaining = [m for m in group.members.values() if m.member_id not in leaving]
        return (bool(remaining) and all(m.classic is not None for m in remaining)
                and downgrade_enabled(self.policy) and len(remaining) <= self.m.config.max_size)

    def downgrade(self, group: ConsumerGroup, leaving: set[str], now: int) -> list[Record]:
        """The consumer group becomes a classic group (its state is replaced directly, so the
        records are not replayed); the classic group then rebalances."""
        group_id = group.group_id
        records = group.tombstones()
        classic = ClassicGroup(group_id, state=GroupState.STABLE, current_state_timestamp=now,
                               protocol_type=CONSUMER_PROTOCOL_TYPE, generation_id=group.group_epoch)
        remaining = [m for m in group.members.values() if m.member_id not in leaving]
        for m in remaining:
            assert m.classic is not None
            classic.add(ClassicMember(
                member_id=m.member_id, group_instance_id=m.instance_id, client_id=m.client_id,
                client_host=m.client_host, rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.classic.session_timeout_ms, protocol_type=CONSUMER_PROTOCOL_TYPE,
                protocols=list(m.classic.protocols),
            ))
        classic.protocol_name = classic.select_protocol()
        classic.subscribed_topics = classic.compute_subscribed_topics()
        for cm in classic.members.values():
            # The last target assignment, in the embedded protocol version the member speaks.
            cm.assignment = encode_assignment(self._names(group.target_assignment.get(cm.member_id, EMPTY)),
                                              protocol_version(cm.metadata(classic.protocol_name)))
        records.append(group_metadata_record(
            group_id, protocol_type=classic.protocol_type, generation=classic.generation_id,
            protocol=classic.protocol_name, leader=classic.leader_id,
            current_state_timestamp=classic.current_state_timestamp,
            members=classic.member_snapshots(classic.assignment_map()),
        ))
        self.m.cancel_group_timers(group)
        for member_id in group.members:
            self.m.timer.cancel(classic_join_key(group_id, member_id))
            self.m.timer.cancel(classic_sync_key(group_id, member_id))
        self.m.groups[group_id] = classic
        for cm in classic.members.values():
            self.classic.reschedule_heartbeat(classic, cm)
        # A member left: the remaining ones rejoin (their heartbeats answer REBALANCE_IN_PROGRESS).
        self.classic._prepare_rebalance(classic, now)  # no records: nobody has rejoined yet
        log.info("converted the consumer group to a classic group", group_id=group_id, members=len(remaining))
        return records
