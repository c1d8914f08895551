"""The share-state RPCs (KIP-932), between brokers: InitializeShareGroupState (83),
ReadShareGroupState (84), WriteShareGroupState (85, v1 with DeliveryCompleteCount),
DeleteShareGroupState (86) and ReadShareGroupStateSummary (87, v1 with DeliveryCompleteCount).

A share-partition's engine (broker/share/, beside the data partition's leader) and the group
coordinator send them to the share coordinator of the share-partition's key, the leader of its
`__share_group_state` partition (broker/share/persister.py is that client). This node answers
with its share coordinator (broker/coordinator/share/) as Kafka's KafkaApis and
ShareCoordinatorService do:

- CLUSTER_ACTION on the cluster (an authorizer configured): else every partition of the request
  answers CLUSTER_AUTHORIZATION_FAILED. No share.version check (Kafka has none here: the share
  APIs that lead to these requests are gated already).
- An empty group id, no topics or (not for 83) a topic without partitions: an empty response.
  Without a share coordinator (starting, stopping): COORDINATOR_NOT_AVAILABLE "Share coordinator
  is not available." for every partition (83, 86, 87 check this first, 84, 85 after the
  emptiness checks, as Kafka).
- Each partition is one operation on the partition of `__share_group_state` its key maps to, run
  concurrently; results are grouped by topic id. A negative partition is INVALID_REQUEST. What the
  shard refuses (INVALID_REQUEST for a read or write of a share-partition without state,
  FENCED_STATE_EPOCH, FENCED_LEADER_EPOCH, UNKNOWN_TOPIC_OR_PARTITION for a partition the metadata
  does not have) answers with the shard's message or Kafka's default; what the runtime refuses
  (NOT_COORDINATOR: that `__share_group_state` partition is not loaded here;
  COORDINATOR_LOAD_IN_PROGRESS; COORDINATOR_NOT_AVAILABLE for a failed append) answers "Unable to
  <operation>: <reason>", as Kafka's handleOperationException.
- Read is Kafka's readStateAndMaybeUpdateLeaderEpoch (a newer leader epoch is written first);
  summary answers start offset -1, delivery-complete count -1 and epochs 0 for a share-partition
  without state; delete answers NONE for one without state.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from broker.apis.context import RequestContext
from broker.apis.registry import api
from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import WriteState
from broker.coordinator.share.state import StateBatch
from broker.observability.logger import get_logger
from broker.security.acl import AUTHORIZATION_MESSAGES
from broker.security.authz import Op, authorize_cluster
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:  # for annotations only
    from broker.coordinator.share import ShareCoordinator

log = get_logger("broker.share")

E = ErrorCode
NOT_AVAILABLE = "Share coordinator is not available."
NEGATIVE_PARTITION = "The partition id cannot be a negative number."
# Kafka's Errors.*.message() of the codes answered without a message of their own
DEFAULT_MESSAGES = {
    E.UNKNOWN_SERVER_ERROR: "The server experienced an unexpected error when processing the request.",
    E.UNKNOWN_TOPIC_OR_PARTITION: "This server does not host this topic-partition.",
    E.COORDINATOR_LOAD_IN_PROGRESS: "The coordinator is loading and hence can't process requests.",
    E.COORDINATOR_NOT_AVAILABLE: "The coordinator is not available.",
    E.NOT_COORDINATOR: "This is not the correct coordinator.",
    E.FENCED_LEADER_EPOCH: "The leader epoch in the request is older than the epoch on the broker.",
    E.FENCED_STATE_EPOCH: "The share coordinator rejected the request because the share-group state epoch did not "
                          "match.",
}
# what the shard answers as response data in Kafka (everything else is an operation's exception)
SHARD_ERRORS = frozenset([E.INVALID_REQUEST, E.FENCED_LEADER_EPOCH, E.FENCED_STATE_EPOCH,
                          E.UNKNOWN_TOPIC_OR_PARTITION])

Op_ = Callable[["ShareCoordinator", ShareKey, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class Rpc:
    """One of the five APIs: its response class and topic-result class, and Kafka's checks."""

    response: Any
    result: str  # the response's per-topic struct
    operation: str  # "Unable to <operation>: ..."
    active_first: bool  # the coordinator's availability checked before the request's emptiness
    partitions_checked: bool  # a topic without partitions makes the response empty


