"""Share group membership: ShareGroupHeartbeat, its session timer, ShareGroupDescribe, replay.

Follows Kafka's GroupMetadataManager (share part). A heartbeat (1) creates or updates the member
and bumps the group epoch when its subscription or the subscribed topics changed, (2) computes a
new target assignment with the share assignor when the group epoch is ahead of it, (3) gives the
member its target at once (share groups do not revoke: a partition may be shared) and records the
share-partitions assigned for the first time as initialized (ShareGroupStatePartitionMetadata),
which the service initializes in the share coordinator. Handlers only write records; `replay`
applies them.

A heartbeat with nothing new for its member is held until there is (share_wait.py).

Timer keys: "share-session-timeout-<group>-<member>" (fences a member that stops heartbeating).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import TopicMetadata, metadata_hash
from broker.coordinator.group.member import EMPTY, Assignment, MemberState, partitions_by_topic
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.share_assignor import assign
from broker.coordinator.group.share_group import (
    LEAVE_GROUP_MEMBER_EPOCH,
    ShareGroup,
    ShareGroupMember,
    TopicPartitions,
    current_assignment_record,
    current_assignment_tombstone,
    group_epoch_record,
    member_record,
    member_tombstone,
    replay_share_group_record,
    state_partition_metadata_record,
    target_assignment_epoch_record,
    target_assignment_record,
    target_assignment_tombstone,
)
from broker.coordinator.group.share_wait import HeldShareHeartbeats
from broker.coordinator.result import CoordinatorResult, Record
from broker.coordinator.timer import Timer
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.group")

E = ErrorCode
Result = CoordinatorResult[Any]
HB = M.ShareGroupHeartbeatResponse
METADATA_REFRESH_INTERVAL_MS = 10_000  # how long the subscribed topics' metadata is trusted (Kafka's default)

SessionSettings = Callable[[str], tuple[int, int]]
"""group id -> (share.session.timeout.ms, share.heartbeat.interval.ms), group configs included."""


def session_timeout_key(group_id: str, member_id: str) -> str:
    return "share-session-timeout-%s-%s" % (group_id, member_id)


def _invalid(message: str) -> KafkaError:
    return KafkaError(E.INVALID_REQUEST, message)


def validate_heartbeat_request(request: Any) -> None:
    """Kafka's checks before a share heartbeat reaches its group (GroupCoordinatorService)."""
    for value, what in ((request.member_id, "MemberId"), (request.group_id, "GroupId"), (request.rack_id, "RackId")):
        if value is not None and not value.strip():
            raise _invalid("%s can't be empty." % what)
    if request.member_epoch == 0:
        if not request.subscribed_topic_names:
            raise _invalid("SubscribedTopicNames must be set in first request.")
    elif request.member_epoch < LEAVE_GROUP_MEMBER_EPOCH:
        raise _invalid("MemberEpoch is invalid.")


def _response_assignment(assignment: Assignment) -> Any:
    return HB.Assignment(topic_partitions=[HB.TopicPartitions(topic_id=t, partitions=ps)
                                           for t, ps in partitions_by_topic(assignment)])


