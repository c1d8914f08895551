"""The group coordinator service: routes each request to its `__consumer_offsets` shard through
the runtime and turns coordinator errors into the response's error fields (Kafka's
GroupCoordinatorService). The API handlers (broker/apis/group.py, offsets.py) call this.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from broker.coordinator.group import share_admin
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import TopicMetadata
from broker.coordinator.group.consumer_heartbeat import validate_heartbeat_request
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.shard import GroupCoordinatorShard
from broker.coordinator.group.share_group import ShareGroup
from broker.coordinator.group.share_heartbeat import validate_heartbeat_request as validate_share_heartbeat
from broker.coordinator.result import CoordinatorResult
from broker.coordinator.runtime import CoordinatorRuntime, PartitionWriter, operation_error_code
from broker.coordinator.timer import Clock, Timer
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.group")

E = ErrorCode
GROUP_METADATA_TOPIC = "__consumer_offsets"
# a described group of DescribeGroups, ConsumerGroupDescribe or ShareGroupDescribe
Described = TypeVar("Described", M.DescribeGroupsResponse.DescribedGroup,
                    M.ConsumerGroupDescribeResponse.DescribedGroup, M.ShareGroupDescribeResponse.DescribedGroup)


def _code(exc: BaseException) -> ErrorCode:
    return operation_error_code(exc, "group coordinator")


class GroupCoordinator:
    def __init__(self, runtime: CoordinatorRuntime[GroupCoordinatorShard], config: GroupCoordinatorConfig) -> None:
        self.runtime = runtime
        self.config = config
        self._releases: set[asyncio.Task[None]] = set()
        # Deletes the share state of share groups about to be deleted (the share coordinator's).
        self.delete_share_state: Callable[[list[str]], Awaitable[None]] | None = None

    async def start(self, load: bool = True) -> None:
        """Load every partition of __consumer_offsets (a single node coordinates them all; a node of
        a cluster loads those it leads, as it learns of them: `load` False)."""
        if load:
            await self.runtime.load_all()

    async def stop(self) -> None:
        await self.runtime.close()

    def partition_for(self, group_id: str) -> int:
        return self.runtime.partition_for(group_id)

    def loaded_shards(self) -> list[GroupCoordinatorShard]:
        """The shards of the loaded partitions, for the metrics to read in the caller's turn on
        the event loop (what they hold may include writes not yet durable)."""
        return [self.runtime.shard(p) for p in self.runtime.active_partitions()]

    async def group_counts(self) -> dict[str, int]:
        """Number of groups per state name (for metrics)."""
        counts: dict[str, int] = {}
        for p in self.runtime.active_partitions():
            try:
                states = await self.runtime.read(p, lambda s: [g.state.value for g in s.groups.values()], "stats")
            except KafkaError:
                continue
            for state in states:
                counts[state] = counts.get(state, 0) + 1
        return counts

    # ----- membership ---------------------------------------------------------------------
    async def join_group(self, request: M.JoinGroupRequest, info: RequestInfo) -> M.JoinGroupResponse:
        try:
            return await self.runtime.write(
                self.partition_for(request.group_id), lambda s, now: s.join_group(request, info, now), "join-group")
        except Exception as exc:
            return M.JoinGroupResponse(error_code=_code(exc), protocol_type=None, protocol_name=None)

    async def sync_group(self, request: M.SyncGroupRequest, info: RequestInfo) -> M.SyncGroupResponse:
        try:
            return await self.runtime.write(
                self.partition_for(request.group_id), lambda s, now: s.sync_group(request, info, now), "sync-group")
        except Exception as exc:
            return M.SyncGroupResponse(error_code=_code(exc))

    async def heartbeat(self, request: M.HeartbeatRequest) -> M.HeartbeatResponse:
        try:
            return await self.runtime.write(
                self.partition_for(request.group_id), lambda s, now: s.heartbeat(request, now), "heartbeat")
        except Exception as exc:
            code = _code(exc)
            # While the group is loading, answer blindly: the session is checked once it is loaded.
            return M.HeartbeatResponse(error_code=E.NONE if code is E.COORDINATOR_LOAD_IN_PROGRESS else code)

    def release_heartbeat(self, group_id: str, member_id: str) -> None:
        """Another request waits behind the member's held heartbeat on its connection (or the
        connection closes, or the broker stops): answer the heartbeat now."""
        async def release() -> None:
            try:
                await self.runtime.write(self.partition_for(group_id),
                                         lambda s, now: s.release_heartbeat(group_id, member_id, now), "release-heartbeat")
            except KafkaError:
                pass  # the partition is unloading, which answers held heartbeats itself

        task = asyncio.get_running_loop().create_task(release())
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def leave_group(self, group_id: str, identities: list[M.LeaveGroupRequest.MemberIdentity]
                          ) -> M.LeaveGroupResponse:
        try:
            return await self.runtime.write(
                self.partition_for(group_id), lambda s, now: s.leave_group(group_id, identities, now), "leave-group")
        except Exception as exc:
            return M.LeaveGroupResponse(error_code=_code(exc))

    # ----- KIP-848 consumer groups --------------------------------------------------------
    async def consumer_group_heartbeat(self, request: M.ConsumerGroupHeartbeatRequest, info: RequestInfo
                                       ) -> M.ConsumerGroupHeartbeatResponse:
        try:
            validate_heartbeat_request(request, info.api_version, self.config.consumer_assignors)
            return await self.runtime.write(
                self.partition_for(request.group_id),
                lambda s, now: s.consumer_group_heartbeat(request, info, now), "consumer-group-heartbeat")
        except Exception as exc:
            return M.ConsumerGroupHeartbeatResponse(
                error_code=_code(exc), error_message=exc.message if isinstance(exc, KafkaError) else None)

    async def consumer_group_describe(self, group_ids: list[str]) -> list[M.ConsumerGroupDescribeResponse.DescribedGroup]:
        return await self._describe(group_ids, M.ConsumerGroupDescribeResponse.DescribedGroup,
                                    lambda s, ids: s.consumer_group_describe(ids), "consumer-group-describe")

    async def _describe(self, group_ids: list[str], described: type[Described],
                        read: Callable[[GroupCoordinatorShard, list[str]], list[Described]], name: str,
                        empty_id_valid: bool = False) -> list[Described]:
        """DescribeGroups / ConsumerGroupDescribe / ShareGroupDescribe: each shard describes its
        groups (a failing shard's groups get its error); an empty group id is INVALID_GROUP_ID
        but for DescribeGroups (`empty_id_valid`, as Kafka keeps it for backwards compatibility)."""
        async def one(partition: int, ids: list[str]) -> list[Described]:
            try:
                result: list[Described] = await self.runtime.read(partition, lambda s: read(s, ids), name)
                return result
            except Exception as exc:
                return [described(group_id=g, error_code=_code(exc)) for g in ids]

        valid = [g for g in group_ids if g or empty_id_valid]
        parts = await asyncio.gather(*(one(p, ids) for p, ids in self._by_partition(valid).items()))
        by_id = {d.group_id: d for part in parts for d in part}
        return [by_id[g] if g or empty_id_valid else described(group_id="", error_code=E.INVALID_GROUP_ID)
                for g in group_ids]

    # ----- share groups -------------------------------------------------------------------
    async def share_group_heartbeat(self, request: M.ShareGroupHeartbeatRequest, info: RequestInfo
                                    ) -> M.ShareGroupHeartbeatResponse:
        try:
            validate_share_heartbeat(request)
            return await self.runtime.write(
                self.partition_for(request.group_id),
                lambda s, now: s.share_group_heartbeat(request, info, now), "share-group-heartbeat")
        except Exception as exc:
            return M.ShareGroupHeartbeatResponse(
                error_code=_code(exc), error_message=exc.message if isinstance(exc, KafkaError) else None)

    async def share_group_describe(self, group_ids: list[str]) -> list[M.ShareGroupDescribeResponse.DescribedGroup]:
        return await self._describe(group_ids, M.ShareGroupDescribeResponse.DescribedGroup,
                                    lambda s, ids: s.share_group_describe(ids), "share-group-describe")

    async def share_group(self, group_id: str) -> ShareGroup | None:
        """The share group (its durable state), or None; raises KafkaError (coordinator errors)."""
        group: ShareGroup | None = await self.runtime.read(
            self.partition_for(group_id), lambda s: s.share.share_group(group_id), "share-group")
        return group

    async def alter_share_group_offsets(self, group_id: str, request: M.AlterShareGroupOffsetsRequest
                                        ) -> share_admin.AlterResult:
        """Raises KafkaError (group-level errors)."""
        def op(s: GroupCoordinatorShard, now: int) -> CoordinatorResult[Any]:
            records, result = share_admin.alter_offsets(s.groups, group_id, request, s.consumer.metadata)
            return CoordinatorResult(records=records, response=result)

        result: share_admin.AlterResult = await self.runtime.write(
            self.partition_for(group_id), op, "share-group-offsets-alter")
        return result

    async def initiate_delete_share_group_offsets(self, group_id: str, request: M.DeleteShareGroupOffsetsRequest
                                                  ) -> share_admin.DeleteResult:
        """Raises KafkaError (group-level errors)."""
        def op(s: GroupCoordinatorShard, now: int) -> CoordinatorResult[Any]:
            records, result = share_admin.initiate_delete(s.groups, group_id, request, s.consumer.metadata)
            return CoordinatorResult(records=records, response=result)

        result: share_admin.DeleteResult = await self.runtime.write(
            self.partition_for(group_id), op, "initiate-delete-share-group-offsets")
        return result

    async def complete_delete_share_group_offsets(self, group_id: str, deleted: list[uuid.UUID]) -> None:
        await self.runtime.write(
            self.partition_for(group_id),
            lambda s, now: CoordinatorResult(records=share_admin.complete_delete(s.groups, group_id, deleted)),
            "complete-delete-share-group-offsets")

    async def share_topics_deleted(self, topic_ids: set[uuid.UUID]) -> None:
        """Deleted topics leave the share groups' share-partition metadata (every loaded shard)."""
        await asyncio.gather(*(self.runtime.write(
            p, lambda s, now: CoordinatorResult(records=share_admin.forget_topics(s.groups, topic_ids)),
            "share-topics-deleted") for p in self.runtime.active_partitions()))

    async def initialized_share_partitions(self, group_id: str) -> dict[uuid.UUID, list[int]]:
        result: dict[uuid.UUID, list[int]] = await self.runtime.read(
            self.partition_for(group_id), lambda s: share_admin.initialized_partitions(s.groups, group_id),
            "share-group-initialized-partitions")
        return result

    async def share_state_keys(self, group_id: str) -> list[tuple[str, uuid.UUID, int]]:
        """The share-partitions of a share group whose state is to be deleted with it (the keys of
        its DeleteShareGroupState when the share coordinators are on other nodes)."""
        result: list[tuple[str, uuid.UUID, int]] = await self.runtime.read(
            self.partition_for(group_id), lambda s: share_admin.state_keys(s.groups, group_id), "share-state-keys")
        return result

    async def on_topics_changed(self, created: Iterable[str] = (), deleted: Iterable[str] = (),
                                changed: Iterable[str] = ()) -> None:
        """Topics were created, deleted or got partitions: every shard hears of it (consumer
        groups subscribed to them recompute their assignment at their next heartbeat)."""
        async def one(partition: int) -> None:
            try:
                await self.runtime.write(
                    partition, lambda s, now: s.on_metadata_change(set(created), set(deleted), set(changed), now),
                    "metadata-change")
            except KafkaError:
                pass  # not loaded: it reads the metadata afresh when it is

        await asyncio.gather(*(one(p) for p in self.runtime.active_partitions()))

    # ----- groups -------------------------------------------------------------------------
    def _by_partition(self, group_ids: list[str]) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for g in dict.fromkeys(group_ids):
            out.setdefault(self.partition_for(g), []).append(g)
        return out

    async def describe_groups(self, group_ids: list[str], api_version: int
                              ) -> list[M.DescribeGroupsResponse.DescribedGroup]:
        return await self._describe(group_ids, M.DescribeGroupsResponse.DescribedGroup,
                                    lambda s, ids: s.describe_groups(ids, api_version), "describe-groups",
                                    empty_id_valid=True)

    async def list_groups(self, states_filter: list[str], types_filter: list[str]
                          ) -> tuple[ErrorCode, list[M.ListGroupsResponse.ListedGroup]]:
        async def one(partition: int) -> list[M.ListGroupsResponse.ListedGroup]:
            try:
                result: list[M.ListGroupsResponse.ListedGroup] = await self.runtime.read(
                    partition, lambda s: s.list_groups(states_filter, types_filter), "list-groups")
                return result
            except KafkaError as exc:
                if exc.code is E.NOT_COORDINATOR:
                    return []
                raise

        try:
            parts = await asyncio.gather(*(one(p) for p in range(self.runtime.num_partitions)))
        except Exception as exc:
            return _code(exc), []
        return E.NONE, [g for part in parts for g in part]

    async def delete_groups(self, group_ids: list[str]) -> list[M.DeleteGroupsResponse.DeletableGroupResult]:
        async def one(partition: int, ids: list[str]) -> list[M.DeleteGroupsResponse.DeletableGroupResult]:
            try:
                if self.delete_share_state is not None:
                    # As Kafka: the share state of an empty share group goes first, then the group.
                    empty_share = await self.runtime.read(partition, lambda s: [
                        g for g in ids if isinstance(s.groups.get(g), ShareGroup) and s.groups[g].is_empty()],
                        "share-groups")
                    if empty_share:
                        await self.delete_share_state(empty_share)
                result: list[M.DeleteGroupsResponse.DeletableGroupResult] = await self.runtime.write(
                    partition, lambda s, now: s.delete_groups(ids, now), "delete-groups")
                return result
            except Exception as exc:
                code = _code(exc)
                return [M.DeleteGroupsResponse.DeletableGroupResult(group_id=g, error_code=code) for g in ids]

        parts = await asyncio.gather(*(one(p, ids) for p, ids in self._by_partition(group_ids).items()))
        by_id = {r.group_id: r for part in parts for r in part}
        return [by_id[g] for g in dict.fromkeys(group_ids)]

    # ----- offsets ------------------------------------------------------------------------
    async def commit_offsets(self, request: M.OffsetCommitRequest, api_version: int) -> M.OffsetCommitResponse:
        """The request's topic names resolved. On a group-level error every partition carries the
        error code."""
        try:
            return await self.runtime.write(
                self.partition_for(request.group_id),
                lambda s, now: s.commit_offsets(request, api_version, now), "commit-offsets")
        except Exception as exc:
            return offset_commit_error(request, _code(exc))

    async def fetch_offsets(self, request: M.OffsetFetchRequest.OffsetFetchRequestGroup, require_stable: bool
                            ) -> M.OffsetFetchResponse.OffsetFetchResponseGroup:
        """One group's offsets (on a coordinator error: the group-level error code and no topics)."""
        try:
            return await self.runtime.read_now(
                self.partition_for(request.group_id), lambda s: s.fetch_offsets(request, require_stable),
                "fetch-offsets")
        except Exception as exc:
            return M.OffsetFetchResponse.OffsetFetchResponseGroup(group_id=request.group_id, error_code=_code(exc))

    # ----- transactions -------------------------------------------------------------------
    async def markers_seen(self, group_id: str, producer_id: int) -> int:
        """How many transaction markers of the producer the group's partition has applied (taken
        before a TxnOffsetCommit is verified with the transaction coordinator)."""
        count: int = await self.runtime.read_now(self.partition_for(group_id),
                                                 lambda s: s.markers_seen(producer_id), "markers-seen")
        return count

    async def commit_transactional_offsets(self, request: M.TxnOffsetCommitRequest, markers_seen: int
                                           ) -> M.TxnOffsetCommitResponse:
        """The request's topics all exist; on a group-level error every partition carries the error
        code."""
        try:
            return await self.runtime.write(
                self.partition_for(request.group_id),
                lambda s, now: s.commit_transactional_offsets(request, markers_seen, now), "txn-commit-offsets")
        except Exception as exc:
            return txn_offset_commit_error(request, _code(exc))

    async def complete_transaction(self, partition: int, producer_id: int, epoch: int, committed: bool,
                                   coordinator_epoch: int = 0) -> None:
        """Write the transaction coordinator's marker to `__consumer_offsets-<partition>` and apply
        it (pending transactional offsets committed or dropped). Raises KafkaError."""
        await self.runtime.write(
            partition, lambda s, now: s.complete_transaction(producer_id, epoch, committed, coordinator_epoch, now),
            "complete-transaction")

    async def delete_offsets(self, request: M.OffsetDeleteRequest) -> M.OffsetDeleteResponse:
        try:
            return await self.runtime.write(
                self.partition_for(request.group_id), lambda s, now: s.delete_offsets(request, now), "delete-offsets")
        except Exception as exc:
            return M.OffsetDeleteResponse(error_code=_code(exc))


def offset_commit_error(request: M.OffsetCommitRequest, code: ErrorCode) -> M.OffsetCommitResponse:
    """An OffsetCommit response with `code` for every partition of the request."""
    R = M.OffsetCommitResponse
    return R(topics=[R.OffsetCommitResponseTopic(name=t.name, topic_id=t.topic_id, partitions=[
        R.OffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code) for p in t.partitions])
        for t in request.topics])


