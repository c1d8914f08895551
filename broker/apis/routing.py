"""What a node of a cluster answers for what another node serves, as Kafka's brokers answer it.

A request sent to the wrong node gets, per partition or per group, the error Kafka gives there:
NOT_LEADER_OR_FOLLOWER for a partition this node does not lead (with KIP-951's hints: the
partition's current leader and that leader's endpoint, so clients move without a Metadata round
trip), NOT_COORDINATOR for a group or transactional id coordinated elsewhere,
COORDINATOR_NOT_AVAILABLE when its coordinator's partition has no leader, NOT_ENOUGH_REPLICAS for
acks=all below min.insync.replicas; the rest of the request is served (`answer_in_part`).
ListGroups lists the groups this node coordinates. Metadata changes (Kafka's forwardable APIs)
go to the controller (`forward`).

The same router serves the simulated cluster of the test kit (one process answering as N nodes:
the node is the one the connection came in on) and cluster mode (every connection is this node's).
Where things are comes from a `ClusterView`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from broker.apis.addressing import Key, answer_in_part, fail_whole
from broker.apis.registry import Handler, RequestContext
from broker.apis.topology import ClusterView
from broker.metadata import MetadataStore
from protocol import messages as M
from protocol.errors import ErrorCode

E = ErrorCode
KEY_TYPE_GROUP, KEY_TYPE_TRANSACTION, KEY_TYPE_SHARE = 0, 1, 2
# APIs served by a partition's leader, by the group coordinator, by the transaction coordinator
# (the request field naming the transactional id; only requests that name one), and ListGroups
# (each node lists the groups it coordinates)
LEADER_APIS = frozenset({0, 1, 2, 21, 23, 61, 78, 79})
GROUP_APIS = frozenset({8, 9, 11, 12, 13, 14, 15, 28, 42, 47, 68, 69, 76, 77, 90, 91, 92})
TRANSACTION_FIELDS = {22: "transactional_id", 25: "transactional_id", 26: "transactional_id"}
ADD_PARTITIONS_TO_TXN, LIST_GROUPS, PRODUCE, FETCH, SHARE_FETCH, SHARE_ACKNOWLEDGE = 24, 16, 0, 1, 78, 79
# KIP-951: the versions from which a refused Produce / Fetch names the partition's current leader
# and that leader's address (KafkaApis: Produce v10+ for NOT_LEADER_OR_FOLLOWER, Fetch v16+ also
# for FENCED_LEADER_EPOCH), so clients move without waiting for a Metadata round trip
LEADER_HINTS = {PRODUCE: (10, frozenset({E.NOT_LEADER_OR_FOLLOWER})),
                FETCH: (16, frozenset({E.NOT_LEADER_OR_FOLLOWER, E.FENCED_LEADER_EPOCH})),
                SHARE_FETCH: (0, frozenset({E.NOT_LEADER_OR_FOLLOWER, E.FENCED_LEADER_EPOCH})),
                SHARE_ACKNOWLEDGE: (0, frozenset({E.NOT_LEADER_OR_FOLLOWER, E.FENCED_LEADER_EPOCH}))}
# answers whose partitions may be refused by the handler itself (a replica not leading yet), not
# only by the router: walked for hints whenever they are sent
HANDLER_REFUSES = frozenset({FETCH, SHARE_FETCH, SHARE_ACKNOWLEDGE})
ROUTED = LEADER_APIS | GROUP_APIS | set(TRANSACTION_FIELDS) | {ADD_PARTITIONS_TO_TXN, LIST_GROUPS}
# the metadata changes a broker forwards to the controller (Kafka's forwardable APIs):
# CreateTopics, DeleteTopics, CreateAcls, DeleteAcls, AlterConfigs, CreatePartitions, ElectLeaders,
# IncrementalAlterConfigs, AlterPartitionReassignments, ListPartitionReassignments (Kafka's brokers
# forward it too: the controller's view includes what it has just reassigned), AlterClientQuotas,
# AlterUserScramCredentials, UpdateFeatures
FORWARDED = frozenset({19, 20, 30, 31, 33, 37, 43, 44, 45, 46, 49, 51, 57})

Forward = Callable[[RequestContext, Any, Handler], Awaitable[Any]]


class Router:
    """Answers what this node does not serve; `node_of(ctx)`: the node a request came to."""

    def __init__(self, view: ClusterView, metadata: Callable[[], MetadataStore], node_of: Callable[[Any], int],
                 forward: Forward | None, min_insync_replicas: Callable[[str], int]) -> None:
        self.view = view
        self.metadata = metadata
        self.node_of = node_of
        self.forward = forward
        self.min_insync_replicas = min_insync_replicas

    @property
    def api_keys(self) -> frozenset[int]:
        return frozenset(ROUTED | (FORWARDED if self.forward is not None else frozenset()))

    async def route(self, ctx: RequestContext, request: Any, handler: Handler) -> Any:
        node = self.node_of(ctx)
        api_key = ctx.api_key
        if api_key in FORWARDED and self.forward is not None:
            return await self.forward(ctx, request, handler)
        if api_key == LIST_GROUPS:
            response = await handler(ctx, request)
            assert isinstance(response, M.ListGroupsResponse)
            response.groups = [g for g in response.groups or ()
                               if self.view.coordinator(KEY_TYPE_GROUP, g.group_id) == node]
            return response
        transactional_id = transactional_id_of(api_key, ctx.api_version, request)
        if transactional_id is not None:
            code = self.coordinator_error(KEY_TYPE_TRANSACTION, transactional_id, node)
            if code is not None:
                return fail_whole(ctx, request, code)
            return await handler(ctx, request)
        metadata = self.metadata()
        refused = False  # only a response with refused entries is walked for leader hints
        if api_key in GROUP_APIS:
            def error_for(key: Key) -> ErrorCode | None:
                return self.coordinator_error(KEY_TYPE_GROUP, key.group, node) if key.group is not None else None
        elif api_key in LEADER_APIS:
            acks_all = api_key == PRODUCE and request.acks == -1

            def error_for(key: Key) -> ErrorCode | None:
                nonlocal refused
                if key.topic is None or key.partition is None or metadata.topic(key.topic) is None:
                    return None  # the handler answers what does not exist
                leader, _, isr = self.view.assignment(key.topic, key.partition)
                if leader != node:
                    refused = True
                    return E.NOT_LEADER_OR_FOLLOWER
                if acks_all and len(isr) < self.min_insync_replicas(key.topic):
                    return E.NOT_ENOUGH_REPLICAS
                return None
        else:
            return await handler(ctx, request)
        if api_key == FETCH:
            # the handler checks each partition it reads: a fetch session's are not all in the request
            ctx.partition_error = lambda topic, index: error_for(Key(topic=topic, partition=index))
            response = await handler(ctx, request)
        else:
            response = await answer_in_part(ctx, request, handler, error_for, self._resolve)
        hints = LEADER_HINTS.get(api_key)
        if (refused or api_key in HANDLER_REFUSES) and hints is not None and ctx.api_version >= hints[0]:
            self._add_leader_hints(ctx, response, hints[1])
        return response

    def coordinator_error(self, key_type: int, key: str, node: int) -> ErrorCode | None:
        coordinator = self.view.coordinator(key_type, key)
        if coordinator == node:
            return None
        return E.COORDINATOR_NOT_AVAILABLE if coordinator < 0 else E.NOT_COORDINATOR

    def _add_leader_hints(self, ctx: Any, response: Any, codes: frozenset[ErrorCode]) -> None:
        """Fill current_leader in the refused partitions and the leaders' endpoints (KIP-951)."""
        listener = ctx.connection.listener.name if ctx.connection.listener is not None else None
        metadata = self.metadata()
        leaders: set[int] = set()
        produce = ctx.api_key == PRODUCE
        for topic in response.responses or ():
            name = (topic.name if produce else getattr(topic, "topic", None)) or self._resolve(topic.topic_id)
            info = metadata.topic(name) if name else None
            for part in topic.partition_responses if produce else topic.partitions:
                if part.error_code not in codes or info is None:
                    continue
                found = info.assignments.get(part.index if produce else part.partition_index)
                if found is None:
                    continue
                part.current_leader = type(response).LeaderIdAndEpoch(leader_id=found.leader,
                                                                      leader_epoch=found.leader_epoch)
                if found.leader >= 0:
                    leaders.add(found.leader)
        endpoints = []
        for node in sorted(leaders):
            address = self.view.address(node, listener)
            if address is not None:
                endpoints.append(type(response).NodeEndpoint(node_id=node, host=address[0], port=address[1],
                                                             rack=self.view.rack(node)))
        response.node_endpoints = endpoints

    def _resolve(self, topic_id: Any) -> str | None:
        info = self.metadata().topic_by_id(topic_id)
        return info.name if info is not None else None


def transactional_id_of(api_key: int, version: int, request: Any) -> str | None:
    """The transactional id a request names for its coordinator, None when it names none."""
    if api_key == ADD_PARTITIONS_TO_TXN:
        return request.v3_and_below_transactional_id if version <= 3 else None  # type: ignore[no-any-return]
    field = TRANSACTION_FIELDS.get(api_key)
    return getattr(request, field) if field is not None else None
