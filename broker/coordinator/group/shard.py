"""The group coordinator shard: the groups and committed offsets of one `__consumer_offsets`
partition, its handlers (plain functions returning CoordinatorResult) and `replay`.

Replay is how offsets, group creation from commits, and deletions (tombstones) change state,
for fresh records and when loading alike. Classic groups keep their live state in memory and
write GroupMetadata snapshots (see membership.py); loading replays those snapshots. KIP-848
consumer groups (consumer_heartbeat.py) change only by replaying their records. Both kinds
share one namespace of group ids (`groups`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

from broker.coordinator.group.classic import ClassicGroup
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import ConsumerGroup, StaticTopicMetadata, TopicMetadata
from broker.coordinator.group.consumer_classic import ClassicMembers
from broker.coordinator.group.consumer_heartbeat import ConsumerGroupManager
from broker.coordinator.group.membership import ClassicGroupManager, RequestInfo, join_key, sync_key
from broker.coordinator.group.offsets import OffsetManager
from broker.coordinator.group.records import (
    CONSUMER_GROUP_METADATA,
    CONSUMER_GROUP_RECORD_TYPES,
    GROUP_METADATA,
    LEGACY_OFFSET_COMMIT,
    OFFSET_COMMIT,
    SHARE_GROUP_RECORD_TYPES,
    OffsetAndMetadata,
    OffsetCommitRun,
    group_metadata_tombstone,
    offset_commit_runs,
    parse_offset_commit,
    parse_record,
)
from broker.coordinator.group.share_group import ShareGroup
from broker.coordinator.group.share_heartbeat import SessionSettings, ShareGroupManager
from broker.coordinator.result import CoordinatorResult, Record, TxnMarker
from broker.coordinator.timer import Timer
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.group")

GROUP_EXPIRATION_KEY = "expire-group-metadata"


class GroupCoordinatorShard:
    def __init__(
        self,
        timer: Timer,
        config: GroupCoordinatorConfig | None = None,
        new_uuid: Callable[[], str] = lambda: str(uuid.uuid4()),
        metadata: TopicMetadata | None = None,
        share_session_settings: SessionSettings | None = None,
        consumer_session_settings: SessionSettings | None = None,
    ) -> None:
        self.config = config or GroupCoordinatorConfig()
        self.timer = timer
        self.groups: dict[str, Any] = {}  # ClassicGroup, ConsumerGroup or ShareGroup
        self.classic = ClassicGroupManager(self.groups, timer, self.config, new_uuid)
        self.offsets = OffsetManager(self.groups, self.classic, self.config)
        self.consumer = ConsumerGroupManager(self.groups, timer, self.config, metadata or StaticTopicMetadata())
        self.offsets.topic_id_of = self._topic_id_of
        self.consumer.classic_members = ClassicMembers(self.consumer, self.classic)
        self.loaded = False  # on_loaded ran: what is replayed from now on happens now (metrics count it)
        self.consumer_rebalances = 0  # consumer group epochs bumped since loading (metrics)
        if consumer_session_settings is not None:
            self.consumer.session_settings = consumer_session_settings
        self.share = ShareGroupManager(self.groups, timer, self.config, self.consumer.metadata, share_session_settings)

    # ----- replay and lifecycle -----------------------------------------------------------
    def replay(self, key: bytes, value: bytes | None) -> None:
        fast = parse_offset_commit(key, value)
        if fast is not None:  # most records of a group coordinator's log: read without the generic decoder
            self.offsets.replay(*fast)
            return
        record_type, k, v = parse_record(key, value)
        if record_type in (OFFSET_COMMIT, LEGACY_OFFSET_COMMIT):
            self.offsets.replay(k.group, k.topic, k.partition, None if v is None else OffsetAndMetadata.from_value(v))
        elif record_type == GROUP_METADATA:
            if v is None:
                if isinstance(self.groups.get(k.group), ClassicGroup):
                    del self.groups[k.group]
            else:
                self.groups[k.group] = ClassicGroup.from_record(k.group, v)
        elif record_type == CONSUMER_GROUP_METADATA and v is not None:
            # a group epoch bump is a rebalance (Kafka's consumer-group-rebalance count)
            bumped = v.epoch > getattr(self.groups.get(k.group_id), "group_epoch", 0)
            self.consumer.replay(record_type, k, v)
            self.consumer_rebalances += self.loaded and bumped
        elif record_type in CONSUMER_GROUP_RECORD_TYPES:
            self.consumer.replay(record_type, k, v)
        elif record_type in SHARE_GROUP_RECORD_TYPES:
            self.share.replay(record_type, k, v)
        else:
            log.debug("ignoring coordinator record", record_type=record_type)

    def replay_batch(self, records: list[Record], replay: Callable[[bytes, bytes | None], None]) -> None:
        """Loading: `replay` (self.replay, guarded by the runtime) of each record in order, except that
        each run of OffsetCommit records of one group and topic (one commit's) is applied at once."""
        for item in offset_commit_runs(records):
            if isinstance(item, OffsetCommitRun):
                self.offsets.replay_run(item)
            else:
                replay(*item)

    def replay_transactional(self, producer_id: int, key: bytes, value: bytes | None) -> None:
        """A record of a transactional batch (TxnOffsetCommit): pending until its marker."""
        record_type, k, v = parse_record(key, value)
        if record_type in (OFFSET_COMMIT, LEGACY_OFFSET_COMMIT):
            self.offsets.replay_transactional(producer_id, k.group, k.topic, k.partition,
                                              None if v is None else OffsetAndMetadata.from_value(v))
        else:
            self.replay(key, value)

    def replay_end_transaction(self, producer_id: int, committed: bool) -> None:
        self.offsets.replay_end_transaction(producer_id, committed)

    def on_loaded(self, now_ms: int) -> None:
        self.loaded = True
        self.classic.on_loaded(now_ms)
        self.consumer.on_loaded(now_ms)
        self.share.on_loaded(now_ms)
        self._schedule_expiration()

    def on_unloaded(self) -> None:
        self.classic.on_unloaded()
        self.consumer.waits.unload()
        self.share.waits.unload()

    # ----- classic group membership -------------------------------------------------------
    # A consumer group serves classic members itself (consumer_classic.py); an empty one makes
    # way for a classic group.
    def _classic_members(self) -> ClassicMembers:
        assert self.consumer.classic_members is not None
        return self.consumer.classic_members

    def join_group(self, request: M.JoinGroupRequest, info: RequestInfo, now_ms: int) -> CoordinatorResult[Any]:
        group = self.groups.get(request.group_id)
        if isinstance(group, ConsumerGroup):
            if group.members:
                return self._classic_members().join(group, request, info, now_ms)
            tombstones = group.tombstones()
            self.consumer.cancel_group_timers(group)
            del self.groups[request.group_id]  # directly: the tombstones are not replayed
            log.info("converting an empty consumer group to a classic group", group_id=request.group_id)
            result = self.classic.join_group(request, info, now_ms)
            result.records = tombstones + result.records
            return result
        return self.classic.join_group(request, info, now_ms)

    def sync_group(self, request: M.SyncGroupRequest, info: RequestInfo, now_ms: int) -> CoordinatorResult[Any]:
        group = self.groups.get(request.group_id)
        if isinstance(group, ConsumerGroup) and group.members:
            return self._classic_members().sync(group, request)
        return self.classic.sync_group(request, info, now_ms)

    def heartbeat(self, request: M.HeartbeatRequest, now_ms: int) -> CoordinatorResult[Any]:
        group = self.groups.get(request.group_id)
        if isinstance(group, ConsumerGroup):
            return self._classic_members().heartbeat(group, request)
        return self.classic.heartbeat(request, now_ms)

    def _topic_id_of(self, name: str) -> Any:
        info = self.consumer.metadata.topic(name)
        return info.topic_id if info is not None else None

    def release_heartbeat(self, group_id: str, member_id: str, now_ms: int) -> CoordinatorResult[Any]:
        """Answer the member's held heartbeat now (classic or consumer protocol)."""
        if isinstance(self.groups.get(group_id), ConsumerGroup):
            return self.consumer.waits.wake(group_id, member_id, now_ms, final=True, early=True)
        if isinstance(self.groups.get(group_id), ShareGroup):
            return self.share.waits.wake(group_id, member_id, now_ms, final=True, early=True)
        return self.classic.release_heartbeat(group_id, member_id)

    def leave_group(self, group_id: str, identities: list[M.LeaveGroupRequest.MemberIdentity], now_ms: int
                    ) -> CoordinatorResult[Any]:
        group = self.groups.get(group_id)
        if isinstance(group, ConsumerGroup):
            return self._classic_members().leave(group, identities, now_ms)
        return self.classic.leave_group(group_id, identities, now_ms)

    # ----- KIP-848 consumer groups --------------------------------------------------------
    def consumer_group_heartbeat(self, request: M.ConsumerGroupHeartbeatRequest, info: RequestInfo, now_ms: int
                                 ) -> CoordinatorResult[Any]:
        return self.consumer.heartbeat(request, info, now_ms)

    def consumer_group_describe(self, group_ids: list[str]) -> list[Any]:
        return self.consumer.describe(group_ids)

    def on_metadata_change(self, created: set[str], deleted: set[str], changed: set[str],
                           now_ms: int) -> CoordinatorResult[Any]:
        self.consumer.on_metadata_change(created, deleted, changed, now_ms)
        self.share.on_metadata_change(created | deleted | changed)
        return CoordinatorResult()

    # ----- share groups -------------------------------------------------------------------
    def share_group_heartbeat(self, request: M.ShareGroupHeartbeatRequest, info: RequestInfo, now_ms: int
                              ) -> CoordinatorResult[Any]:
        return self.share.heartbeat(request, info, now_ms)

    def share_group_describe(self, group_ids: list[str]) -> list[Any]:
        return self.share.describe(group_ids)

    # ----- reads --------------------------------------------------------------------------
    def describe_groups(self, group_ids: list[str], api_version: int) -> list[Any]:
        return self.classic.describe_groups(group_ids, api_version)

    def list_groups(self, states_filter: list[str], types_filter: list[str]) -> list[Any]:
        return self.classic.list_groups(states_filter, types_filter)

    def fetch_offsets(self, request: M.OffsetFetchRequest.OffsetFetchRequestGroup, require_stable: bool
                      ) -> M.OffsetFetchResponse.OffsetFetchResponseGroup:
        return self.offsets.fetch_offsets(request, require_stable)

    # ----- offsets ------------------------------------------------------------------------
    def commit_offsets(self, request: M.OffsetCommitRequest, api_version: int, now_ms: int) -> CoordinatorResult[Any]:
        return self.offsets.commit_offsets(request, api_version, now_ms)

    def delete_offsets(self, request: M.OffsetDeleteRequest, now_ms: int) -> CoordinatorResult[Any]:
        return self.offsets.delete_offsets(request)

    # ----- transactions -------------------------------------------------------------------
    def commit_transactional_offsets(self, request: M.TxnOffsetCommitRequest, markers_seen: int, now_ms: int
                                     ) -> CoordinatorResult[Any]:
        return self.offsets.commit_transactional_offsets(request, now_ms, markers_seen)

    def markers_seen(self, producer_id: int) -> int:
        return self.offsets.markers.get(producer_id, 0)

    def complete_transaction(self, producer_id: int, epoch: int, committed: bool, coordinator_epoch: int,
                             now_ms: int) -> CoordinatorResult[Any]:
        """The transaction coordinator's marker for this partition: written, then applied."""
        self.offsets.replay_end_transaction(producer_id, committed)
        return CoordinatorResult(marker=TxnMarker(producer_id, epoch, committed, coordinator_epoch), replay=False)

    # ----- DeleteGroups -------------------------------------------------------------------
    def delete_groups(self, group_ids: list[str], now_ms: int) -> CoordinatorResult[Any]:
        """Only empty groups can be deleted; their offsets go with them."""
        records: list[Record] = []
        results = []
        for group_id in group_ids:
            code = ErrorCode.NONE
            group = self.groups.get(group_id)
            try:
                if group is None:
                    raise KafkaError(ErrorCode.GROUP_ID_NOT_FOUND)
                group.validate_delete_group()
            except KafkaError as exc:
                code = exc.code
            else:
                self.offsets.delete_all_offsets(group_id, records)
                if isinstance(group, ConsumerGroup):
                    records.extend(group.tombstones())
                    self.consumer.cancel_group_timers(group)
                elif isinstance(group, ShareGroup):
                    records.extend(group.tombstones())
                    self.share.cancel_group_timers(group)
                else:
                    records.append(group_metadata_tombstone(group_id))
                    self.timer.cancel(join_key(group_id))
                    self.timer.cancel(sync_key(group_id))
            results.append(M.DeleteGroupsResponse.DeletableGroupResult(group_id=group_id, error_code=code))
        return CoordinatorResult(records=records, response=results)

    # ----- expiry -------------------------------------------------------------------------
    def _schedule_expiration(self) -> None:
        self.timer.schedule(
            GROUP_EXPIRATION_KEY, self.config.offsets_retention_check_interval_ms,
            lambda shard, now: shard.cleanup_group_metadata(now),
        )

    def cleanup_group_metadata(self, now_ms: int) -> CoordinatorResult[Any]:
        """offsets.retention.minutes: expire offsets and delete empty groups left without any."""
        self._schedule_expiration()
        records = self.offsets.cleanup_expired_offsets_and_groups(now_ms)
        if records:
            log.info("expired group metadata", tombstones=len(records))
        return CoordinatorResult(records=records)