def message_of(rpc: Rpc, exc: BaseException) -> tuple[ErrorCode, str]:
    """The partition's error code and message for a failed operation (Kafka's shard messages, or
    handleOperationException's "Unable to ..." for the runtime's errors)."""
    if not isinstance(exc, KafkaError):
        log.error("share state operation failed", operation=rpc.operation, error=repr(exc))
        return E.UNKNOWN_SERVER_ERROR, "Unable to %s: %s" % (rpc.operation, exc)
    reason = exc.message or DEFAULT_MESSAGES.get(exc.code, exc.code.name)
    if exc.code in SHARD_ERRORS:
        return exc.code, reason
    return exc.code, "Unable to %s: %s" % (rpc.operation, reason)


def _every(rpc: Rpc, request: Any, code: ErrorCode, message: str) -> Any:
    """Every partition of the request answers `code` (Kafka's getErrorResponse)."""
    R = rpc.response
    result, partition = getattr(R, rpc.result), R.PartitionResult
    return R(results=[result(topic_id=t.topic_id, partitions=[
        partition(partition=p.partition, error_code=code, error_message=message) for p in t.partitions])
        for t in request.topics])


async def serve(ctx: RequestContext, request: Any, rpc: Rpc, op: Op_) -> Any:
    """The response to `request` (any of the five), each partition answered by `op`."""
    R = rpc.response
    if not authorize_cluster(ctx, Op.CLUSTER_ACTION):
        denied = E.CLUSTER_AUTHORIZATION_FAILED
        return _every(rpc, request, denied, AUTHORIZATION_MESSAGES[denied])
    coordinator = ctx.broker.share_coordinator
    if rpc.active_first and coordinator is None:
        return _every(rpc, request, E.COORDINATOR_NOT_AVAILABLE, NOT_AVAILABLE)
    if not request.group_id or not request.topics or (
            rpc.partitions_checked and any(not t.partitions for t in request.topics)):
        log.error("share state request without group id, topics or partitions", operation=rpc.operation)
        return R()
    if coordinator is None:
        return _every(rpc, request, E.COORDINATOR_NOT_AVAILABLE, NOT_AVAILABLE)
    result_class, partition_class = getattr(R, rpc.result), R.PartitionResult

    async def one(topic_id: uuid.UUID, data: Any) -> Any:
        if data.partition < 0:
            return partition_class(partition=data.partition, error_code=E.INVALID_REQUEST,
                                   error_message=NEGATIVE_PARTITION)
        try:
            fields = await op(coordinator, (request.group_id, topic_id, data.partition), data)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            code, message = message_of(rpc, exc)
            return partition_class(partition=data.partition, error_code=code, error_message=message)
        return partition_class(partition=data.partition, **fields)

    entries = [(t.topic_id, p) for t in request.topics for p in t.partitions]
    answers = await asyncio.gather(*(one(topic_id, p) for topic_id, p in entries))
    # grouped by topic id, one answer per partition (the last), as Kafka's map of futures
    by_topic: dict[uuid.UUID, dict[int, Any]] = {}
    for (topic_id, _), answer in zip(entries, answers):
        by_topic.setdefault(topic_id, {})[answer.partition] = answer
    return R(results=[result_class(topic_id=t, partitions=list(ps.values())) for t, ps in by_topic.items()])


# ----- InitializeShareGroupState -----------------------------------------------------------
INITIALIZE = Rpc(M.InitializeShareGroupStateResponse, "InitializeStateResult", "initialize share group state",
                 active_first=True, partitions_checked=False)


async def _initialize(coordinator: ShareCoordinator, key: ShareKey, data: Any) -> dict[str, Any]:
    await coordinator.initialize_state(key, data.state_epoch, data.start_offset)
    return {}


