"""The classic group: states, members, protocol selection and the checks Kafka applies.

A ClassicGroup is the live state of one group using JoinGroup/SyncGroup. Its persisted part
(generation, protocol type and name, leader, members with their subscription and assignment) is
written as GroupMetadata records and rebuilt from them by `ClassicGroup.from_record`; the rest
(parked JoinGroup/SyncGroup responses, pending members, timers) lives only in memory, as in
Kafka. The rebalance logic that drives these objects is in `membership.py`.
"""

from __future__ import annotations

import enum
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from broker.coordinator.group.records import MemberSnapshot, OffsetAndMetadata
from broker.coordinator.group.subscription import CONSUMER_PROTOCOL_TYPE, subscribed_topics
from broker.coordinator.result import Deferred
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

GROUP_TYPE = "classic"
EMPTY_ASSIGNMENT = b""

Protocols = list[tuple[str, bytes]]  # (name, metadata) in the member's order of preference


class GroupState(enum.Enum):
    EMPTY = "Empty"
    PREPARING_REBALANCE = "PreparingRebalance"
    COMPLETING_REBALANCE = "CompletingRebalance"
    STABLE = "Stable"
    DEAD = "Dead"


S = GroupState

# The legal transitions: the states a group may be in before moving to each state.
VALID_PREVIOUS_STATES: dict[GroupState, frozenset[GroupState]] = {
    S.EMPTY: frozenset([S.PREPARING_REBALANCE]),
    S.PREPARING_REBALANCE: frozenset([S.STABLE, S.COMPLETING_REBALANCE, S.EMPTY]),
    S.COMPLETING_REBALANCE: frozenset([S.PREPARING_REBALANCE]),
    S.STABLE: frozenset([S.COMPLETING_REBALANCE]),
    S.DEAD: frozenset([S.STABLE, S.PREPARING_REBALANCE, S.COMPLETING_REBALANCE, S.EMPTY, S.DEAD]),
}


def protocols_of(request_protocols: list[Any]) -> Protocols:
    return [(p.name, bytes(p.metadata)) for p in request_protocols]


@dataclass(eq=False)
class ClassicMember:
    member_id: str
    group_instance_id: str | None
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    session_timeout_ms: int
    protocol_type: str
    protocols: Protocols
    assignment: bytes = EMPTY_ASSIGNMENT
    join_deferred: Deferred[Any] | None = None  # a parked JoinGroup response
    sync_deferred: Deferred[Any] | None = None  # a parked SyncGroup response
    heartbeat_deferred: Deferred[Any] | None = None  # a held Heartbeat response (membership.py)
    is_new: bool = False  # joined but not yet through a completed join phase

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    @property
    def is_awaiting_join(self) -> bool:
        return self.join_deferred is not None

    @property
    def is_awaiting_sync(self) -> bool:
        return self.sync_deferred is not None

    def protocol_names(self) -> set[str]:
        return {name for name, _ in self.protocols}

    def metadata(self, protocol_name: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol_name:
                return meta
        raise KafkaError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "member does not support %s" % protocol_name)

    def matches(self, protocols: Protocols) -> bool:
        return protocols == self.protocols

    def vote(self, candidates: set[str]) -> str:
        """The member's most preferred protocol among the candidates."""
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise KafkaError(ErrorCode.INCONSISTENT_GROUP_PROTOCOL, "member supports none of the candidates")

    def has_satisfied_heartbeat(self) -> bool:
        # A new member can expire while its JoinGroup is parked; others awaiting a rebalance
        # response count as alive.
        if self.is_new:
            return False
        return self.is_awaiting_join or self.is_awaiting_sync


