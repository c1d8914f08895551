"""The KIP-848 consumer group protocol: ConsumerGroupHeartbeat, its timers, ConsumerGroupDescribe
and the replay of the consumer group records.

Follows Kafka's GroupMetadataManager (consumer part). A heartbeat (1) creates or updates the
member and bumps the group epoch when its subscription or the subscribed topics' metadata
changed, (2) computes a new target assignment when the group epoch is ahead of the assignment
epoch, (3) reconciles the member towards its target (reconciliation.py). Handlers only write
records; `replay` applies them (for fresh records and at load alike). Timers, in-memory
deadlines and, when a user turns holds on, held responses (consumer_wait.py) are the only other
effects. Every answer says when to come back (heartbeat_interval.py).

Timer keys: "session-timeout-<group>-<member>" (fences a member that stops heartbeating),
"rebalance-timeout-<group>-<member>" (fences a member that does not revoke in time),
"regex-refresh-<group>" (resolves the group's regular expressions), "assignment-<group>"
(a target assignment delayed by group.consumer.assignment.interval.ms), "initial-assignment-<group>"
(the first target assignment of a group that was empty, delayed to let other members join).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from broker.coordinator.group.assignors import MemberSpec, PartitionAssignor, assignors_from_names
from broker.coordinator.group.classic import ClassicGroup
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import (
    LEAVE_GROUP_MEMBER_EPOCH,
    LEAVE_GROUP_STATIC_MEMBER_EPOCH,
    ConsumerGroup,
    RegexUpdate,
    ResolvedRegex,
    TopicMetadata,
    is_regex,
    metadata_hash,
    replay_consumer_group_record,
)
from broker.coordinator.group.consumer_classic import ClassicMembers, new_member_id
from broker.coordinator.group.consumer_wait import HeldHeartbeats, carries_change
from broker.coordinator.group.heartbeat_interval import Heard, next_heartbeat_ms
from broker.coordinator.group.member import (
    EMPTY,
    Assignment,
    ConsumerGroupMember,
    MemberState,
    assignment_of,
    is_subset,
    partitions_by_topic,
)
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.reconciliation import reconcile
from broker.coordinator.group.records import (
    consumer_group_epoch_record,
    consumer_group_member_record,
    consumer_group_member_tombstone,
    consumer_group_partition_metadata_tombstone,
    current_assignment_tombstone,
    group_metadata_tombstone,
    regular_expression_record,
    regular_expression_tombstone,
    target_assignment_epoch_record,
    target_assignment_record,
    target_assignment_tombstone,
)
from broker.coordinator.regex import RegexError, compile_re2
from broker.coordinator.result import CoordinatorResult, Record
from broker.coordinator.timer import Timer
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.group")

E = ErrorCode
Result = CoordinatorResult[Any]
HB = M.ConsumerGroupHeartbeatResponse

CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION = 1
REGEX_BATCH_REFRESH_MIN_INTERVAL_MS = 10_000  # Kafka's floor between two refreshes of a group's regexes
NO_DEADLINE = 2**63 - 1


def session_timeout_key(group_id: str, member_id: str) -> str:
    return "session-timeout-%s-%s" % (group_id, member_id)


def rebalance_timeout_key(group_id: str, member_id: str) -> str:
    return "rebalance-timeout-%s-%s" % (group_id, member_id)


def regex_key(group_id: str) -> str:
    return "regex-refresh-%s" % group_id


def assignment_key(group_id: str) -> str:
    return "assignment-%s" % group_id


def initial_assignment_key(group_id: str) -> str:
    return "initial-assignment-%s" % group_id


def _invalid(message: str) -> KafkaError:
    return KafkaError(E.INVALID_REQUEST, message)


def _blank(value: str | None) -> bool:
    return value is not None and not value.strip()


def validate_heartbeat_request(request: Any, api_version: int, assignors: Iterable[str]) -> None:
    """The checks Kafka applies before a heartbeat reaches its group (GroupCoordinatorService)."""
    epoch = request.member_epoch
    if (api_version >= CONSUMER_GENERATED_MEMBER_ID_REQUIRED_VERSION or epoch > 0
            or epoch == LEAVE_GROUP_MEMBER_EPOCH) and _blank(request.member_id):
        raise _invalid("MemberId can't be empty.")
    if _blank(request.group_id):
        raise _invalid("GroupId can't be empty.")
    if _blank(request.instance_id):
        raise _invalid("InstanceId can't be empty.")
    if _blank(request.rack_id):
        raise _invalid("RackId can't be empty.")
    if epoch == 0:
        if request.rebalance_timeout_ms == -1:
            raise _invalid("RebalanceTimeoutMs must be provided in first request.")
        if request.topic_partitions is None or request.topic_partitions:
            raise _invalid("TopicPartitions must be empty when (re-)joining.")
        if request.subscribed_topic_names is None and request.subscribed_topic_regex is None:
            raise _invalid("Either SubscribedTopicNames or SubscribedTopicRegex must be non-null when (re-)joining.")
    elif epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        if request.instance_id is None:
            raise _invalid("InstanceId can't be null.")
    elif epoch < LEAVE_GROUP_STATIC_MEMBER_EPOCH:
        raise _invalid("MemberEpoch is invalid.")
    names = list(assignors)
    if request.server_assignor is not None and request.server_assignor not in names:
        raise KafkaError(E.UNSUPPORTED_ASSIGNOR, "ServerAssignor %s is not supported. Supported assignors: %s."
                         % (request.server_assignor, ", ".join(names)))


def compile_regex(regex: str) -> Any:
    try:
        return compile_re2(regex)
    except RegexError as exc:
        raise KafkaError(E.INVALID_REGULAR_EXPRESSION,
                         "SubscribedTopicRegex `%s` is not a valid regular expression: %s." % (regex, exc)) from None


def _response_assignment(assignment: Assignment) -> Any:
    return HB.Assignment(topic_partitions=[HB.TopicPartitions(topic_id=t, partitions=ps)
                                           for t, ps in partitions_by_topic(assignment)])


class ConsumerGroupManager:
    def __init__(self, groups: dict[str, Any], timer: Timer, config: GroupCoordinatorConfig,
                 metadata: TopicMetadata) -> None:
        self.groups = groups  # shared with the classic groups: one namespace of group ids
        self.timer = timer
        self.config = config
        self.metadata = metadata
        self.assignors: dict[str, PartitionAssignor] = assignors_from_names(list(config.consumer_assignors))
        self.default_assignor = next(iter(self.assignors))
        self.metadata_version = 0  # bumped by every topic change the coordinator hears of
        self.last_version_with_new_topics = 0
        self.classic_members: ClassicMembers | None = None  # set by the shard: classic members, migration
        self.waits = HeldHeartbeats(self, config.unreleased_wait_ms, config.steady_hold_ms,
                                    config.consumer_heartbeat_interval_ms)
        # group id -> member id -> the last answer it got (heartbeat_interval.py; in memory only)
        self.heard: dict[str, dict[str, Heard]] = {}
        # group id -> when the target assignment a timer waits for is computed
        self.assignment_due: dict[str, int] = {}
        # group id -> (session timeout, heartbeat interval): the group's configs over the broker's
        self.session_settings: Callable[[str], tuple[int, int]] = (
            lambda group_id: (config.consumer_session_timeout_ms, config.consumer_heartbeat_interval_ms))

    def consumer_group(self, group_id: str) -> ConsumerGroup | None:
        group = self.groups.get(group_id)
        return group if isinstance(group, ConsumerGroup) else None

    def _group_or_raise(self, group_id: str) -> ConsumerGroup:
        group = self.groups.get(group_id)
        if group is None:
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Consumer group %s not found." % group_id)
        if not isinstance(group, ConsumerGroup):
            raise KafkaError(E.GROUP_ID_NOT_FOUND, "Group %s is not a consumer group." % group_id)
        return group

    # ----- ConsumerGroupHeartbeat ---------------------------------------------------------
    def heartbeat(self, request: Any, info: RequestInfo, now: int, may_wait: bool = True) -> Result:
        """may_wait: a member left waiting (for partitions another member still owns, or for a
        delayed target assignment) may get its response later (consumer_wait.py)."""
        if request.member_epoch in (LEAVE_GROUP_MEMBER_EPOCH, LEAVE_GROUP_STATIC_MEMBER_EPOCH):
            return self._leave(request, now)
        records: list[Record] = []
        group_id = request.group_id
        joining = request.member_epoch == 0
        group = self._get_or_maybe_create_group(group_id, joining, records)
        member_id = request.member_id or new_member_id()  # v0 members may let the coordinator choose
        if len(group.members) >= self.config.consumer_max_size and member_id not in group.members:
            raise KafkaError(E.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum capacity of %d "
                             "members." % self.config.consumer_max_size)
        owned = None if request.topic_partitions is None else assignment_of(
            (tp.topic_id, tp.partitions) for tp in request.topic_partitions)
        # logged only once nothing refuses the heartbeat (an invalid regex is refused further down)
        new_member = member_id not in group.members if request.instance_id is None else (
            joining and group.static_member(request.instance_id) is None)
        if request.instance_id is None:
            member = self._dynamic_member(group, member_id, request.member_epoch, owned, joining)
        else:
            member = self._static_member(group, member_id, request.member_epoch, request.instance_id, owned, joining,
                                         records)

        # 1. The member's metadata; "null" request fields keep their value.
        updated = dataclasses.replace(
            member,
            instance_id=request.instance_id if request.instance_id is not None else member.instance_id,
            rack_id=request.rack_id if request.rack_id is not None else member.rack_id,
            rebalance_timeout_ms=(request.rebalance_timeout_ms if request.rebalance_timeout_ms != -1
                                  else member.rebalance_timeout_ms),
            server_assignor=request.server_assignor if request.server_assignor is not None else member.server_assignor,
            subscribed_topic_names=(frozenset(request.subscribed_topic_names)
                                    if request.subscribed_topic_names is not None else member.subscribed_topic_names),
            subscribed_topic_regex=(request.subscribed_topic_regex if request.subscribed_topic_regex is not None
                                    else member.subscribed_topic_regex),
            client_id=info.client_id,
            client_host=info.client_host,
            classic=None,
        )
        names_changed = False
        if updated != member:
            records.append(self.member_record(group_id, updated))
            names_changed = updated.subscribed_topic_names != member.subscribed_topic_names
        regex_update = self.maybe_update_regexes(group, member, updated, records, now)
        if new_member:
            log.info("member joins the consumer group", group_id=group_id, member_id=member_id,
                     instance_id=request.instance_id)
        subscription_changed = names_changed or regex_update is not RegexUpdate.NO_CHANGE

        group_epoch = group.group_epoch
        bump = group_epoch == 0 or names_changed or regex_update is RegexUpdate.UPDATED_AND_RESOLVED
        members_after = self.members_after(group, updated)
        if bump or group.has_metadata_expired(now):
            group_epoch = self.update_metadata(group, members_after.values(), bump, records)

        # 2. The target assignment, when the group epoch moved past it.
        delayed = self._maybe_delay_initial_assignment(group, group_epoch, now)
        if group_epoch > group.assignment_epoch and delayed:
            # The first members of the group wait for the others: nothing assigned yet.
            target_epoch, target_of_member = max(1, group.assignment_epoch), EMPTY
        elif group_epoch > group.assignment_epoch and self.may_assign(group, now):
            target = self.update_target_assignment(group, group_epoch, members_after, records, now)
            target_epoch = group_epoch
            target_of_member = target.get(updated.member_id, EMPTY)
        else:
            target_epoch = group.assignment_epoch
            target_of_member = group.target_assignment_of(updated.member_id, updated.instance_id)

        # 3. Reconcile the member towards its target.
        updated = self.maybe_reconcile(group, updated, target_epoch, target_of_member, subscription_changed, owned,
                                        records)
        self.schedule_session_timeout(group_id, updated.member_id)

        # 4. When to come back: the group's interval, or sooner when something is coming.
        interval = next_heartbeat_ms(group, updated, target_of_member, self.heard.get(group_id, {}), now,
                                     self.session_settings(group_id)[1], self._assignment_due(group_id),
                                     self.timer.is_scheduled(regex_key(group_id)))
        response = HB(member_id=updated.member_id, member_epoch=updated.member_epoch, heartbeat_interval_ms=interval)
        full_request = (request.rebalance_timeout_ms != -1 and request.topic_partitions is not None
                        and (request.subscribed_topic_names is not None or request.subscribed_topic_regex is not None))
        if joining or full_request or updated.assigned != member.assigned:
            response.assignment = _response_assignment(updated.assigned)
        if records:
            self.waits.group_changed(group_id, except_member=None if may_wait else updated.member_id)
        # group.heartbeat.hold.ms (off by default): a heartbeat with nothing new may be held.
        hold_ms = self.waits.hold_ms(group_id, updated, request, response.assignment is not None) if may_wait else 0
        if hold_ms > 0 and carries_change(request, member):
            # The client waits to hear back: answered now, and asked back soon to be held then.
            hold_ms = 0
            response.heartbeat_interval_ms = min(response.heartbeat_interval_ms, self.back_soon_ms(group_id))
        if hold_ms > 0:
            held = self.waits.hold(group_id, updated, request, info, member.assigned, response, hold_ms)
            return CoordinatorResult(records=records, response=held)
        if may_wait:
            self.answered(group_id, updated.member_id, response, now)
        return CoordinatorResult(records=records, response=response)

    def answered(self, group_id: str, member_id: str, response: Any, now: int) -> None:
        """The member is given `response` now: when it comes back depends on it."""
        self.heard.setdefault(group_id, {})[member_id] = Heard(now, response.heartbeat_interval_ms)
        self.waits.answered(group_id, member_id, response)

    def _assignment_due(self, group_id: str) -> int | None:
        """When the target assignment a timer waits for is computed (None: none waits)."""
        return self.assignment_due.get(group_id) if self.assignment_pending(group_id) else None

    def _get_or_maybe_create_group(self, group_id: str, create: bool, records: list[Record]) -> ConsumerGroup:
        """The group, or a new one (materialised when its first records are replayed)."""
        group = self.groups.get(group_id)
        if group is None:
            if not create:
                raise KafkaError(E.GROUP_ID_NOT_FOUND, "Consumer group %s not found." % group_id)
            return ConsumerGroup(group_id)
        if isinstance(group, ConsumerGroup):
            return group
        if create and isinstance(group, ClassicGroup):
            if group.is_empty():
                # An empty classic group makes way (its committed offsets stay).
                records.append(group_metadata_tombstone(group_id))
                log.info("converting an empty classic group to a consumer group", group_id=group_id)
                return ConsumerGroup(group_id)
            if self.classic_members is not None:
                return self.classic_members.upgrade(group, records)  # online upgrade
        raise KafkaError(E.GROUP_ID_NOT_FOUND, "Group %s is not a consumer group." % group_id)

    @staticmethod
    def _validate_member_epoch(member: ConsumerGroupMember, received: int, owned: Assignment | None) -> None:
        if received == 0:
            return  # (re)joining
        if received > member.member_epoch:
            raise KafkaError(E.FENCED_MEMBER_EPOCH, "The consumer group member has a greater member epoch (%d) than "
                             "the one known by the group coordinator (%d). The member must abandon all its partitions "
                             "and rejoin." % (received, member.member_epoch))
        if received < member.member_epoch and (received != member.previous_member_epoch
                                                or not is_subset(owned, member.assigned)):
            # The previous epoch with a subset of the assignment is a retry after a lost response.
            raise KafkaError(E.FENCED_MEMBER_EPOCH, "The consumer group member has a smaller member epoch (%d) than "
                             "the one known by the group coordinator (%d). The member must abandon all its partitions "
                             "and rejoin." % (received, member.member_epoch))

    def _dynamic_member(self, group: ConsumerGroup, member_id: str, epoch: int, owned: Assignment | None,
                        joining: bool) -> ConsumerGroupMember:
        member = group.members.get(member_id)
        if member is None:
            if not joining:
                raise KafkaError(E.UNKNOWN_MEMBER_ID, "Member %s is not a member of group %s." % (member_id,
                                                                                                  group.group_id))
            return ConsumerGroupMember(member_id)  # its join is logged once the heartbeat is accepted
        self._validate_member_epoch(member, epoch, owned)
        return member

    def _static_member(self, group: ConsumerGroup, member_id: str, epoch: int, instance_id: str,
                       owned: Assignment | None, joining: bool, records: list[Record]) -> ConsumerGroupMember:
        existing = group.static_member(instance_id)
        if joining:
            if existing is None:  # its join is logged once the heartbeat is accepted
                return group.members.get(member_id) or ConsumerGroupMember(member_id)
            if not existing.uses_classic_protocol and existing.member_epoch != LEAVE_GROUP_STATIC_MEMBER_EPOCH:
                raise KafkaError(E.UNRELEASED_INSTANCE_ID, "Static member %s with instance id %s cannot join the group "
                                 "because the instance id is owned by %s member." % (member_id, instance_id,
                                                                                     existing.member_id))
            # The returning instance takes over the member, its epoch reset, under its new id.
            new = dataclasses.replace(existing, member_id=member_id, member_epoch=0, previous_member_epoch=0)
            self.replace_member(records, group, existing, new)
            log.info("static member rejoins the consumer group", group_id=group.group_id, instance_id=instance_id,
                     member_id=member_id, replaced=existing.member_id)
            return new
        if existing is None:
            raise KafkaError(E.UNKNOWN_MEMBER_ID, "Instance id %s is unknown." % instance_id)
        if existing.member_id != member_id:
            raise KafkaError(E.FENCED_INSTANCE_ID, "Static member %s with instance id %s was fenced by member %s."
                             % (member_id, instance_id, existing.member_id))
        self._validate_member_epoch(existing, epoch, owned)
        return existing

    def replace_member(self, records: list[Record], group: ConsumerGroup, old: ConsumerGroupMember,
                        new: ConsumerGroupMember) -> None:
        g = group.group_id
        self._remove_member_records(records, g, old.member_id)  # its timers expire harmlessly
        self.heard.get(g, {}).pop(old.member_id, None)
        records.append(self.member_record(g, new))
        records.append(target_assignment_record(
            g, new.member_id, partitions_by_topic(group.target_assignment.get(old.member_id, EMPTY))))
        records.append(new.current_assignment_record(g))

    @staticmethod
    def _remove_member_records(records: list[Record], group_id: str, member_id: str) -> None:
        # The order matters for replay: assignment, then target, then the member itself.
        records.append(current_assignment_tombstone(group_id, member_id))
        records.append(target_assignment_tombstone(group_id, member_id))
        records.append(consumer_group_member_tombstone(group_id, member_id))

    @staticmethod
    def member_record(group_id: str, m: ConsumerGroupMember) -> Record:
        return consumer_group_member_record(
            group_id, m.member_id, instance_id=m.instance_id, rack_id=m.rack_id, client_id=m.client_id,
            client_host=m.client_host, subscribed_topic_names=sorted(m.subscribed_topic_names),
            subscribed_topic_regex=m.subscribed_topic_regex, rebalance_timeout_ms=m.rebalance_timeout_ms,
            server_assignor=m.server_assignor, classic=m.classic,
        )

    @staticmethod
    def members_after(group: ConsumerGroup, updated: ConsumerGroupMember) -> dict[str, ConsumerGroupMember]:
        """The members once `updated` is in (replacing the static member it takes over)."""
        members = dict(group.members)
        if updated.instance_id is not None:
            previous = group.static_members.get(updated.instance_id)
            if previous is not None and previous != updated.member_id:
                members.pop(previous, None)
        members[updated.member_id] = updated
        return members

    # ----- metadata and epochs ------------------------------------------------------------
    def update_metadata(self, group: ConsumerGroup, members: Iterable[ConsumerGroupMember], bump: bool,
                         records: list[Record]) -> int:
        """Recompute the metadata hash of the subscribed topics; bump the group epoch when asked
        or when the hash changed. Returns the group epoch."""
        new_hash = metadata_hash(group.subscribed_topic_names(members), self.metadata)
        epoch = group.group_epoch
        if bump or new_hash != group.metadata_hash:
            # A new group with a delayed first assignment starts at epoch 2: its first members
            # settle at epoch 1 with nothing until then (as Kafka's streams groups do).
            epoch = 2 if epoch == 0 and self.config.initial_assignment_delay_ms > 0 else epoch + 1
            records.append(consumer_group_epoch_record(group.group_id, epoch, new_hash))
            log.info("bumped the group epoch", group_id=group.group_id, epoch=epoch)
        group.metadata_refresh_deadline = (NO_DEADLINE, epoch)
        if group.has_partition_metadata_record:
            records.append(consumer_group_partition_metadata_tombstone(group.group_id))
        return epoch

    def _topics_of(self, group: ConsumerGroup, member: ConsumerGroupMember,
                   resolved: Mapping[str, ResolvedRegex] | None = None) -> dict[uuid.UUID, int]:
        """The member's subscribed topics that exist: id -> partition count."""
        out = {}
        for name in group.subscribed_topic_names([member], resolved):
            info = self.metadata.topic(name)
            if info is not None:
                out[info.topic_id] = info.partitions
        return out

    # ----- target assignment --------------------------------------------------------------
    def _maybe_delay_initial_assignment(self, group: ConsumerGroup, group_epoch: int, now: int) -> bool:
        """Whether the group's target assignment waits for its initial delay (starting it when
        the first member joins a group that was empty)."""
        key = initial_assignment_key(group.group_id)
        if self.timer.is_scheduled(key):
            if now < self.assignment_due.get(group.group_id, now):
                return True
            self.timer.cancel(key)  # due: computed by this heartbeat (its timer has not run yet)
            return False
        delay = self.config.initial_assignment_delay_ms
        if delay <= 0 or group.members or group_epoch <= group.assignment_epoch:
            return False
        group_id = group.group_id
        self.timer.schedule(key, delay, lambda shard, now: shard.consumer.delayed_assignment(group_id, now))
        self.assignment_due[group_id] = now + delay
        return True

    def first_assignment_pending(self, group: ConsumerGroup) -> bool:
        """The group's first target assignment waits for its initial delay (or is about to)."""
        return self.timer.is_scheduled(initial_assignment_key(group.group_id)) or (
            not group.members and self.config.initial_assignment_delay_ms > 0)

    def assignment_pending(self, group_id: str) -> bool:
        """A target assignment is about to be computed by a timer."""
        return self.timer.is_scheduled(initial_assignment_key(group_id)) or \
            self.timer.is_scheduled(assignment_key(group_id))

    def back_soon_ms(self, group_id: str) -> int:
        """The interval that asks a member back soon: 500 ms, or the group's initial delay while
        its first assignment waits for it (the member's next heartbeat is then held until it)."""
        if self.timer.is_scheduled(initial_assignment_key(group_id)):
            return max(1, min(self.waits.quick_ms, self.config.initial_assignment_delay_ms))
        return self.waits.quick_ms

    def may_assign(self, group: ConsumerGroup, now: int) -> bool:
        """group.consumer.assignment.interval.ms: a new target assignment at most this often;
        one that must wait is computed by a timer."""
        interval = self.config.consumer_assignment_interval_ms
        if interval <= 0 or group.last_assignment_ms is None or now - group.last_assignment_ms >= interval:
            return True
        group_id = group.group_id
        if not self.timer.is_scheduled(assignment_key(group_id)):
            self.timer.schedule(assignment_key(group_id), group.last_assignment_ms + interval - now,
                                lambda shard, now_: shard.consumer.delayed_assignment(group_id, now_))
            self.assignment_due[group_id] = group.last_assignment_ms + interval
        return False

    def delayed_assignment(self, group_id: str, now: int) -> Result:
        group = self.consumer_group(group_id)
        records: list[Record] = []
        self.assignment_due.pop(group_id, None)
        if group is not None and group.members and group.group_epoch > group.assignment_epoch:
            self.update_target_assignment(group, group.group_epoch, group.members, records, now)
            self.waits.group_changed(group_id)  # members waiting for it look again
        return CoordinatorResult(records=records)

    def update_target_assignment(self, group: ConsumerGroup, epoch: int, members: Mapping[str, ConsumerGroupMember],
                                  records: list[Record], now: int) -> dict[str, Assignment]:
        name = group.preferred_server_assignor(members.values()) or self.default_assignor
        assignor = self.assignors.get(name) or self.assignors[self.default_assignor]
        topics: dict[uuid.UUID, int] = {}
        specs = {}
        for member_id, m in members.items():
            subscribed = self._topics_of(group, m)
            topics.update(subscribed)
            previous = group.target_assignment.get(member_id)
            if previous is None:  # a static member taking over gets the target of the member it replaces
                previous = group.target_assignment_of(member_id, m.instance_id)
            specs[member_id] = MemberSpec(member_id=member_id, subscribed_topic_ids=frozenset(subscribed),
                                          assignment=previous, instance_id=m.instance_id, rack_id=m.rack_id)
        try:
            target = assignor.assign(specs, topics)
        except Exception as exc:
            raise KafkaError(E.UNKNOWN_SERVER_ERROR, "Failed to compute a new target assignment for epoch %d: %s"
                             % (epoch, exc)) from exc
        for member_id in specs:
            new = {t: ps for t, ps in target.get(member_id, EMPTY).items() if ps}
            if new != group.target_assignment.get(member_id):
                records.append(target_assignment_record(group.group_id, member_id, partitions_by_topic(new)))
        records.append(target_assignment_epoch_record(group.group_id, epoch))
        group.last_assignment_ms = now
        self.timer.cancel(assignment_key(group.group_id))
        self.timer.cancel(initial_assignment_key(group.group_id))
        self.assignment_due.pop(group.group_id, None)
        log.info("computed a new target assignment", group_id=group.group_id, epoch=epoch, assignor=assignor.name,
                 members=len(specs))
        return target

    # ----- reconciliation -----------------------------------------------------------------
    def maybe_reconcile(self, group: ConsumerGroup, member: ConsumerGroupMember, target_epoch: int,
                         target: Assignment, subscription_changed: bool, owned: Assignment | None,
                         records: list[Record]) -> ConsumerGroupMember:
        if not subscription_changed and member.is_reconciled_to(target_epoch):
            return member
        nxt = reconcile(member, target_epoch, target, frozenset(self._topics_of(group, member)),
                        group.current_partition_epoch, owned, subscription_changed)
        if nxt != member:
            records.append(nxt.current_assignment_record(group.group_id))
            log.debug("member assignment changed", group_id=group.group_id, member_id=nxt.member_id,
                      epoch=nxt.member_epoch, state=nxt.state.name)
            if not nxt.uses_classic_protocol:
                if nxt.state is MemberState.UNREVOKED_PARTITIONS:
                    self._schedule_rebalance_timeout(group.group_id, nxt.member_id, nxt.member_epoch,
                                                     nxt.rebalance_timeout_ms)
                else:
                    self.timer.cancel(rebalance_timeout_key(group.group_id, nxt.member_id))
        return nxt

    # ----- regular expressions ------------------------------------------------------------
    def maybe_update_regexes(self, group: ConsumerGroup, member: ConsumerGroupMember,
                              updated: ConsumerGroupMember, records: list[Record], now: int) -> RegexUpdate:
        old, new = member.subscribed_topic_regex, updated.subscribed_topic_regex
        counts = group.subscribed_regexes()
        result = RegexUpdate.NO_CHANGE
        require_refresh = False
        if old != new:
            result = RegexUpdate.UPDATED
            if is_regex(old) and counts[old or ""] == 1:
                records.append(regular_expression_tombstone(group.group_id, old or ""))
            if new:
                if counts[new] == 0:
                    compile_regex(new)  # INVALID_REGULAR_EXPRESSION before anything is written
                    require_refresh = True
                elif new in group.resolved_regexes:
                    result = RegexUpdate.UPDATED_AND_RESOLVED
            elif old:
                result = RegexUpdate.UPDATED_AND_RESOLVED
        if not require_refresh and not counts:
            return result
        key = regex_key(group.group_id)
        if self.timer.is_scheduled(key):
            return result
        last = group.last_regex_refresh_ms()
        # Kafka's 10 s floor; a shorter refresh interval (not valid in Kafka) lowers it for tests.
        floor = min(REGEX_BATCH_REFRESH_MIN_INTERVAL_MS, self.config.consumer_regex_refresh_interval_ms)
        if last and now <= last + floor:
            return result
        if old:
            counts[old] -= 1
        if new:
            counts[new] += 1
        regexes = {r for r, n in counts.items() if n > 0}
        require_refresh = (require_refresh or len(regexes) != len(group.resolved_regexes)
                           or group.last_regex_version() < self.last_version_with_new_topics
                           or now > last + self.config.consumer_regex_refresh_interval_ms)
        if require_refresh and regexes and not self.first_assignment_pending(group):
            # Kafka resolves regexes in the background, after the heartbeat's answer: a member
            # gets the literal topics of its subscription first. A new group's first assignment
            # waits for its initial delay here: its regexes are resolved at the first heartbeat
            # after it (a later heartbeat sees `require_refresh` again).
            group_id = group.group_id
            self.timer.schedule(key, 0, lambda shard, now_: shard.consumer.refresh_regexes(group_id, regexes, now_))
        return result

    def resolve(self, regexes: Iterable[str]) -> dict[str, frozenset[str]]:
        """The topics each regular expression matches entirely (RE2 syntax, as Kafka's RE2/J)."""
        compiled = {}
        for regex in regexes:
            try:
                compiled[regex] = compile_re2(regex)
            except RegexError:
                log.error("ignoring an invalid regular expression", regex=regex)
        matched: dict[str, set[str]] = {r: set() for r in regexes}
        for name in list(self.metadata.topics):
            for regex, pattern in compiled.items():
                if pattern.fullmatch(name):
                    matched[regex].add(name)
        return {r: frozenset(ts) for r, ts in matched.items()}

    def refresh_regexes(self, group_id: str, regexes: set[str], now: int) -> Result:
        """The regex-refresh timer: resolve the regexes and bump the group epoch if their topics
        (or the subscribed topics' metadata) changed."""
        group = self.consumer_group(group_id)
        if group is None:
            return CoordinatorResult()
        records: list[Record] = []
        counts = group.subscribed_regexes()
        resolved = dict(group.resolved_regexes)
        bump = False
        for regex, topics in self.resolve(regexes).items():
            if counts[regex] == 0:
                continue  # nobody subscribes to it any more
            previous = group.resolved_regexes.get(regex)
            if (previous.topics if previous else frozenset()) != topics:
                bump = True
            resolved[regex] = ResolvedRegex(topics, self.metadata_version, now)
            records.append(regular_expression_record(group_id, regex, sorted(topics), self.metadata_version, now))
        new_hash = metadata_hash(group.subscribed_topic_names(resolved=resolved), self.metadata)
        if bump or new_hash != group.metadata_hash:
            epoch = group.group_epoch + 1
            records.append(consumer_group_epoch_record(group_id, epoch, new_hash))
            group.metadata_refresh_deadline = (NO_DEADLINE, epoch)
            log.info("regular expressions resolved; bumped the group epoch", group_id=group_id, epoch=epoch)
        return CoordinatorResult(records=records)

    def on_metadata_change(self, created: set[str], deleted: set[str], changed: set[str], now: int) -> None:
        """Topics were created, deleted or got partitions: groups subscribed to them check their
        metadata at the next heartbeat; regexes are resolved again. The metadata version is a
        timestamp so that it keeps growing across restarts (resolved regexes persist theirs)."""
        self.metadata_version = max(self.metadata_version + 1, now)
        if created:
            self.last_version_with_new_topics = self.metadata_version
        touched = created | deleted | changed
        for group in self.groups.values():
            if not isinstance(group, ConsumerGroup):
                continue
            if touched & group.subscribed_topic_names():
                group.request_metadata_refresh()
                self.waits.group_changed(group.group_id)  # held members look again
            elif created and group.subscribed_regexes():
                self.waits.group_changed(group.group_id)  # a regex may match a new topic

    # ----- leaving and fencing ------------------------------------------------------------
    def _leave(self, request: Any, now: int) -> Result:
        group = self._group_or_raise(request.group_id)
        response = HB(member_id=request.member_id, member_epoch=request.member_epoch)
        if request.instance_id is None:
            member = group.member_or_raise(request.member_id)
            log.info("member left the consumer group", group_id=group.group_id, member_id=member.member_id)
            return self.fence_members(group, [member], response, now)
        member_or_none = group.static_member(request.instance_id)
        if member_or_none is None:
            raise KafkaError(E.UNKNOWN_MEMBER_ID, "Instance id %s is unknown." % request.instance_id)
        member = member_or_none
        if member.member_id != request.member_id:
            raise KafkaError(E.FENCED_INSTANCE_ID, "Static member %s with instance id %s was fenced by member %s."
                             % (request.member_id, request.instance_id, member.member_id))
        if request.member_epoch == LEAVE_GROUP_STATIC_MEMBER_EPOCH:
            # A static member leaves for a while: it keeps its partitions until its session expires.
            log.info("static member temporarily left the consumer group", group_id=group.group_id,
                     member_id=member.member_id, instance_id=request.instance_id)
            leaving = dataclasses.replace(member, member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH, pending_revocation=EMPTY)
            self.waits.member_gone(group.group_id, member.member_id)
            self.waits.group_changed(group.group_id)
            return CoordinatorResult(records=[leaving.current_assignment_record(group.group_id)],
                                     response=HB(member_id=member.member_id,
                                                 member_epoch=LEAVE_GROUP_STATIC_MEMBER_EPOCH))
        log.info("static member left the consumer group", group_id=group.group_id, member_id=member.member_id)
        return self.fence_members(group, [member], response, now)

    def fence_members(self, group: ConsumerGroup, members: list[ConsumerGroupMember], response: Any,
                      now: int) -> Result:
        if not members:
            return CoordinatorResult(response=response)
        gone = {m.member_id for m in members}
        if self.classic_members is not None and self.classic_members.can_downgrade(group, gone):
            # Only classic members remain: the group goes back to being a classic group.
            return CoordinatorResult(records=self.classic_members.downgrade(group, gone, now), response=response,
                                     replay=False)
        records: list[Record] = []
        for m in members:
            self._remove_member_records(records, group.group_id, m.member_id)
        # Regular expressions nobody else subscribes to are forgotten.
        leaving = group.subscribed_regexes(members)
        remaining_counts = group.subscribed_regexes()
        resolved = dict(group.resolved_regexes)
        for regex, n in leaving.items():
            if remaining_counts[regex] == n:
                records.append(regular_expression_tombstone(group.group_id, regex))
                resolved.pop(regex, None)
        remaining = [m for m in group.members.values() if m.member_id not in gone]
        new_hash = metadata_hash(group.subscribed_topic_names(remaining, resolved), self.metadata)
        epoch = group.group_epoch + 1
        records.append(consumer_group_epoch_record(group.group_id, epoch, new_hash))
        log.info("bumped the group epoch", group_id=group.group_id, epoch=epoch)
        for member_id in gone:
            self._cancel_timers(group.group_id, member_id)
            self.waits.member_gone(group.group_id, member_id)
        self.waits.group_changed(group.group_id)  # their partitions are free
        return CoordinatorResult(records=records, response=response)

    def fence_member(self, group_id: str, member_id: str, reason: str, now: int) -> Result:
        group = self.consumer_group(group_id)
        member = group.members.get(member_id) if group is not None else None
        if group is None or member is None:
            return CoordinatorResult()
        log.info("member fenced from the consumer group", group_id=group_id, member_id=member_id, reason=reason)
        return self.fence_members(group, [member], None, now)

    # ----- timers -------------------------------------------------------------------------
    def schedule_session_timeout(self, group_id: str, member_id: str, timeout_ms: int | None = None) -> None:
        """(Re)start the member's session: group.consumer.session.timeout.ms, or the session
        timeout a classic member gave in its JoinGroup."""
        timeout = self.session_settings(group_id)[0] if timeout_ms is None else timeout_ms
        self.timer.schedule(session_timeout_key(group_id, member_id), timeout,
                            lambda shard, now: shard.consumer.fence_member(group_id, member_id,
                                                                           "the member session expired", now))

    def _schedule_rebalance_timeout(self, group_id: str, member_id: str, epoch: int, timeout_ms: int) -> None:
        def expire(shard: Any, now: int) -> Result:
            manager: ConsumerGroupManager = shard.consumer
            group = manager.consumer_group(group_id)
            member = group.members.get(member_id) if group is not None else None
            if member is None or member.member_epoch != epoch:
                return CoordinatorResult()
            return manager.fence_member(group_id, member_id, "it failed to revoke its partitions within %d ms"
                                        % timeout_ms, now)

        self.timer.schedule(rebalance_timeout_key(group_id, member_id), timeout_ms, expire)

    def _cancel_timers(self, group_id: str, member_id: str) -> None:
        self.timer.cancel(session_timeout_key(group_id, member_id))
        self.timer.cancel(rebalance_timeout_key(group_id, member_id))
        self.heard.get(group_id, {}).pop(member_id, None)

    def cancel_group_timers(self, group: ConsumerGroup) -> None:
        for member_id in group.members:
            self._cancel_timers(group.group_id, member_id)
        self.timer.cancel(regex_key(group.group_id))
        self.timer.cancel(assignment_key(group.group_id))
        self.timer.cancel(initial_assignment_key(group.group_id))
        self.assignment_due.pop(group.group_id, None)
        self.heard.pop(group.group_id, None)

    # ----- ConsumerGroupDescribe ----------------------------------------------------------
    def describe(self, group_ids: list[str]) -> list[Any]:
        out = []
        for group_id in group_ids:
            try:
                group = self._group_or_raise(group_id)
            except KafkaError as exc:
                out.append(M.ConsumerGroupDescribeResponse.DescribedGroup(
                    group_id=group_id, error_code=exc.code, error_message=exc.message))
                continue
            out.append(group.describe(self.default_assignor, self.metadata))
        return out

    # ----- loading ------------------------------------------------------------------------
    def on_loaded(self, now: int) -> None:
        for group in self.groups.values():
            if not isinstance(group, ConsumerGroup):
                continue
            for member in group.members.values():
                self.schedule_session_timeout(group.group_id, member.member_id,
                                              member.classic.session_timeout_ms if member.classic else None)
                if member.state is MemberState.UNREVOKED_PARTITIONS and member.classic is None:
                    self._schedule_rebalance_timeout(group.group_id, member.member_id, member.member_epoch,
                                                     member.rebalance_timeout_ms)

    # ----- replay -------------------------------------------------------------------------
    def replay(self, record_type: int, key: Any, value: Any) -> None:
        replay_consumer_group_record(self.groups, record_type, key, value)
