"""Held ConsumerGroupHeartbeats: only when a user turns them on (group.heartbeat.hold.ms).

By default every heartbeat is answered at once, as Kafka answers it, and a member waiting for
something gets a shorter HeartbeatIntervalMs (heartbeat_interval.py). With
`group.heartbeat.hold.ms` set (> 0: at most that long; -1: as long as the clients allow), two
kinds of heartbeat are held instead:

- a member waiting in UNRELEASED_PARTITIONS, or for a target assignment a timer is about to
  compute: for at most `wait_ms`;
- a member that is STABLE and gets no new assignment: for at most `steady_ms`.

A held heartbeat is answered as soon as the member's state changes (records were written for its
group, or its topics changed), when another request arrives on its connection (the API handler
registers `GroupCoordinator.release_heartbeat` with the server), or at its deadline: the response
is exactly what the member would get by heartbeating again at that moment. librdkafka times a
heartbeat out after the interval it was last given, so every hold stays below that interval
(`hold_cap`), per member; one released early by another request asks the member back within
`QUICK_INTERVAL_MS`. A heartbeat carrying a change from the client (a join, a new subscription,
another rebalance timeout, assignor or rack, an owned-partitions list other than what the
coordinator has: `carries_change`) is answered at once.

The trap: librdkafka keeps one heartbeat in flight per member, so while one is held, its next
heartbeat (a new subscription, an acknowledged revocation, a leave) cannot even be sent: it
waits for the hold. A member waiting for partitions is held until they are free, but the others
hear of a join, a subscription change or a commit's revocation only when their own hold ends.

Timer keys: "unreleased-wait-<group>-<member>" (the deadline), "unreleased-wake-<group>-<member>"
(a re-check after the group changed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from broker.coordinator.group.consumer import ConsumerGroup
from broker.coordinator.group.heartbeat_interval import QUICK_INTERVAL_MS
from broker.coordinator.group.held import HeldBook
from broker.coordinator.group.member import Assignment, ConsumerGroupMember, MemberState, assignment_of, union
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.records import CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT, parse_record
from broker.coordinator.result import CoordinatorResult, Deferred, Record
from broker.coordinator.timer import Timer
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

REQ = M.ConsumerGroupHeartbeatRequest
Result = CoordinatorResult[Any]


def hold_cap(interval_ms: int) -> int:
    """The longest hold of a heartbeat whose client was last given `interval_ms` (librdkafka's
    timeout of the request): 1 s less, half of it under 2 s."""
    return max(0, interval_ms - min(1000, interval_ms // 2))


def carries_change(request: Any, before: ConsumerGroupMember) -> bool:
    """Whether a ConsumerGroupHeartbeat brings the coordinator something the client waits to hear
    back about; `before`: the member as the coordinator had it (a fresh one for a new member).
    Fields the clients send only when they changed count when present; InstanceId (the Java
    client sends it every time) and the owned partitions (acknowledging what the coordinator
    assigned is nothing new) count when they differ."""
    if request.member_epoch <= 0:
        return True  # joining, rejoining after a fence, or leaving
    if request.subscribed_topic_names is not None or request.subscribed_topic_regex is not None:
        return True  # a subscription set anew (even to the same topics: the client waits for it)
    if request.rebalance_timeout_ms != -1 or request.server_assignor is not None or request.rack_id is not None:
        return True
    if request.instance_id is not None and request.instance_id != before.instance_id:
        return True
    if request.topic_partitions is not None:
        owned = assignment_of((tp.topic_id, tp.partitions) for tp in request.topic_partitions)
        return owned != union(before.assigned, before.pending_revocation)  # partitions revoked (or an owned list the coordinator does not know)
    return False


def wait_key(group_id: str, member_id: str) -> str:
    return "unreleased-wait-%s-%s" % (group_id, member_id)


def wake_key(group_id: str, member_id: str) -> str:
    return "unreleased-wake-%s-%s" % (group_id, member_id)


@dataclasses.dataclass
class Waiting:
    request: Any  # the heartbeat held back
    info: RequestInfo
    deferred: Deferred[Any]
    assigned: Assignment  # what the client was told it owns, before this heartbeat
    with_assignment: bool  # its response carries the assignment in any case (a join, a full request)


class ConsumerGroupManager(Protocol):
    """What a held heartbeat needs of the consumer-group manager (consumer_heartbeat.py), which
    owns the book: its timer, its groups, and the heartbeat handler that looks at it again."""

    timer: Timer

    def consumer_group(self, group_id: str) -> ConsumerGroup | None: ...

    def assignment_pending(self, group_id: str) -> bool: ...

    def heartbeat(self, request: Any, info: RequestInfo, now: int, may_wait: bool = True) -> Result: ...

    def answered(self, group_id: str, member_id: str, response: Any, now: int) -> None: ...


class HeldHeartbeats(HeldBook[Waiting]):
    owner = "consumer"

    def __init__(self, manager: ConsumerGroupManager, wait_ms: int, steady_ms: int, interval_ms: int) -> None:
        super().__init__(manager.timer)
        self.m = manager
        self.wait_ms = wait_ms
        self.steady_ms = steady_ms
        self.interval_ms = interval_ms  # group.consumer.heartbeat.interval.ms
        self.quick_ms = min(QUICK_INTERVAL_MS, interval_ms)

    def hold_key(self, group_id: str, member_id: str) -> str:
        return wait_key(group_id, member_id)

    def wake_key(self, group_id: str, member_id: str) -> str:
        return wake_key(group_id, member_id)

    def gone_response(self, group_id: str, member_id: str, code: ErrorCode) -> Any:
        return M.ConsumerGroupHeartbeatResponse(error_code=code)

    def answered(self, group_id: str, member_id: str, response: Any) -> None:
        """The member is given `response`: remember the interval it times its next request with."""
        interval = response.heartbeat_interval_ms
        if interval == self.interval_ms or interval <= 0:
            self.told.pop((group_id, member_id), None)
        else:
            self.told[(group_id, member_id)] = interval

    def hold_ms(self, group_id: str, member: ConsumerGroupMember, request: Any, news: bool) -> int:
        """How long the heartbeat of a consumer-protocol member may be held (0: not at all): one
        waiting for partitions another member owns, or for a target assignment a timer is about
        to compute; or a stable one with no news (`news`: its response carries an assignment)."""
        if member.classic is not None or request.member_epoch < 0:
            return 0
        cap = hold_cap(self.told.get((group_id, member.member_id), self.interval_ms))
        if member.state is MemberState.UNRELEASED_PARTITIONS or self.m.assignment_pending(group_id):
            return min(self.wait_ms, cap)
        if member.state is MemberState.STABLE and not news:
            return min(self.steady_ms, cap)
        return 0

    def hold(self, group_id: str, member: ConsumerGroupMember, request: Any, info: RequestInfo,
             assigned_before: Assignment, response: Any, hold_ms: int) -> Deferred[Any]:
        """Hold the member's heartbeat (its response is completed by `wake` or the deadline)."""
        deferred: Deferred[Any] = Deferred()
        self.park(group_id, member.member_id, Waiting(request, info, deferred, assigned_before,
                                                      response.assignment is not None), response, hold_ms)
        return deferred

    def wake(self, group_id: str, member_id: str, now: int, final: bool, early: bool = False) -> Result:
        """Look at a held heartbeat again; `final`: answer it now in any case; `early`: because
        another request waits behind it (the answer then asks the member back soon)."""
        waiting = self.waiting.get(group_id, {}).get(member_id)
        if waiting is None:
            return CoordinatorResult()
        final = self.looked_too_often(group_id, member_id, now) or final
        group = self.m.consumer_group(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            self.release(group_id, member_id)
            waiting.deferred.complete(M.ConsumerGroupHeartbeatResponse(
                error_code=ErrorCode.UNKNOWN_MEMBER_ID, error_message="Member %s is not a member of group %s."
                % (member_id, group_id)))
            return CoordinatorResult()
        # The held heartbeat again, as if it arrived now (the member has kept its epoch meanwhile).
        again = REQ(group_id=group_id, member_id=member_id, member_epoch=member.member_epoch,
                    instance_id=waiting.request.instance_id, topic_partitions=waiting.request.topic_partitions)
        try:
            result = self.m.heartbeat(again, waiting.info, now, may_wait=False)
        except KafkaError as exc:
            self.release(group_id, member_id)
            waiting.deferred.complete(M.ConsumerGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message))
            return CoordinatorResult()
        response: Any = result.response
        updated = self._member_after(member, result.records)
        changed = updated.assigned != waiting.assigned
        if not final and not changed and updated.member_epoch == member.member_epoch \
                and self.hold_ms(group_id, updated, waiting.request, news=False) > 0:
            return CoordinatorResult(records=result.records)  # still waiting
        self.release(group_id, member_id)
        if waiting.with_assignment or changed:
            response.assignment = M.ConsumerGroupHeartbeatResponse.Assignment(topic_partitions=[
                M.ConsumerGroupHeartbeatResponse.TopicPartitions(topic_id=t, partitions=sorted(ps))
                for t, ps in sorted(updated.assigned.items(), key=lambda kv: str(kv[0]))])
        else:
            response.assignment = None
        if early:
            response.heartbeat_interval_ms = min(self.quick_ms, response.heartbeat_interval_ms)
        self.m.answered(group_id, member_id, response, now)
        deferred = waiting.deferred

        def answer() -> None:
            deferred.complete(response)

        return CoordinatorResult(records=result.records, on_durable=answer)

    @staticmethod
    def _member_after(member: ConsumerGroupMember, records: list[Record]) -> ConsumerGroupMember:
        """The member once `records` are replayed (they are replayed after the operation)."""
        out = member
        for key, value in records:
            kind, k, v = parse_record(key, value)
            if kind == CONSUMER_GROUP_CURRENT_MEMBER_ASSIGNMENT and v is not None and k.member_id == member.member_id:
                out = dataclasses.replace(
                    out, member_epoch=v.member_epoch, state=MemberState.from_value(v.state),
                    assigned=assignment_of((tp.topic_id, tp.partitions) for tp in v.assigned_partitions))
        return out