@dataclass(eq=False)
class ClassicGroup:
    group_id: str
    state: GroupState = GroupState.EMPTY
    previous_state: GroupState = GroupState.DEAD
    current_state_timestamp: int | None = None
    protocol_type: str | None = None
    protocol_name: str | None = None
    generation_id: int = 0
    leader_id: str | None = None
    members: dict[str, ClassicMember] = field(default_factory=dict)  # in order of joining
    static_members: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    pending_join_members: set[str] = field(default_factory=set)  # ids handed out by MEMBER_ID_REQUIRED
    pending_sync_members: set[str] = field(default_factory=set)
    num_awaiting_join: int = 0
    supported_protocols: Counter[str] = field(default_factory=Counter)
    subscribed_topics: set[str] | None = None  # None: unknown
    initial_delay_elapsed: bool = False  # the initial rebalance delay is over; the join waits only for pending members

    type = GROUP_TYPE

    # ----- from and to records ------------------------------------------------------------
    @classmethod
    def from_record(cls, group_id: str, value: Any) -> ClassicGroup:
        """The group a GroupMetadataValue describes: Stable with its members, or Empty."""
        protocol_type = value.protocol_type or None
        group = cls(
            group_id=group_id,
            state=GroupState.STABLE if value.members else GroupState.EMPTY,
            current_state_timestamp=None if value.current_state_timestamp == -1 else value.current_state_timestamp,
            protocol_type=protocol_type,
            protocol_name=value.protocol,
            generation_id=value.generation,
            leader_id=value.leader,
        )
        for m in value.members:
            group.add(ClassicMember(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.session_timeout if m.rebalance_timeout == -1 else m.rebalance_timeout,
                session_timeout_ms=m.session_timeout,
                protocol_type=value.protocol_type,
                protocols=[(value.protocol or "", bytes(m.subscription))],
                assignment=bytes(m.assignment),
            ))
        group.subscribed_topics = group.compute_subscribed_topics()
        return group

    def member_snapshots(self, assignment: dict[str, bytes]) -> list[MemberSnapshot]:
        return [
            MemberSnapshot(
                member_id=m.member_id,
                group_instance_id=m.group_instance_id,
                client_id=m.client_id,
                client_host=m.client_host,
                rebalance_timeout_ms=m.rebalance_timeout_ms,
                session_timeout_ms=m.session_timeout_ms,
                subscription=m.metadata(self.protocol_name),
                assignment=assignment[m.member_id],
            )
            for m in self.members.values()
        ]

    # ----- states -------------------------------------------------------------------------
    def in_state(self, *states: GroupState) -> bool:
        return self.state in states

    def is_empty(self) -> bool:
        return self.state is GroupState.EMPTY

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS_STATES[GroupState.PREPARING_REBALANCE]

    def transition_to(self, target: GroupState, now_ms: int) -> None:
        if self.state not in VALID_PREVIOUS_STATES[target]:
            raise RuntimeError("group %s cannot move from %s to %s" % (self.group_id, self.state.value, target.value))
        if self.state is GroupState.STABLE:
            # Held heartbeats get the answer a heartbeat arriving now would get.
            self.release_heartbeats(ErrorCode.REBALANCE_IN_PROGRESS if target is GroupState.PREPARING_REBALANCE
                                    else ErrorCode.COORDINATOR_NOT_AVAILABLE)
        self.previous_state = self.state
        self.state = target
        self.current_state_timestamp = now_ms

    # ----- members ------------------------------------------------------------------------
    def has_member(self, member_id: str) -> bool:
        return member_id in self.members

    def member(self, member_id: str) -> ClassicMember:
        return self.members[member_id]

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id is not None and self.leader_id == member_id

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def add(self, member: ClassicMember, join_deferred: Deferred[Any] | None = None) -> None:
        if member.group_instance_id is not None:
            if member.group_instance_id in self.static_members:
                raise RuntimeError("static member %s is already in group %s" % (member.group_instance_id, self.group_id))
            self.static_members[member.group_instance_id] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if self.protocol_type != member.protocol_type:
            raise RuntimeError("the group and the member must have the same protocol type")
        if not self.supports_protocols(member.protocol_type, member.protocol_names()):
            raise RuntimeError("none of the member's protocols is supported by the group")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        self.supported_protocols.update(member.protocol_names())
        member.join_deferred = join_deferred
        if member.is_awaiting_join:
            self.num_awaiting_join += 1
        self.pending_join_members.discard(member.member_id)

    def remove(self, member_id: str) -> None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self.release_heartbeat(member, ErrorCode.UNKNOWN_MEMBER_ID)
            self.supported_protocols.subtract(member.protocol_names())
            if member.is_awaiting_join:
                self.num_awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.is_leader(member_id):
            self.leader_id = next(iter(self.members), None)
        self.pending_join_members.discard(member_id)
        self.pending_sync_members.discard(member_id)

    def update_member(
        self, member: ClassicMember, protocols: Protocols, rebalance_timeout_ms: int, session_timeout_ms: int,
        join_deferred: Deferred[Any] | None,
    ) -> None:
        self.supported_protocols.subtract(member.protocol_names())
        member.protocols = protocols
        self.supported_protocols.update(member.protocol_names())
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms
        if join_deferred is not None and not member.is_awaiting_join:
            self.num_awaiting_join += 1
        elif join_deferred is None and member.is_awaiting_join:
            self.num_awaiting_join -= 1
        member.join_deferred = join_deferred

    def maybe_elect_new_joined_leader(self) -> bool:
        """Keep a leader that rejoined, else pick a member that did; False if none did."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.is_awaiting_join:
            return True
        for member in self.members.values():
            if member.is_awaiting_join:
                self.leader_id = member.member_id
                return True
        return False

    def replace_static_member(self, instance_id: str, old_member_id: str, new_member_id: str) -> ClassicMember:
        """A restarted static member takes over its old member; a request still parked for the
        old member id is answered FENCED_INSTANCE_ID."""
        old = self.members.pop(old_member_id)
        self.release_heartbeat(old, ErrorCode.FENCED_INSTANCE_ID)
        self.complete_join(old, M.JoinGroupResponse(
            error_code=ErrorCode.FENCED_INSTANCE_ID, member_id=old_member_id, members=[],
            protocol_name=None, protocol_type=None, leader="", skip_assignment=False,
        ))
        self.complete_sync(old, M.SyncGroupResponse(
            error_code=ErrorCode.FENCED_INSTANCE_ID, assignment=b"", protocol_name=None, protocol_type=None,
        ))
        new = ClassicMember(
            member_id=new_member_id,
            group_instance_id=old.group_instance_id,
            client_id=old.client_id,
            client_host=old.client_host,
            rebalance_timeout_ms=old.rebalance_timeout_ms,
            session_timeout_ms=old.session_timeout_ms,
            protocol_type=old.protocol_type,
            protocols=old.protocols,
            assignment=old.assignment,
        )
        self.members[new_member_id] = new
        if self.is_leader(old_member_id):
            self.leader_id = new_member_id
        self.static_members[instance_id] = new_member_id
        return new

    def add_pending_member(self, member_id: str) -> None:
        if member_id in self.members:
            raise RuntimeError("pending member %s is already a member" % member_id)
        self.pending_join_members.add(member_id)

    def is_pending_member(self, member_id: str) -> bool:
        return member_id in self.pending_join_members

    def static_member_id(self, instance_id: str | None) -> str | None:
        return None if instance_id is None else self.static_members.get(instance_id)

    def not_yet_rejoined_members(self) -> list[ClassicMember]:
        return [m for m in self.members.values() if not m.is_awaiting_join]

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_join_members

    def has_received_sync_from_all_members(self) -> bool:
        return not self.pending_sync_members

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    def assignment_map(self) -> dict[str, bytes]:
        return {m.member_id: m.assignment for m in self.members.values()}

    # ----- parked responses ---------------------------------------------------------------
    def complete_join(self, member: ClassicMember, response: Any) -> bool:
        if member.join_deferred is None:
            return False
        deferred, member.join_deferred = member.join_deferred, None
        self.num_awaiting_join -= 1
        deferred.complete(response)
        return True

    def complete_sync(self, member: ClassicMember, response: Any) -> bool:
        if member.sync_deferred is None:
            return False
        deferred, member.sync_deferred = member.sync_deferred, None
        deferred.complete(response)
        return True

    def release_heartbeat(self, member: ClassicMember, code: ErrorCode) -> bool:
        if member.heartbeat_deferred is None:
            return False
        deferred, member.heartbeat_deferred = member.heartbeat_deferred, None
        deferred.complete(M.HeartbeatResponse(error_code=code))
        return True

    def release_heartbeats(self, code: ErrorCode) -> None:
        for member in self.members.values():
            self.release_heartbeat(member, code)

    # ----- protocols ----------------------------------------------------------------------
    def supports_protocols(self, protocol_type: str, names: set[str]) -> bool:
        """An empty group takes any non-empty protocol type and list; otherwise the type must
        match and at least one protocol must be supported by every member."""
        if self.state is GroupState.EMPTY:
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return self.protocol_type == protocol_type and any(self.supported_protocols[p] == n for p in names)

    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {p for p, count in self.supported_protocols.items() if count == n and n > 0}

    def select_protocol(self) -> str:
        """The protocol supported by every member with the most first-choice votes (ties go to
        the protocol voted for first, in members' join order)."""
        if not self.members:
            raise RuntimeError("cannot select a protocol for an empty group")
        candidates = self.candidate_protocols()
        votes: Counter[str] = Counter(m.vote(candidates) for m in self.members.values())
        return max(votes, key=lambda p: votes[p])

    def init_next_generation(self, now_ms: int) -> None:
        self.generation_id += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.COMPLETING_REBALANCE, now_ms)
        else:
            self.protocol_name = None
            self.subscribed_topics = self.compute_subscribed_topics()
            self.transition_to(GroupState.EMPTY, now_ms)
        self.pending_sync_members.clear()

    def compute_subscribed_topics(self) -> set[str] | None:
        """The union of the members' consumer-protocol subscriptions; None when unknown."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        for m in self.members.values():
            parsed = subscribed_topics(m.metadata(self.protocol_name))
            if parsed is None:
                return None
            topics.update(parsed)
        return topics

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed_topics is None:
            return self.uses_consumer_protocol()
        return topic in self.subscribed_topics

    def current_members_for_join(self) -> list[Any]:
        """The member list the leader receives to compute the assignment."""
        return [
            M.JoinGroupResponse.JoinGroupResponseMember(
                member_id=m.member_id, group_instance_id=m.group_instance_id, metadata=m.metadata(self.protocol_name),
            )
            for m in self.members.values()
        ]

    # ----- validations Kafka applies ------------------------------------------------------
    def validate_member(self, member_id: str, instance_id: str | None) -> None:
        if instance_id is not None:
            existing = self.static_members.get(instance_id)
            if existing is None:
                raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID)
            if existing != member_id:
                raise KafkaError(ErrorCode.FENCED_INSTANCE_ID)
        if member_id not in self.members:
            raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID)

    def validate_offset_commit(self, member_id: str, instance_id: str | None, generation_id: int,
                               transactional: bool = False) -> None:
        if self.state is GroupState.DEAD:
            raise KafkaError(ErrorCode.COORDINATOR_NOT_AVAILABLE)
        if generation_id < 0 and self.state is GroupState.EMPTY:
            return  # a commit from the admin client or a consumer not using group management
        if generation_id >= 0 or member_id or instance_id is not None:
            self.validate_member(member_id, instance_id)
            if generation_id != self.generation_id:
                raise KafkaError(ErrorCode.ILLEGAL_GENERATION)
        elif not transactional and self.state is not GroupState.EMPTY:
            # TxnOffsetCommit before v3 carries no member: Kafka accepts it in any state
            raise KafkaError(ErrorCode.UNKNOWN_MEMBER_ID)
        if not transactional and self.state is GroupState.COMPLETING_REBALANCE:
            raise KafkaError(ErrorCode.REBALANCE_IN_PROGRESS)

    def validate_offset_delete(self) -> None:
        if self.state is GroupState.DEAD:
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND)
        # Offsets of a consumer group can go while it runs, for topics it does not subscribe to.
        if self.state is not GroupState.EMPTY and not self.uses_consumer_protocol():
            raise KafkaError(ErrorCode.NON_EMPTY_GROUP)

    def validate_delete_group(self) -> None:
        if self.state is GroupState.DEAD:
            raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND)
        if self.state is not GroupState.EMPTY:
            raise KafkaError(ErrorCode.NON_EMPTY_GROUP)

    def offset_expiration_base(self) -> Callable[[OffsetAndMetadata], int] | None:
        """From when an offset's retention counts, or None if this group's offsets don't expire:
        an Empty group counts from when it became empty (or the commit, for old records); a
        Stable consumer group with known subscriptions from the commit (only offsets of topics it
        no longer subscribes to are considered); a simple group (no protocol) from the commit."""
        if self.protocol_type is None:
            return lambda om: om.commit_timestamp_ms
        if self.state is GroupState.EMPTY:
            since = self.current_state_timestamp
            return lambda om: om.commit_timestamp_ms if since is None else since
        if self.uses_consumer_protocol() and self.subscribed_topics is not None and self.state is GroupState.STABLE:
            return lambda om: om.commit_timestamp_ms
        return None

    # ----- descriptions -------------------------------------------------------------------
    def describe(self) -> Any:
        stable = self.state is GroupState.STABLE
        return M.DescribeGroupsResponse.DescribedGroup(
            group_id=self.group_id,
            group_state=self.state.value,
            protocol_type=self.protocol_type or "",
            protocol_data=(self.protocol_name or "") if stable else "",
            members=[
                M.DescribeGroupsResponse.DescribedGroupMember(
                    member_id=m.member_id,
                    group_instance_id=m.group_instance_id,
                    client_id=m.client_id,
                    client_host=m.client_host,
                    member_metadata=m.metadata(self.protocol_name) if stable else b"",
                    member_assignment=m.assignment,
                )
                for m in self.members.values()
            ],
        )

    def listed(self) -> Any:
        return M.ListGroupsResponse.ListedGroup(
            group_id=self.group_id, protocol_type=self.protocol_type or "", group_state=self.state.value,
            group_type=GROUP_TYPE,
        )