def txn_offset_commit_error(request: M.TxnOffsetCommitRequest, code: ErrorCode) -> M.TxnOffsetCommitResponse:
    """A TxnOffsetCommit response with `code` for every partition of the request."""
    R = M.TxnOffsetCommitResponse
    return R(topics=[R.TxnOffsetCommitResponseTopic(name=t.name, partitions=[
        R.TxnOffsetCommitResponsePartition(partition_index=p.partition_index, error_code=code) for p in t.partitions])
        for t in request.topics])


def create_group_coordinator(
    writer: PartitionWriter, config_values: Mapping[str, Any], clock: Clock, metadata: TopicMetadata | None = None,
    **shard_options: Any,
) -> GroupCoordinator:
    """A group coordinator over `writer` (one log per __consumer_offsets partition). Call
    `await start()` to load its partitions and `await stop()` on shutdown. `metadata` gives the
    cluster's topics (names, ids, partition counts) to KIP-848 consumer groups; tell the
    coordinator of topic changes with `on_topics_changed`."""
    config = GroupCoordinatorConfig.from_values(config_values)

    def shard_factory(partition: int, timer: Timer) -> GroupCoordinatorShard:
        return GroupCoordinatorShard(timer, config, metadata=metadata, **shard_options)

    runtime: CoordinatorRuntime[GroupCoordinatorShard] = CoordinatorRuntime(
        writer, shard_factory, config.num_partitions, clock, name="group-coordinator")
    return GroupCoordinator(runtime, config)
