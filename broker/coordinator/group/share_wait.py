"""Held ShareGroupHeartbeats: only when a user turns them on (group.heartbeat.hold.ms).

By default every ShareGroupHeartbeat is answered at once, as Kafka answers it: when a member
leaves (or a topic grows) the others learn their new assignment at their next heartbeat
(`group.share.heartbeat.interval.ms`, 5 s). With `group.heartbeat.hold.ms` set, the heartbeat of
a member whose assignment does not change is held for at most `hold_cap` of the interval it was
given (librdkafka times the request out after that interval) and answered as soon as the group
changes (a record written for it, its topics changed), when another request arrives on the
member's connection, or at its deadline. The answer is what the member would get by heartbeating
again at that moment; one released early by another request asks the member back soon
(HeartbeatIntervalMs 500 ms). A heartbeat carrying a change from the client (a join, a
subscription, a rack: `carries_change`) is answered at once.

The trap is the one of consumer_wait.py: librdkafka's share consumer keeps one heartbeat in
flight, so a new subscription or a leave waits for the held heartbeat to be answered.

Timer keys: "share-hold-<group>-<member>" (the deadline), "share-wake-<group>-<member>" (a look
after the group changed).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from broker.coordinator.group.consumer_wait import hold_cap
from broker.coordinator.group.heartbeat_interval import QUICK_INTERVAL_MS
from broker.coordinator.group.held import HeldBook
from broker.coordinator.group.member import Assignment
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.share_group import ShareGroup
from broker.coordinator.result import CoordinatorResult, Deferred
from broker.coordinator.timer import Timer
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

HB = M.ShareGroupHeartbeatResponse
REQ = M.ShareGroupHeartbeatRequest
Result = CoordinatorResult[Any]


def hold_key(group_id: str, member_id: str) -> str:
    return "share-hold-%s-%s" % (group_id, member_id)


def wake_key(group_id: str, member_id: str) -> str:
    return "share-wake-%s-%s" % (group_id, member_id)


def carries_change(request: Any) -> bool:
    """Whether a ShareGroupHeartbeat brings something new from the client (its optional fields
    are sent only when they changed, or with a full request after an error)."""
    return request.member_epoch <= 0 or request.subscribed_topic_names is not None or request.rack_id is not None


@dataclasses.dataclass
class Waiting:
    info: RequestInfo
    deferred: Deferred[Any]
    assigned: Assignment  # what the member was last told it has


class ShareGroupManager(Protocol):
    """What a held share heartbeat needs of the share-group manager (share_heartbeat.py), which
    owns the book: its timer, its groups, their session settings and the heartbeat handler."""

    timer: Timer

    def share_group(self, group_id: str) -> ShareGroup | None: ...

    def session_settings(self, group_id: str) -> tuple[int, int]: ...

    def heartbeat(self, request: Any, info: RequestInfo, now: int, may_wait: bool = True) -> Result: ...


class HeldShareHeartbeats(HeldBook[Waiting]):
    owner = "share"

    def __init__(self, manager: ShareGroupManager, hold_limit_ms: int) -> None:
        super().__init__(manager.timer)
        self.m = manager
        self.hold_limit_ms = hold_limit_ms  # group.heartbeat.hold.ms; -1: no limit but the cap

    def hold_key(self, group_id: str, member_id: str) -> str:
        return hold_key(group_id, member_id)

    def wake_key(self, group_id: str, member_id: str) -> str:
        return wake_key(group_id, member_id)

    def gone_response(self, group_id: str, member_id: str, code: ErrorCode) -> Any:
        message = "Member %s is not a member of group %s." % (member_id, group_id)
        return HB(error_code=code, error_message=message if code == ErrorCode.UNKNOWN_MEMBER_ID else None)

    def answered(self, group_id: str, member_id: str, response: Any, interval_ms: int) -> None:
        if response.heartbeat_interval_ms == interval_ms or response.heartbeat_interval_ms <= 0:
            self.told.pop((group_id, member_id), None)
        else:
            self.told[(group_id, member_id)] = response.heartbeat_interval_ms

    def hold_ms(self, group_id: str, member_id: str, request: Any, response: Any, interval_ms: int) -> int:
        """How long a heartbeat may be held: that of a member already in the group whose answer
        carries nothing new, and that brings nothing new (0: answered at once)."""
        if carries_change(request) or response.assignment is not None or response.error_code:
            return 0
        cap = hold_cap(self.told.get((group_id, member_id), interval_ms))
        return cap if self.hold_limit_ms < 0 else min(cap, self.hold_limit_ms)

    def hold(self, group_id: str, member_id: str, info: RequestInfo, assigned: Assignment, response: Any,
             hold_ms: int) -> Deferred[Any]:
        deferred: Deferred[Any] = Deferred()
        self.park(group_id, member_id, Waiting(info, deferred, assigned), response, hold_ms)
        return deferred

    def wake(self, group_id: str, member_id: str, now: int, final: bool, early: bool = False) -> Result:
        """Look at a held heartbeat again; `final`: answer it in any case; `early`: another request
        waits behind it (the answer asks the member back soon)."""
        waiting = self.waiting.get(group_id, {}).get(member_id)
        if waiting is None:
            return CoordinatorResult()
        group = self.m.share_group(group_id)
        member = group.members.get(member_id) if group is not None else None
        if member is None:
            self.member_gone(group_id, member_id)
            return CoordinatorResult()
        final = self.looked_too_often(group_id, member_id, now) or final
        again = REQ(group_id=group_id, member_id=member_id, member_epoch=member.member_epoch, rack_id=None,
                    subscribed_topic_names=None)
        try:
            result = self.m.heartbeat(again, waiting.info, now, may_wait=False)
        except KafkaError as exc:
            self.release(group_id, member_id)
            waiting.deferred.complete(HB(error_code=exc.code, error_message=exc.message))
            return CoordinatorResult()
        response: Any = result.response
        if not final and response.assignment is None:
            return CoordinatorResult(records=result.records)  # nothing new for it yet
        self.release(group_id, member_id)
        if early:
            response.heartbeat_interval_ms = min(QUICK_INTERVAL_MS, response.heartbeat_interval_ms)
        self.answered(group_id, member_id, response, self.m.session_settings(group_id)[1])
        deferred = waiting.deferred

        def answer() -> None:
            deferred.complete(response)

        return CoordinatorResult(records=result.records, on_durable=answer)