class ShareGroupManager:
    def __init__(self, groups: dict[str, Any], timer: Timer, config: GroupCoordinatorConfig, metadata: TopicMetadata,
                 session_settings: SessionSettings | None = None) -> None:
        self.groups = groups  # one namespace of group ids with classic and consumer groups
        self.timer = timer
        self.config = config
        self.metadata = metadata
        self.session_settings = session_settings or (
            lambda group_id: (config.share_session_timeout_ms, config.share_heartbeat_interval_ms))
        self.waits = HeldShareHeartbeats(self, config.heartbeat_hold_ms)

    def share_group(self, group_id: str) -> ShareGroup | None:
        group = self.groups.get(group_id)
        return group if isinstance(group, ShareGroup) else None

    def _group_or_raise(self, group_id: str) -> ShareGroup:
        group = self.groups.get(group_id)
        if group is None:
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Group %s not found." % group_id)
        if not isinstance(group, ShareGroup):
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Group %s is not a share group." % group_id)
        return group

    # ----- ShareGroupHeartbeat ------------------------------------------------------------
    def heartbeat(self, request: Any, info: RequestInfo, now: int, may_wait: bool = True) -> Result:
        """may_wait: a heartbeat with nothing new may be held (not when share_wait looks again)."""
        if request.member_epoch == LEAVE_GROUP_MEMBER_EPOCH:
            return self._leave(request, now)
        records: list[Record] = []
        group_id, member_id = request.group_id, request.member_id
        joining = request.member_epoch == 0
        group = self.groups.get(group_id)
        if group is None:
            if not joining:
                raise KafkaError(E.GROUP_ID_NOT_FOUND, "Share group %s not found." % group_id)
            group = ShareGroup(group_id)  # materialised when its records are replayed
        elif not isinstance(group, ShareGroup):
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Group %s is not a share group." % group_id)
        member = group.members.get(member_id)
        if member is None:
            if not joining:
                raise KafkaError(E.UNKNOWN_MEMBER_ID, "Member %s is not a member of group %s." % (member_id, group_id))
            if len(group.members) >= self.config.share_max_size:
                raise KafkaError(E.GROUP_MAX_SIZE_REACHED, "The share group has reached its maximum capacity of "
                                 "%d members." % self.config.share_max_size)
            member = ShareGroupMember(member_id)
            log.info("member joins the share group", group_id=group_id, member_id=member_id)
        else:
            self._validate_member_epoch(member, request.member_epoch)

        # 1. The member's metadata; null request fields keep their value.
        updated = dataclasses.replace(
            member,
            rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
            subscribed_topic_names=(frozenset(request.subscribed_topic_names)
                                    if request.subscribed_topic_names is not None else member.subscribed_topic_names),
            client_id=info.client_id, client_host=info.client_host,
        )
        new_member = member_id not in group.members
        if new_member or not updated.same_metadata(member):
            records.append(member_record(group_id, updated))
        bump = group.group_epoch == 0 or updated.subscribed_topic_names != member.subscribed_topic_names or new_member
        members_after = {**group.members, member_id: updated}
        group_epoch = group.group_epoch
        if bump or group.has_metadata_expired(now):
            group_epoch = self._update_metadata(group, members_after.values(), bump, records, now)

        # 2. The target assignment, when the group epoch moved past it.
        if group_epoch > group.assignment_epoch:
            target = self._update_target_assignment(group, group_epoch, members_after, records)
            target_epoch, target_of_member = group_epoch, target.get(member_id, EMPTY)
        else:
            target_epoch = group.assignment_epoch
            target_of_member = group.target_assignment.get(member_id, EMPTY)

        # 3. The member takes its target at once.
        if updated.member_epoch != target_epoch or updated.assigned != target_of_member or new_member:
            updated = dataclasses.replace(updated, member_epoch=target_epoch, previous_member_epoch=updated.member_epoch,
                                          state=MemberState.STABLE, assigned=target_of_member)
            records.append(current_assignment_record(group_id, updated))
        self._maybe_initialize(group, target_of_member, records)
        session_timeout, interval = self.session_settings(group_id)
        self._schedule_session_timeout(group_id, member_id, session_timeout)

        response = HB(member_id=member_id, member_epoch=updated.member_epoch, heartbeat_interval_ms=interval)
        if joining or updated.assigned != member.assigned:
            response.assignment = _response_assignment(updated.assigned)
        if records:
            self.waits.group_changed(group_id, except_member=member_id)
        if not may_wait:
            return CoordinatorResult(records=records, response=response)
        hold_ms = 0 if records else self.waits.hold_ms(group_id, member_id, request, response, interval)
        if hold_ms > 0:
            held = self.waits.hold(group_id, member_id, info, updated.assigned, response, hold_ms)
            return CoordinatorResult(records=records, response=held)
        self.waits.answered(group_id, member_id, response, interval)
        return CoordinatorResult(records=records, response=response)

    @staticmethod
    def _validate_member_epoch(member: ShareGroupMember, received: int) -> None:
        if received == 0:
            return  # (re)joining
        if received > member.member_epoch or (received < member.member_epoch
                                               and received != member.previous_member_epoch):
            raise KafkaError(E.FENCED_MEMBER_EPOCH, "The share group member has a different member epoch (%d) than "
                             "the one known by the group coordinator (%d). The member must abandon all its partitions "
                             "and rejoin." % (received, member.member_epoch))

    def _topics_of(self, member: ShareGroupMember) -> dict[uuid.UUID, int]:
        out = {}
        for name in member.subscribed_topic_names:
            info = self.metadata.topic(name)
            if info is not None:
                out[info.topic_id] = info.partitions
        return out

    def _update_metadata(self, group: ShareGroup, members: Iterable[ShareGroupMember], bump: bool,
                         records: list[Record], now: int) -> int:
        new_hash = metadata_hash(group.subscribed_topic_names(members), self.metadata)
        epoch = group.group_epoch
        if bump or new_hash != group.metadata_hash:
            epoch += 1
            records.append(group_epoch_record(group.group_id, epoch, new_hash))
            log.info("bumped the share group epoch", group_id=group.group_id, epoch=epoch)
        group.metadata_refresh_deadline = (now + METADATA_REFRESH_INTERVAL_MS, epoch)
        return epoch

    def _update_target_assignment(self, group: ShareGroup, epoch: int, members: dict[str, ShareGroupMember],
                                  records: list[Record]) -> dict[str, Assignment]:
        counts: dict[uuid.UUID, int] = {}
        subscriptions = {}
        for member_id, m in members.items():
            topics = self._topics_of(m)
            counts.update(topics)
            subscriptions[member_id] = frozenset(topics)
        target = assign(subscriptions, counts, {m: group.target_assignment.get(m, EMPTY) for m in members})
        for member_id in members:
            new = target.get(member_id, EMPTY)
            if new != group.target_assignment.get(member_id):
                records.append(target_assignment_record(group.group_id, member_id, new))
        records.append(target_assignment_epoch_record(group.group_id, epoch))
        log.info("computed a new share group target assignment", group_id=group.group_id, epoch=epoch,
                 members=len(members))
        return target

    def _maybe_initialize(self, group: ShareGroup, assignment: Assignment, records: list[Record]) -> None:
        """Record share-partitions assigned for the first time as initialized (their state is
        created by the share-partition engine when first fetched, or by the service now)."""
        added: TopicPartitions = {}
        for topic_id, partitions in assignment.items():
            known = group.initialized.get(topic_id)
            new = partitions - (known[1] if known else frozenset())
            if new:
                info = self.metadata.topic_by_id(topic_id)
                if info is not None:
                    added[topic_id] = (info.name, (known[1] if known else frozenset()) | new)
        if added:
            records.append(state_partition_metadata_record(group.group_id, group.initializing,
                                                           {**group.initialized, **added}, group.deleting))

    # ----- leaving and fencing ------------------------------------------------------------
    def _leave(self, request: Any, now: int) -> Result:
        group = self._group_or_raise(request.group_id)
        member = group.member_or_raise(request.member_id)
        log.info("member left the share group", group_id=group.group_id, member_id=member.member_id)
        return self.fence_members(group, [member], HB(member_id=member.member_id,
                                                      member_epoch=LEAVE_GROUP_MEMBER_EPOCH), now)

    def fence_members(self, group: ShareGroup, members: list[ShareGroupMember], response: Any, now: int) -> Result:
        records: list[Record] = []
        gone = {m.member_id for m in members}
        for member_id in gone:
            records.append(current_assignment_tombstone(group.group_id, member_id))
            records.append(target_assignment_tombstone(group.group_id, member_id))
            records.append(member_tombstone(group.group_id, member_id))
            self.timer.cancel(session_timeout_key(group.group_id, member_id))
            self.waits.member_gone(group.group_id, member_id)
        remaining = [m for m in group.members.values() if m.member_id not in gone]
        self.waits.group_changed(group.group_id)  # the others take over its partitions
        epoch = group.group_epoch + 1
        records.append(group_epoch_record(group.group_id, epoch,
                                          metadata_hash(group.subscribed_topic_names(remaining), self.metadata)))
        return CoordinatorResult(records=records, response=response)

    def fence_member(self, group_id: str, member_id: str, reason: str, now: int) -> Result:
        group = self.share_group(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return CoordinatorResult()
        log.info("member fenced from the share group", group_id=group_id, member_id=member_id, reason=reason)
        return self.fence_members(group, [member], None, now)

    def _schedule_session_timeout(self, group_id: str, member_id: str, timeout_ms: int) -> None:
        self.timer.schedule(session_timeout_key(group_id, member_id), timeout_ms,
                            lambda shard, now: shard.share.fence_member(group_id, member_id,
                                                                        "the member session expired", now))

    def cancel_group_timers(self, group: ShareGroup) -> None:
        for member_id in group.members:
            self.timer.cancel(session_timeout_key(group.group_id, member_id))

    # ----- ShareGroupDescribe -------------------------------------------------------------
    def describe(self, group_ids: list[str]) -> list[Any]:
        out = []
        for group_id in group_ids:
            try:
                out.append(self._group_or_raise(group_id).describe(self.metadata))
            except KafkaError as exc:
                out.append(M.ShareGroupDescribeResponse.DescribedGroup(
                    group_id=group_id, error_code=exc.code, error_message=exc.message))
        return out

    # ----- topics changing ----------------------------------------------------------------
    def on_metadata_change(self, touched: set[str]) -> None:
        for group in self.groups.values():
            if isinstance(group, ShareGroup) and touched & group.subscribed_topic_names():
                group.request_metadata_refresh()
                self.waits.group_changed(group.group_id)  # held members look again

    # ----- loading and replay -------------------------------------------------------------
    def on_loaded(self, now: int) -> None:
        for group in self.groups.values():
            if isinstance(group, ShareGroup):
                session_timeout, _ = self.session_settings(group.group_id)
                for member_id in group.members:
                    self._schedule_session_timeout(group.group_id, member_id, session_timeout)

    def replay(self, record_type: int, key: Any, value: Any) -> None:
        replay_share_group_record(self.groups, record_type, key, value)
