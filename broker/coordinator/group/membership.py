"""The classic rebalance protocol: JoinGroup, SyncGroup, Heartbeat and LeaveGroup handlers, the
timers that drive rebalances and session expiry, and DescribeGroups/ListGroups data.

Follows Kafka's new group coordinator (GroupMetadataManager, classic part) for states, error
codes and edge cases. Handlers are plain functions called on the shard's task. The classic group
keeps its live state in memory, so these handlers update it directly (as Kafka does) and write
GroupMetadata records as snapshots with replay=False; loading rebuilds the group from them.

Timer keys (one per purpose, rescheduling replaces): "heartbeat-<group>-<member>" (session
expiry, and the new-member join timeout), "join-<group>" (end of the join phase), "sync-<group>"
(members that never sent SyncGroup).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from broker.coordinator.group.classic import (
    EMPTY_ASSIGNMENT,
    ClassicGroup,
    ClassicMember,
    GroupState,
    protocols_of,
)
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.records import empty_group_metadata_record, group_metadata_record
from broker.coordinator.result import CoordinatorResult, Deferred, Record
from broker.coordinator.timer import Timer
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.group")

E = ErrorCode
S = GroupState
Result = CoordinatorResult[Any]


@dataclass(frozen=True)
class RequestInfo:
    """What a handler needs to know about the request besides its body."""

    client_id: str = ""
    client_host: str = ""
    api_version: int = 0


def heartbeat_key(group_id: str, member_id: str) -> str:
    return "heartbeat-%s-%s" % (group_id, member_id)


def join_key(group_id: str) -> str:
    return "join-%s" % group_id


def hold_key(group_id: str, member_id: str) -> str:
    return "heartbeat-hold-%s-%s" % (group_id, member_id)


def sync_key(group_id: str) -> str:
    return "sync-%s" % group_id


def _effects(records: list[Record] | None = None, on_durable: Callable[[], None] | None = None) -> Result:
    return CoordinatorResult(records=records or [], replay=False, on_durable=on_durable)


def _join_error(code: ErrorCode, member_id: str = "") -> Any:
    return M.JoinGroupResponse(error_code=code, member_id=member_id, protocol_type=None, protocol_name=None)


def _group_snapshot(group: ClassicGroup, assignment: dict[str, bytes]) -> Record:
    return group_metadata_record(
        group.group_id,
        protocol_type=group.protocol_type,
        generation=group.generation_id,
        protocol=group.protocol_name,
        leader=group.leader_id,
        current_state_timestamp=group.current_state_timestamp,
        members=group.member_snapshots(assignment),
    )


class ClassicGroupManager:
    def __init__(
        self,
        groups: dict[str, ClassicGroup],
        timer: Timer,
        config: GroupCoordinatorConfig,
        new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
    ) -> None:
        self.groups = groups
        self.timer = timer
        self.config = config
        self.new_uuid = new_uuid
        self.rebalances = 0  # generations begun since this shard was built (metrics)

    def classic_group(self, group_id: str) -> ClassicGroup | None:
        group = self.groups.get(group_id)
        return group if isinstance(group, ClassicGroup) else None

    # ----- JoinGroup ----------------------------------------------------------------------
    def join_group(self, request: Any, info: RequestInfo, now: int) -> Result:
        deferred: Deferred[Any] = Deferred()
        member_id = request.member_id
        if not request.group_id:
            deferred.complete(_join_error(E.INVALID_GROUP_ID, member_id))
            return CoordinatorResult(response=deferred, replay=False)
        if not self.config.min_session_timeout_ms <= request.session_timeout_ms <= self.config.max_session_timeout_ms:
            deferred.complete(_join_error(E.INVALID_SESSION_TIMEOUT, member_id))
            return CoordinatorResult(response=deferred, replay=False)

        is_unknown = member_id == ""
        group = self.groups.get(request.group_id)
        is_new_group = group is None
        if group is None:
            if not is_unknown:  # a member id for a group that does not exist
                deferred.complete(_join_error(E.UNKNOWN_MEMBER_ID, member_id))
                return CoordinatorResult(response=deferred, replay=False)
            group = ClassicGroup(request.group_id, current_state_timestamp=now)
            self.groups[request.group_id] = group
        elif not isinstance(group, ClassicGroup):
            deferred.complete(_join_error(E.INCONSISTENT_GROUP_PROTOCOL))
            return CoordinatorResult(response=deferred, replay=False)

        if not self._accept_joining_member(group, member_id):
            group.remove(member_id)
            deferred.complete(_join_error(E.GROUP_MAX_SIZE_REACHED))
            result = _effects()
        elif is_unknown:
            result = self._join_new_member(group, request, info, deferred, now)
        else:
            result = self._join_existing_member(group, request, info, deferred, now)

        if is_new_group and not result.records:
            # Persist the group's creation, as Kafka does.
            result.records = [empty_group_metadata_record(group.group_id, group.current_state_timestamp)]
        result.response = deferred
        return result

    def _accept_joining_member(self, group: ClassicGroup, member_id: str) -> bool:
        if group.in_state(S.EMPTY, S.DEAD):
            return True
        if group.state is S.PREPARING_REBALANCE:
            # Counting awaiting members lets the last rejoining members be the ones turned away
            # when group.max.size was lowered.
            member = group.members.get(member_id)
            return (member is not None and member.is_awaiting_join) or group.num_awaiting_join < self.config.max_size
        return group.has_member(member_id) or len(group.members) < self.config.max_size

    def _join_new_member(self, group: ClassicGroup, request: Any, info: RequestInfo, deferred: Deferred[Any],
                         now: int) -> Result:
        protocols = protocols_of(request.protocols)
        if group.state is S.DEAD:
            deferred.complete(_join_error(E.COORDINATOR_NOT_AVAILABLE))
            return _effects()
        if not group.supports_protocols(request.protocol_type, {name for name, _ in protocols}):
            deferred.complete(_join_error(E.INCONSISTENT_GROUP_PROTOCOL))
            return _effects()
        instance_id = request.group_instance_id
        new_member_id = "%s-%s" % (instance_id if instance_id is not None else info.client_id, self.new_uuid())
        if instance_id is not None:
            existing = group.static_member_id(instance_id)
            if existing is not None:
                return self._replace_static_member(group, request, info, existing, new_member_id, deferred, now)
            return self._add_member(group, request, info, new_member_id, deferred, now)
        if info.api_version >= 4:
            # The member must come back with this id, so that a client retrying JoinGroup after a
            # timeout does not leave defunct members behind; the id expires after the session timeout.
            group.add_pending_member(new_member_id)
            self._schedule_heartbeat(group.group_id, new_member_id, request.session_timeout_ms)
            deferred.complete(_join_error(E.MEMBER_ID_REQUIRED, new_member_id))
            return _effects()
        return self._add_member(group, request, info, new_member_id, deferred, now)

    def _join_existing_member(self, group: ClassicGroup, request: Any, info: RequestInfo, deferred: Deferred[Any],
                              now: int) -> Result:
        member_id = request.member_id
        protocols = protocols_of(request.protocols)
        if group.state is S.DEAD:
            deferred.complete(_join_error(E.COORDINATOR_NOT_AVAILABLE, member_id))
            return _effects()
        if not group.supports_protocols(request.protocol_type, {name for name, _ in protocols}):
            deferred.complete(_join_error(E.INCONSISTENT_GROUP_PROTOCOL, member_id))
            return _effects()
        if group.is_pending_member(member_id):
            if request.group_instance_id is not None:
                raise KafkaError(E.UNKNOWN_SERVER_ERROR, "a pending member cannot be static")
            return self._add_member(group, request, info, member_id, deferred, now)
        try:
            group.validate_member(member_id, request.group_instance_id)
        except KafkaError as exc:
            deferred.complete(_join_error(exc.code, member_id))
            return _effects()

        member = group.member(member_id)
        if group.state is S.PREPARING_REBALANCE:
            return self._update_member(group, member, request, deferred, now)
        if group.state is S.COMPLETING_REBALANCE:
            if member.matches(protocols):
                # The member probably missed the JoinGroup response: send it again.
                members = group.current_members_for_join() if group.is_leader(member_id) else []
                deferred.complete(self._join_response(group, member_id, members))
                return _effects()
            return self._update_member(group, member, request, deferred, now)
        if group.state is S.STABLE:
            if group.is_leader(member_id) or not member.matches(protocols):
                # The leader rejoining asks for a new assignment (e.g. the topics changed).
                return self._update_member(group, member, request, deferred, now)
            deferred.complete(self._join_response(group, member_id, []))
            return _effects()
        # Empty: the member is gone; it must reset its generation and rejoin.
        deferred.complete(_join_error(E.UNKNOWN_MEMBER_ID, member_id))
        return _effects()

    @staticmethod
    def _join_response(group: ClassicGroup, member_id: str, members: list[Any], skip_assignment: bool = False,
                       leader: str | None = None) -> Any:
        return M.JoinGroupResponse(
            error_code=E.NONE,
            generation_id=group.generation_id,
            protocol_type=group.protocol_type,
            protocol_name=group.protocol_name,
            leader=(leader if leader is not None else group.leader_id) or "",
            skip_assignment=skip_assignment,
            member_id=member_id,
            members=members,
        )

    def _update_member(self, group: ClassicGroup, member: ClassicMember, request: Any, deferred: Deferred[Any],
                       now: int) -> Result:
        group.update_member(member, protocols_of(request.protocols), request.rebalance_timeout_ms,
                            request.session_timeout_ms, deferred)
        return self._maybe_prepare_rebalance_or_complete_join(group, now)

    def _add_member(self, group: ClassicGroup, request: Any, info: RequestInfo, member_id: str,
                    deferred: Deferred[Any], now: int) -> Result:
        member = ClassicMember(
            member_id=member_id,
            group_instance_id=request.group_instance_id,
            client_id=info.client_id,
            client_host=info.client_host,
            rebalance_timeout_ms=request.rebalance_timeout_ms,
            session_timeout_ms=request.session_timeout_ms,
            protocol_type=request.protocol_type,
            protocols=protocols_of(request.protocols),
            is_new=True,
        )
        group.add(member, deferred)
        # A new member's parked JoinGroup cannot heartbeat and its disconnect goes unseen, so it
        # gets a fixed timeout; a member still interested will retry.
        self._schedule_heartbeat(group.group_id, member_id, self.config.new_member_join_timeout_ms)
        return self._maybe_prepare_rebalance_or_complete_join(group, now)

    def _replace_static_member(self, group: ClassicGroup, request: Any, info: RequestInfo, old_member_id: str,
                               new_member_id: str, deferred: Deferred[Any], now: int) -> Result:
        """A known group.instance.id joins with an unknown member id: the restarted instance
        takes over its old member; no rebalance if the group's protocol would not change."""
        current_leader = group.leader_id
        new_member = group.replace_static_member(request.group_instance_id, old_member_id, new_member_id)
        self.timer.cancel(heartbeat_key(group.group_id, old_member_id))
        self._schedule_heartbeat(group.group_id, new_member_id, new_member.session_timeout_ms)
        group.update_member(new_member, protocols_of(request.protocols), request.rebalance_timeout_ms,
                            request.session_timeout_ms, deferred)

        if group.state is S.STABLE:
            if (group.protocol_name or "") == group.select_protocol():
                version = info.api_version

                def answer() -> None:
                    if version >= 9:
                        is_leader = group.is_leader(new_member_id)
                        members = group.current_members_for_join() if is_leader else []
                        group.complete_join(new_member, self._join_response(
                            group, new_member_id, members, skip_assignment=is_leader))
                    else:
                        # Older clients are told the previous leader id, so a replaced leader
                        # comes back as a follower and the assignment stays as it is.
                        group.complete_join(new_member, self._join_response(
                            group, new_member_id, [], leader=current_leader))

                return _effects([_group_snapshot(group, group.assignment_map())], on_durable=answer)
            return self._maybe_prepare_rebalance_or_complete_join(group, now)
        if group.state is S.COMPLETING_REBALANCE:
            # The leader may already be assigning to the old member id: rebalance.
            return self._prepare_rebalance(group, now)
        if group.in_state(S.EMPTY, S.DEAD):
            raise KafkaError(E.UNKNOWN_SERVER_ERROR, "static member of a group in state %s" % group.state.value)
        return self._maybe_complete_join_phase(group, now)

    # ----- rebalance ----------------------------------------------------------------------
    def _maybe_prepare_rebalance_or_complete_join(self, group: ClassicGroup, now: int) -> Result:
        if group.can_rebalance():
            return self._prepare_rebalance(group, now)
        return self._maybe_complete_join_phase(group, now)

    def _maybe_complete_join_phase(self, group: ClassicGroup, now: int) -> Result:
        if group.state is not S.PREPARING_REBALANCE:
            return _effects()
        if group.previous_state is S.EMPTY and not group.initial_delay_elapsed:
            return _effects()  # the initial rebalance always waits for its delay
        if not group.has_all_members_joined():
            return _effects()
        return self._complete_join(group, now)

    def _prepare_rebalance(self, group: ClassicGroup, now: int) -> Result:
        if group.state is S.COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment(group, E.REBALANCE_IN_PROGRESS)
        group.pending_sync_members.clear()
        self.timer.cancel(sync_key(group.group_id))

        is_initial = group.state is S.EMPTY
        if is_initial:
            # A new group: give other members time to join (group.initial.rebalance.delay.ms).
            group.initial_delay_elapsed = False
            delay = self.config.initial_join_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            self._schedule_initial_join(group.group_id, delay, remaining)
        group.transition_to(S.PREPARING_REBALANCE, now)
        log.info("preparing to rebalance", group_id=group.group_id, generation=group.generation_id)
        if is_initial:
            return _effects()
        if group.has_all_members_joined():
            return self._complete_join(group, now)
        self._schedule_join(group.group_id, group.rebalance_timeout_ms())
        return _effects()

    def _schedule_initial_join(self, group_id: str, delay: int, remaining: int) -> None:
        self.timer.schedule(
            join_key(group_id), delay,
            lambda shard, now: shard.classic.try_complete_initial_rebalance(group_id, delay, remaining, now),
        )

    def _schedule_join(self, group_id: str, delay: int) -> None:
        self.timer.schedule(join_key(group_id), delay, lambda shard, now: shard.classic.complete_join(group_id, now))

    def try_complete_initial_rebalance(self, group_id: str, delay: int, remaining: int, now: int) -> Result:
        """The initial delay is over. Kafka would wait another delay when members joined during
        this one; here the join completes as soon as every known member has joined (the issue's
        rule: a new group of five is formed after one delay, not two). Members that were given an
        id (MEMBER_ID_REQUIRED) and have not rejoined yet are waited for, up to the rebalance timeout."""
        group = self.classic_group(group_id)
        if group is None:
            return _effects()
        if group.has_all_members_joined() or remaining == 0:
            return self._complete_join(group, now)
        group.initial_delay_elapsed = True
        self._schedule_join(group_id, remaining)
        return _effects()

    def complete_join(self, group_id: str, now: int) -> Result:
        """The join-phase timer: complete the join phase with the members that rejoined."""
        group = self.classic_group(group_id)
        if group is None:
            return _effects()
        return self._complete_join(group, now)

    def _complete_join(self, group: ClassicGroup, now: int) -> Result:
        self.timer.cancel(join_key(group.group_id))
        for member in group.not_yet_rejoined_members():
            if not member.is_static:  # static members keep their place until their session expires
                group.remove(member.member_id)
                self.timer.cancel(heartbeat_key(group.group_id, member.member_id))

        if group.state is S.DEAD:
            return _effects()
        if not group.maybe_elect_new_joined_leader() and group.members:
            # Nobody rejoined: wait another rebalance timeout for session expiry to clear them.
            self._schedule_join(group.group_id, group.rebalance_timeout_ms())
            return _effects()

        group.init_next_generation(now)
        self.rebalances += 1
        if group.state is S.EMPTY:
            log.info("group is now empty", group_id=group.group_id, generation=group.generation_id)
            return _effects([_group_snapshot(group, {})])

        log.info("group completed its join phase", group_id=group.group_id, generation=group.generation_id,
                 members=len(group.members), protocol=group.protocol_name)
        for member in list(group.members.values()):
            members = group.current_members_for_join() if group.is_leader(member.member_id) else []
            group.complete_join(member, self._join_response(group, member.member_id, members))
            self._schedule_heartbeat(group.group_id, member.member_id, member.session_timeout_ms)
            member.is_new = False
            group.pending_sync_members.add(member.member_id)
        generation = group.generation_id
        self.timer.schedule(
            sync_key(group.group_id), group.rebalance_timeout_ms(),
            lambda shard, now_: shard.classic.expire_pending_sync(group.group_id, generation, now_),
        )
        return _effects()

    def expire_pending_sync(self, group_id: str, generation: int, now: int) -> Result:
        """Members that received their JoinGroup response but never sent SyncGroup are removed."""
        group = self.classic_group(group_id)
        if group is None or group.generation_id != generation:
            return _effects()
        if group.in_state(S.COMPLETING_REBALANCE, S.STABLE) and not group.has_received_sync_from_all_members():
            for member_id in list(group.pending_sync_members):
                group.remove(member_id)
                self.timer.cancel(heartbeat_key(group_id, member_id))
            return self._prepare_rebalance(group, now)
        return _effects()

    def _reset_and_propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        for member in group.members.values():
            member.assignment = EMPTY_ASSIGNMENT
        self._propagate_assignment(group, error)

    def _propagate_assignment(self, group: ClassicGroup, error: ErrorCode) -> None:
        ok = error is E.NONE
        for member in list(group.members.values()):
            response = M.SyncGroupResponse(
                error_code=error,
                protocol_type=group.protocol_type if ok else None,
                protocol_name=group.protocol_name if ok else None,
                assignment=member.assignment,
            )
            if group.complete_sync(member, response):
                # Expiries that hit while the member waited were ignored; start a fresh session.
                self._schedule_heartbeat(group.group_id, member.member_id, member.session_timeout_ms)

    # ----- session expiry -----------------------------------------------------------------
    def _schedule_heartbeat(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        self.timer.schedule(
            heartbeat_key(group_id, member_id), timeout_ms,
            lambda shard, now: shard.classic.expire_heartbeat(group_id, member_id, now),
        )

    def reschedule_heartbeat(self, group: ClassicGroup, member: ClassicMember) -> None:
        self._schedule_heartbeat(group.group_id, member.member_id, member.session_timeout_ms)

    def expire_heartbeat(self, group_id: str, member_id: str, now: int) -> Result:
        group = self.classic_group(group_id)
        if group is None or group.state is S.DEAD:
            return _effects()
        if group.is_pending_member(member_id):
            log.info("pending member expired", group_id=group_id, member_id=member_id)
            group.remove(member_id)
            if group.state is S.PREPARING_REBALANCE and group.has_all_members_joined():
                return self._complete_join(group, now)
            return _effects()
        member = group.members.get(member_id)
        if member is None or member.has_satisfied_heartbeat():
            return _effects()
        log.info("member session expired", group_id=group_id, member_id=member_id)
        return self._remove_member_and_update(group, member, now)

    def _remove_member_and_update(self, group: ClassicGroup, member: ClassicMember, now: int) -> Result:
        # A new member may expire while its JoinGroup is parked: answer it so the client retries.
        group.complete_join(member, _join_error(E.UNKNOWN_MEMBER_ID))
        group.remove(member.member_id)
        if group.in_state(S.STABLE, S.COMPLETING_REBALANCE):
            return self._maybe_prepare_rebalance_or_complete_join(group, now)
        if group.state is S.PREPARING_REBALANCE and group.has_all_members_joined():
            return self._complete_join(group, now)
        return _effects()

    # ----- SyncGroup ----------------------------------------------------------------------
    def sync_group(self, request: Any, info: RequestInfo, now: int) -> Result:
        deferred: Deferred[Any] = Deferred()
        result = self._sync(request, deferred, now)
        result.response = deferred
        return result

    def _sync(self, request: Any, deferred: Deferred[Any], now: int) -> Result:
        def fail(code: ErrorCode) -> Result:
            deferred.complete(M.SyncGroupResponse(error_code=code, protocol_type=None, protocol_name=None))
            return _effects()

        if not request.group_id:
            return fail(E.INVALID_GROUP_ID)
        group = self.classic_group(request.group_id)
        if group is None or group.is_empty():
            return fail(E.UNKNOWN_MEMBER_ID)
        if group.state is S.DEAD:
            return fail(E.COORDINATOR_NOT_AVAILABLE)
        member_id = request.member_id
        try:
            group.validate_member(member_id, request.group_instance_id)
        except KafkaError as exc:
            return fail(exc.code)
        if request.generation_id != group.generation_id:
            return fail(E.ILLEGAL_GENERATION)
        if _inconsistent(request.protocol_type, group.protocol_type) or _inconsistent(
            request.protocol_name, group.protocol_name
        ):
            return fail(E.INCONSISTENT_GROUP_PROTOCOL)
        if group.state is S.PREPARING_REBALANCE:
            return fail(E.REBALANCE_IN_PROGRESS)

        member = group.member(member_id)
        if group.state is S.STABLE:
            self._remove_pending_sync_member(group, member_id)
            deferred.complete(M.SyncGroupResponse(
                error_code=E.NONE, protocol_type=group.protocol_type, protocol_name=group.protocol_name,
                assignment=member.assignment,
            ))
            return _effects()

        # CompletingRebalance: park until the leader's assignment is stored.
        member.sync_deferred = deferred
        self._remove_pending_sync_member(group, member_id)
        if not group.is_leader(member_id):
            return _effects()
        assignment = {a.member_id: bytes(a.assignment) for a in request.assignments}
        for other in group.members:
            assignment.setdefault(other, EMPTY_ASSIGNMENT)  # members the leader left out get nothing
        generation = request.generation_id

        def store() -> None:
            # Another operation may have moved the group on while the record was written.
            if group.state is S.COMPLETING_REBALANCE and group.generation_id == generation:
                for m in group.members.values():
                    m.assignment = assignment.get(m.member_id, EMPTY_ASSIGNMENT)
                self._propagate_assignment(group, E.NONE)
                group.transition_to(S.STABLE, now)
                log.info("group is stable", group_id=group.group_id, generation=group.generation_id)

        return _effects([_group_snapshot(group, assignment)], on_durable=store)

    def _remove_pending_sync_member(self, group: ClassicGroup, member_id: str) -> None:
        group.pending_sync_members.discard(member_id)
        if group.in_state(S.DEAD, S.EMPTY, S.PREPARING_REBALANCE) or group.has_received_sync_from_all_members():
            self.timer.cancel(sync_key(group.group_id))

    # ----- Heartbeat ----------------------------------------------------------------------
    def heartbeat(self, request: Any, now: int) -> Result:
        """Answered at once, as Kafka does: a member learns of a rebalance at its next heartbeat.
        With group.heartbeat.hold.ms on, a member of a stable group has its heartbeat held: the
        response leaves as soon as the group starts rebalancing or the member is removed
        (ClassicGroup answers it), when another request arrives on the connection (the API handler
        asks), or after the hold: the answer a heartbeat arriving then would get. It takes a third
        of the session timeout at most, well within the clients' request timeouts."""
        code = self._heartbeat(request)
        group = self.classic_group(request.group_id)
        if code is not E.NONE or group is None or group.state is not S.STABLE:
            return CoordinatorResult(response=M.HeartbeatResponse(error_code=code), replay=False)
        member = group.member(request.member_id)
        hold_ms = self.config.classic_hold_ms(member.session_timeout_ms)
        if hold_ms <= 0:
            return CoordinatorResult(response=M.HeartbeatResponse(error_code=code), replay=False)
        group.release_heartbeat(member, E.NONE)  # one in flight per member; answer an older one anyway
        member.heartbeat_deferred = Deferred()
        group_id, member_id = group.group_id, member.member_id
        self.timer.schedule(hold_key(group_id, member_id), hold_ms,
                            lambda shard, now_: shard.classic.release_heartbeat(group_id, member_id))
        return CoordinatorResult(response=member.heartbeat_deferred, replay=False)

    def release_heartbeat(self, group_id: str, member_id: str) -> Result:
        """Answer a held heartbeat now (its group is stable: otherwise it was answered already)."""
        self.timer.cancel(hold_key(group_id, member_id))
        group = self.classic_group(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is not None and member is not None and group.release_heartbeat(member, E.NONE):
            self.reschedule_heartbeat(group, member)
        return _effects()

    def _heartbeat(self, request: Any) -> ErrorCode:
        if not request.group_id:
            return E.INVALID_GROUP_ID
        group = self.classic_group(request.group_id)
        if group is None:
            return E.UNKNOWN_MEMBER_ID
        if group.state is S.DEAD:
            return E.COORDINATOR_NOT_AVAILABLE
        try:
            group.validate_member(request.member_id, request.group_instance_id)
        except KafkaError as exc:
            return exc.code
        if request.generation_id != group.generation_id:
            return E.ILLEGAL_GENERATION
        if group.state is S.EMPTY:
            return E.UNKNOWN_MEMBER_ID
        self.reschedule_heartbeat(group, group.member(request.member_id))
        if group.state is S.PREPARING_REBALANCE:
            return E.REBALANCE_IN_PROGRESS
        return E.NONE

    # ----- LeaveGroup ---------------------------------------------------------------------
    def leave_group(self, group_id: str, identities: list[Any], now: int) -> Result:
        """identities: LeaveGroupRequest.MemberIdentity (v3+; the API layer wraps the v0-2
        member id in one). The response is a LeaveGroupResponse with one entry per identity."""
        if not group_id:
            return CoordinatorResult(response=M.LeaveGroupResponse(error_code=E.INVALID_GROUP_ID), replay=False)
        group = self.classic_group(group_id)
        if group is None:
            return CoordinatorResult(response=M.LeaveGroupResponse(members=[
                M.LeaveGroupResponse.MemberResponse(member_id=i.member_id, group_instance_id=i.group_instance_id,
                                                    error_code=E.UNKNOWN_MEMBER_ID)
                for i in identities
            ]), replay=False)
        if group.state is S.DEAD:
            return CoordinatorResult(response=M.LeaveGroupResponse(error_code=E.COORDINATOR_NOT_AVAILABLE),
                                     replay=False)

        responses = []
        left = 0
        for identity in identities:
            code = self._leave_one(group, identity.member_id, identity.group_instance_id)
            responses.append(M.LeaveGroupResponse.MemberResponse(
                member_id=identity.member_id, group_instance_id=identity.group_instance_id, error_code=code,
            ))
            left += code is E.NONE
        result = _effects()
        if left:
            if group.in_state(S.STABLE, S.COMPLETING_REBALANCE):
                result = self._maybe_prepare_rebalance_or_complete_join(group, now)
            elif group.state is S.PREPARING_REBALANCE:
                result = self._maybe_complete_join_phase(group, now)
        result.response = M.LeaveGroupResponse(members=responses)
        return result

    def _leave_one(self, group: ClassicGroup, member_id: str, instance_id: str | None) -> ErrorCode:
        if member_id == "":
            # Administrative removal of a static member by its group.instance.id.
            existing = group.static_member_id(instance_id)
            if existing is None:
                return E.UNKNOWN_MEMBER_ID
            self._remove_current_member(group, existing)
            return E.NONE
        if group.is_pending_member(member_id):
            group.remove(member_id)
            self.timer.cancel(heartbeat_key(group.group_id, member_id))
            return E.NONE
        try:
            group.validate_member(member_id, instance_id)
        except KafkaError as exc:
            return exc.code
        self._remove_current_member(group, member_id)
        return E.NONE

    def _remove_current_member(self, group: ClassicGroup, member_id: str) -> None:
        member = group.member(member_id)
        self.timer.cancel(heartbeat_key(group.group_id, member_id))
        group.complete_join(member, _join_error(E.UNKNOWN_MEMBER_ID))
        group.remove(member_id)

    # ----- loading ------------------------------------------------------------------------
    def on_loaded(self, now: int) -> None:
        for group in list(self.groups.values()):
            if not isinstance(group, ClassicGroup):
                continue
            for member in group.members.values():
                self.reschedule_heartbeat(group, member)
            if len(group.members) > self.config.max_size:
                # group.max.size was lowered: rebalance so the members can commit and some leave.
                self._prepare_rebalance(group, now)

    def on_unloaded(self) -> None:
        """Answer every parked request NOT_COORDINATOR: the client will find the coordinator again."""
        for group in self.groups.values():
            if not isinstance(group, ClassicGroup):
                continue
            previous = group.state
            group.release_heartbeats(E.NOT_COORDINATOR)
            group.transition_to(S.DEAD, group.current_state_timestamp or 0)
            for member in list(group.members.values()):
                if previous is S.PREPARING_REBALANCE:
                    group.complete_join(member, _join_error(E.NOT_COORDINATOR, member.member_id))
                elif previous in (S.COMPLETING_REBALANCE, S.STABLE):
                    group.complete_sync(member, M.SyncGroupResponse(error_code=E.NOT_COORDINATOR))

    # ----- DescribeGroups / ListGroups ----------------------------------------------------
    def describe_groups(self, group_ids: list[str], api_version: int) -> list[Any]:
        described = []
        for group_id in group_ids:
            group = self.classic_group(group_id)
            if group is None:
                if api_version >= 6:
                    # Kafka 4.x: consumer, share and streams groups are "not a classic group" (v6 says so)
                    other = self.groups.get(group_id)
                    message = ("Group %s is not a classic group." if other is not None else "Group %s not found.")
                    described.append(M.DescribeGroupsResponse.DescribedGroup(
                        group_id=group_id, group_state=S.DEAD.value, error_code=E.GROUP_ID_NOT_FOUND,
                        error_message=message % group_id,
                    ))
                else:
                    described.append(M.DescribeGroupsResponse.DescribedGroup(group_id=group_id,
                                                                             group_state=S.DEAD.value))
            else:
                described.append(group.describe())
        return described

    def list_groups(self, states_filter: list[str], types_filter: list[str]) -> list[Any]:
        states = {s.strip().lower() for s in states_filter}
        types = {t.strip().lower() for t in types_filter}
        out = []
        for group in self.groups.values():
            if states and group.state.value.lower() not in states:
                continue
            if types and group.type not in types:
                continue
            out.append(group.listed())
        return out


def _inconsistent(requested: str | None, current: str | None) -> bool:
    return requested is not None and current is not None and requested != current