@api(83)
async def handle_initialize_share_group_state(ctx: RequestContext, request: M.InitializeShareGroupStateRequest
                                              ) -> M.InitializeShareGroupStateResponse:
    response: M.InitializeShareGroupStateResponse = await serve(ctx, request, INITIALIZE, _initialize)
    return response


# ----- ReadShareGroupState -----------------------------------------------------------------
READ = Rpc(M.ReadShareGroupStateResponse, "ReadStateResult", "read share group state",
           active_first=False, partitions_checked=True)


async def _read(coordinator: ShareCoordinator, key: ShareKey, data: Any) -> dict[str, Any]:
    state = await coordinator.read_for_leader(key, data.leader_epoch)
    B = M.ReadShareGroupStateResponse.StateBatch
    return {"state_epoch": state.state_epoch, "start_offset": state.start_offset, "state_batches": [
        B(first_offset=b.first_offset, last_offset=b.last_offset, delivery_state=b.delivery_state,
          delivery_count=b.delivery_count) for b in state.state_batches]}


@api(84)
async def handle_read_share_group_state(ctx: RequestContext, request: M.ReadShareGroupStateRequest
                                        ) -> M.ReadShareGroupStateResponse:
    response: M.ReadShareGroupStateResponse = await serve(ctx, request, READ, _read)
    return response


# ----- WriteShareGroupState ----------------------------------------------------------------
WRITE = Rpc(M.WriteShareGroupStateResponse, "WriteStateResult", "write share group state",
            active_first=False, partitions_checked=True)


async def _write(coordinator: ShareCoordinator, key: ShareKey, data: Any) -> dict[str, Any]:
    # v0 has no DeliveryCompleteCount: the codec's default -1 (unknown) keeps the recorded count
    batches = tuple(StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count)
                    for b in data.state_batches)
    await coordinator.write_state(WriteState(key, data.state_epoch, data.leader_epoch, data.start_offset,
                                             data.delivery_complete_count, batches), require_state=True)
    return {}


@api(85)
async def handle_write_share_group_state(ctx: RequestContext, request: M.WriteShareGroupStateRequest
                                         ) -> M.WriteShareGroupStateResponse:
    response: M.WriteShareGroupStateResponse = await serve(ctx, request, WRITE, _write)
    return response


# ----- DeleteShareGroupState ---------------------------------------------------------------
DELETE = Rpc(M.DeleteShareGroupStateResponse, "DeleteStateResult", "delete share group state",
             active_first=True, partitions_checked=True)


async def _delete(coordinator: ShareCoordinator, key: ShareKey, data: Any) -> dict[str, Any]:
    await coordinator.delete_state([key], require_partition=True)
    return {}


@api(86)
async def handle_delete_share_group_state(ctx: RequestContext, request: M.DeleteShareGroupStateRequest
                                          ) -> M.DeleteShareGroupStateResponse:
    response: M.DeleteShareGroupStateResponse = await serve(ctx, request, DELETE, _delete)
    return response


# ----- ReadShareGroupStateSummary ----------------------------------------------------------
SUMMARY = Rpc(M.ReadShareGroupStateSummaryResponse, "ReadStateSummaryResult", "read share group state summary",
              active_first=True, partitions_checked=True)


async def _summary(coordinator: ShareCoordinator, key: ShareKey, data: Any) -> dict[str, Any]:
    state = await coordinator.read_summary(key)  # the request's leader epoch is not used (as Kafka)
    return {"state_epoch": state.state_epoch, "leader_epoch": state.leader_epoch, "start_offset": state.start_offset,
            "delivery_complete_count": state.delivery_complete_count}  # v0: not sent


@api(87)
async def handle_read_share_group_state_summary(ctx: RequestContext, request: M.ReadShareGroupStateSummaryRequest
                                                ) -> M.ReadShareGroupStateSummaryResponse:
    response: M.ReadShareGroupStateSummaryResponse = await serve(ctx, request, SUMMARY, _summary)
    return response


__all__ = ["DEFAULT_MESSAGES", "NEGATIVE_PARTITION", "NOT_AVAILABLE", "Rpc", "message_of", "serve"]
