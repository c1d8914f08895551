"""The two inter-broker RPCs a transaction needs when its coordinator and its partitions' leaders
are different nodes of a cluster, as in Kafka:

- AddPartitionsToTxn v5, from a partition's leader to the transaction coordinator: verify that a
  transactional batch's partition is in the transaction (VerifyOnly, produce v3-11), or add it
  (transactions v2, produce v12+), Kafka's AddPartitionsToTxnManager;
- WriteTxnMarkers v2, from the coordinator to the leaders of the transaction's partitions
  (Kafka's TransactionMarkerChannelManager); the coordinator writes its own partitions' markers
  directly.

A node that cannot be reached makes the request's partitions answer COORDINATOR_NOT_AVAILABLE
(verification: the producer retries) or stay unwritten (markers: the coordinator retries them).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from broker.coordinator.txn import MarkerWrite
from broker.coordinator.txn.state import TopicPartition
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.coordinator.txn")

E = ErrorCode
ADD_PARTITIONS_TO_TXN, WRITE_TXN_MARKERS = 24, 27
ADD_PARTITIONS_VERSION, WRITE_MARKERS_VERSION = 5, 2
# a marker refused for these was written already or belongs to a fenced producer: not retried
_DONE = frozenset([E.NONE, E.INVALID_PRODUCER_EPOCH, E.TRANSACTION_COORDINATOR_FENCED, E.UNKNOWN_TOPIC_OR_PARTITION])


class NodeClient(Protocol):
    """A connection to another node (broker.cluster.client.NodeClient)."""

    async def call(self, api_key: int, version: int, request: Any) -> Any: ...


class RemoteTxnCoordinator:
    """The transaction coordinator of another node, as the produce path's verification uses it."""

    def __init__(self, client: NodeClient) -> None:
        self.client = client

    async def verify_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                                partitions: list[TopicPartition]) -> dict[TopicPartition, ErrorCode]:
        return await self._send(transactional_id, producer_id, producer_epoch, partitions, verify_only=True)

    async def add_partitions(self, transactional_id: str, producer_id: int, producer_epoch: int,
                             partitions: list[TopicPartition], transaction_version: int) -> ErrorCode:
        errors = await self._send(transactional_id, producer_id, producer_epoch, partitions, verify_only=False)
        return next((code for code in errors.values() if code is not E.NONE), E.NONE)

    async def _send(self, transactional_id: str, producer_id: int, producer_epoch: int,
                    partitions: list[TopicPartition], verify_only: bool) -> dict[TopicPartition, ErrorCode]:
        R = M.AddPartitionsToTxnRequest
        by_topic: dict[str, list[int]] = {}
        for topic, index in partitions:
            by_topic.setdefault(topic, []).append(index)
        request = R(transactions=[R.AddPartitionsToTxnTransaction(
            transactional_id=transactional_id, producer_id=producer_id, producer_epoch=producer_epoch,
            verify_only=verify_only, topics=[R.AddPartitionsToTxnTopic(name=t, partitions=p) for t, p in by_topic.items()])])
        try:
            response = await self.client.call(ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS_VERSION, request)
        except KafkaError as exc:
            return {tp: exc.code for tp in partitions}
        if response.error_code != E.NONE:
            return {tp: _code(response.error_code) for tp in partitions}
        errors = {(topic.name, p.partition_index): _code(p.partition_error_code)
                  for result in response.results_by_transaction for topic in result.topic_results
                  for p in topic.results_by_partition}
        return {tp: errors.get(tp, E.UNKNOWN_SERVER_ERROR) for tp in partitions}


def _code(value: int) -> ErrorCode:
    """The member for a code read off the wire (callers compare codes by identity)."""
    return ErrorCode(value)  # type: ignore[call-arg]  # a lookup by value, not a new member


async def _union(waits: list[Awaitable[set[TopicPartition]]]) -> set[TopicPartition]:
    """The partitions to try again, of every wait."""
    failed: set[TopicPartition] = set()
    for result in await asyncio.gather(*waits):
        failed |= result
    return failed


class RemoteMarkerWriter:
    """Markers for the transaction's partitions led here through `local` (a PartitionMarkerWriter),
    the others sent to their leaders (pending until they answer)."""

    def __init__(self, local: Any, node: int, leader_of: Callable[[str, int], int],
                 client_for: Callable[[int], NodeClient]) -> None:
        self.local = local
        self.node = node
        self.leader_of = leader_of
        self.client_for = client_for

    def append_markers(self, completion: Any, partitions: set[TopicPartition]) -> MarkerWrite:
        by_node: dict[int, set[TopicPartition]] = {}
        for tp in partitions:
            by_node.setdefault(self.leader_of(*tp), set()).add(tp)
        failed = by_node.pop(-1, set())  # no leader now: retried later
        local = by_node.pop(self.node, set())
        write = self.local.append_markers(completion, local) if local else MarkerWrite(set())
        failed |= write.failed
        waits: list[Awaitable[set[TopicPartition]]] = [self._remote(node, completion, tps)
                                                      for node, tps in by_node.items()]
        if write.pending is not None:
            waits.append(write.pending)
        return MarkerWrite(failed, asyncio.ensure_future(_union(waits)) if waits else None)

    async def _remote(self, node: int, completion: Any, partitions: set[TopicPartition]) -> set[TopicPartition]:
        R = M.WriteTxnMarkersRequest
        by_topic: dict[str, list[int]] = {}
        for topic, index in sorted(partitions):
            by_topic.setdefault(topic, []).append(index)
        request = R(markers=[R.WritableTxnMarker(
            producer_id=completion.producer_id, producer_epoch=completion.producer_epoch,
            transaction_result=completion.committed, coordinator_epoch=completion.coordinator_epoch,
            transaction_version=completion.transaction_version,
            topics=[R.WritableTxnMarkerTopic(name=t, partition_indexes=p) for t, p in by_topic.items()])])
        try:
            response = await self.client_for(node).call(WRITE_TXN_MARKERS, WRITE_MARKERS_VERSION, request)
        except KafkaError as exc:
            log.warning("transaction markers not sent", node=node, transactional_id=completion.transactional_id,
                        error=exc.message)
            return set(partitions)
        written = {(topic.name, p.partition_index) for marker in response.markers for topic in marker.topics
                   for p in topic.partitions if p.error_code in _DONE}
        return set(partitions) - written
