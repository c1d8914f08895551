"""Share-partition state on another node: the share-state RPCs' client (Kafka's DefaultStatePersister
and PersisterStateManager), and the switch between it and this node's share coordinator.

A share-partition's state lives with the share coordinator of its key, the leader of a
`__share_group_state` partition (broker/coordinator/share/), maybe on another node than the
share-partition's engine (broker/share/manager.py, beside the data partition's leader) or the
group coordinator that initializes and deletes it. Two functions are injected:
`coordinator_of(key)`, the node coordinating a key now (-1: none), and `client_for(node)`, an
inter-broker client whose `async call(api_key, version, request)` answers the response (raising
KafkaError or OSError when the node cannot be reached).

`RemoteSharePersister` sends InitializeShareGroupState (83), ReadShareGroupState (84),
WriteShareGroupState (85 v1), DeleteShareGroupState (86) and ReadShareGroupStateSummary (87 v1):
- batching as PersisterStateManager: per node and API one request in flight; what is asked
  meanwhile goes in the next request, one per group (a key at most once a request, so that two
  writes of one share-partition stay in order);
- retries of a partition's NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS,
  COORDINATOR_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION (the coordinator may not have the topic in
  its metadata yet) and of an unreachable node: the coordinator looked up again each time, Kafka's
  exponential backoff (1 s doubling, jittered, at most 30 s; 5 attempts), then the last error;
- errors raised as KafkaError with the partition's code, as the local coordinator raises them (the
  manager maps them as Kafka's SharePartition does).

Our engine creates a share-partition's state at its first load (Kafka's group coordinator
initializes it at assignment; ours records it as initialized only): a read of a share-partition
without state (INVALID_REQUEST) answers None, as the local coordinator's read does, and a write to
one initializes it at the write's state epoch and start offset first (InitializeShareGroupState),
as the local coordinator's write creates it.

`ShareStateRouter` is the one the broker wires: a key this node coordinates goes to the local
share coordinator with no network hop, any other through the RPCs; either path answers the same
(the local answers are cut down to what the RPCs carry) and is retried the same way. It has the
local coordinator's initialize_state / delete_state, and read_summary for
DescribeShareGroupOffsets (Kafka reads it with ReadShareGroupStateSummary); a deleted share
group's keys come from GroupCoordinator.share_state_keys, not from a scan of this node's shards.
`close()` at the broker's stop.
"""

from __future__ import annotations

import asyncio
import random
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from broker.coordinator.share.coordinator import ShareCoordinator
from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import WriteState
from broker.coordinator.share.state import NO_LEADER_EPOCH, ShareGroupOffset, StateBatch
from broker.observability.logger import get_logger
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.share")

E = ErrorCode
T = TypeVar("T")
RETRIABLE = frozenset([E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE,
                       E.UNKNOWN_TOPIC_OR_PARTITION, E.NETWORK_EXCEPTION, E.REQUEST_TIMED_OUT])
_CODES = {int(code): code for code in ErrorCode}


class InterBrokerClient(Protocol):
    async def call(self, api_key: int, version: int, request: Any) -> Any: ...


CoordinatorOf = Callable[[ShareKey], int]
ClientFor = Callable[[int], InterBrokerClient]


@dataclass(frozen=True)
class Backoff:
    """Kafka's PersisterStateManager: REQUEST_BACKOFF_MS, REQUEST_BACKOFF_MAX_MS,
    MAX_FIND_COORD_ATTEMPTS, CommonClientConfigs' exponent base 2 and jitter 0.2."""

    initial_ms: float = 1000.0
    max_ms: float = 30000.0
    attempts: int = 5
    jitter: float = 0.2

    def delay_ms(self, failures: int, rand: float) -> float:
        """The wait after the `failures`-th failed attempt (ExponentialBackoff.backoff(failures)),
        `rand` uniform in [0, 1)."""
        term = self.initial_ms * 2 ** failures * (1 - self.jitter + 2 * self.jitter * rand)
        return min(term, self.max_ms)


@dataclass(frozen=True)
class _Api:
    key: int
    version: int
    request: Any
    topic: str  # the request's per-topic struct
    name: str


INITIALIZE = _Api(83, 0, M.InitializeShareGroupStateRequest, "InitializeStateData", "initialize state")
READ = _Api(84, 0, M.ReadShareGroupStateRequest, "ReadStateData", "read state")
WRITE = _Api(85, 1, M.WriteShareGroupStateRequest, "WriteStateData", "write state")
DELETE = _Api(86, 0, M.DeleteShareGroupStateRequest, "DeleteStateData", "delete state")
SUMMARY = _Api(87, 1, M.ReadShareGroupStateSummaryRequest, "ReadStateSummaryData", "read state summary")

Answer = tuple[ErrorCode, "str | None", Any]  # a partition's error code, message and PartitionResult


class _Call:
    __slots__ = ("data", "future", "key")

    def __init__(self, key: ShareKey, data: Any, future: asyncio.Future[Answer]) -> None:
        self.key, self.data, self.future = key, data, future


class _Lane:
    """The requests of one API to one node: one in flight, the rest waiting for the next."""

    __slots__ = ("busy", "pending")

    def __init__(self) -> None:
        self.pending: list[_Call] = []
        self.busy = False


def _read_answer(state: ShareGroupOffset) -> ShareGroupOffset:
    """What ReadShareGroupState carries of a state."""
    return ShareGroupOffset(state_epoch=state.state_epoch, start_offset=state.start_offset,
                            state_batches=state.state_batches)


def _summary_answer(state: ShareGroupOffset) -> ShareGroupOffset:
    """What ReadShareGroupStateSummary (v1) carries of a state."""
    return ShareGroupOffset(state_epoch=state.state_epoch, leader_epoch=state.leader_epoch,
                            start_offset=state.start_offset, delivery_complete_count=state.delivery_complete_count)


class RemoteSharePersister:
    """The share-partition persister over the share-state RPCs (see the module docstring)."""

    def __init__(self, coordinator_of: CoordinatorOf, client_for: ClientFor, backoff: Backoff = Backoff(),
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 rand: Callable[[], float] = random.random) -> None:
        self.coordinator_of = coordinator_of
        self.client_for = client_for
        self.backoff = backoff
        self._sleep = sleep
        self._rand = rand
        self._lanes: dict[tuple[int, int], _Lane] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    # ----- the persister ------------------------------------------------------------------
    async def read_state_as_leader(self, key: ShareKey, leader_epoch: int) -> ShareGroupOffset | None:
        """The state (start offset, state epoch, batches) as the leader of `leader_epoch` reads
        it: a newer epoch is recorded, an older one fenced (FENCED_LEADER_EPOCH); None without state."""
        data = M.ReadShareGroupStateRequest.PartitionData(partition=key[2], leader_epoch=leader_epoch)

        def answer(p: Any) -> ShareGroupOffset:
            return ShareGroupOffset(state_epoch=p.state_epoch, start_offset=p.start_offset, state_batches=tuple(
                StateBatch(b.first_offset, b.last_offset, b.delivery_state, b.delivery_count) for b in p.state_batches))

        async def local(c: ShareCoordinator) -> ShareGroupOffset:
            return _read_answer(await c.read_for_leader(key, leader_epoch))

        try:
            return await self._run(key, READ, data, local, answer)
        except KafkaError as exc:
            if exc.code is E.INVALID_REQUEST:  # a share-partition without state
                return None
            raise

    async def read_state(self, key: ShareKey) -> ShareGroupOffset | None:
        """A read without a leader epoch (-1): refused as fenced once a leader's epoch is recorded,
        as in Kafka; the share-partition manager reads with `read_state_as_leader`."""
        return await self.read_state_as_leader(key, NO_LEADER_EPOCH)

    async def write_state(self, write: WriteState) -> None:
        try:
            await self._write(write)
        except KafkaError as exc:
            if exc.code is not E.INVALID_REQUEST:
                raise
            # no state yet (see the module docstring): initialized, then written
            await self.initialize_state(write.key, write.state_epoch, write.start_offset)
            await self._write(write)

    async def _write(self, write: WriteState) -> None:
        R = M.WriteShareGroupStateRequest
        data = R.PartitionData(
            partition=write.key[2], state_epoch=write.state_epoch, leader_epoch=write.leader_epoch,
            start_offset=write.start_offset, delivery_complete_count=write.delivery_complete_count,
            state_batches=[R.StateBatch(first_offset=b.first_offset, last_offset=b.last_offset,
                                        delivery_state=b.delivery_state, delivery_count=b.delivery_count)
                           for b in write.batches])
        await self._run(write.key, WRITE, data, lambda c: c.write_state(write), lambda p: None)

    async def initialize_state(self, key: ShareKey, state_epoch: int, start_offset: int) -> None:
        """A fresh state at `start_offset` under `state_epoch` (the group coordinator's, at an
        alteration of the share group's offsets)."""
        data = M.InitializeShareGroupStateRequest.PartitionData(partition=key[2], state_epoch=state_epoch,
                                                                start_offset=start_offset)
        await self._run(key, INITIALIZE, data, lambda c: c.initialize_state(key, state_epoch, start_offset),
                        lambda p: None)

    async def delete_state(self, keys: list[ShareKey]) -> None:
        """Delete the state of `keys` (a deleted share group's, a deleted topic's); raises the first
        error once every key was tried."""
        async def one(key: ShareKey) -> None:
            data = M.DeleteShareGroupStateRequest.PartitionData(partition=key[2])
            await self._run(key, DELETE, data, lambda c: c.delete_state([key]), lambda p: None)

        for outcome in await asyncio.gather(*(one(k) for k in keys), return_exceptions=True):
            if isinstance(outcome, BaseException):
                raise outcome

    async def read_summary(self, key: ShareKey) -> ShareGroupOffset:
        """Start offset, state and leader epochs and delivery-complete count (start offset -1 and
        epochs 0 for a share-partition without state), for DescribeShareGroupOffsets."""
        data = M.ReadShareGroupStateSummaryRequest.PartitionData(partition=key[2], leader_epoch=NO_LEADER_EPOCH)

        def answer(p: Any) -> ShareGroupOffset:
            return ShareGroupOffset(state_epoch=p.state_epoch, leader_epoch=p.leader_epoch,
                                    start_offset=p.start_offset, delivery_complete_count=p.delivery_complete_count)

        async def local(c: ShareCoordinator) -> ShareGroupOffset:
            return _summary_answer(await c.read_summary(key))

        return await self._run(key, SUMMARY, data, local, answer)

    async def close(self) -> None:
        """Stop sending: what waits, and what is asked from now on, answers COORDINATOR_NOT_AVAILABLE
        (not retried)."""
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for lane in self._lanes.values():
            for call in lane.pending:
                if not call.future.done():
                    call.future.set_result((E.COORDINATOR_NOT_AVAILABLE, "the persister is closed", None))
            lane.pending.clear()

    # ----- one key, retried ---------------------------------------------------------------
    def local_coordinator(self, node: int) -> ShareCoordinator | None:
        """The share coordinator to call in-process for keys `node` coordinates (none here)."""
        return None

    async def _run(self, key: ShareKey, api: _Api, data: Any, local: Callable[[ShareCoordinator], Awaitable[T]],
                   answer: Callable[[Any], T]) -> T:
        failures = 0
        while True:
            if self._closed:
                raise KafkaError(E.COORDINATOR_NOT_AVAILABLE, "the persister is closed")
            node = self.coordinator_of(key)
            try:
                if node < 0:
                    raise KafkaError(E.COORDINATOR_NOT_AVAILABLE, "no share coordinator for %s" % (key,))
                coordinator = self.local_coordinator(node)
                if coordinator is not None:
                    return await local(coordinator)
                code, message, result = await self._submit(node, api, key, data)
                if code is E.NONE:
                    return answer(result)
                raise KafkaError(code, message)
            except KafkaError as exc:
                failures += 1
                if exc.code not in RETRIABLE or self._closed:
                    raise
                if failures >= self.backoff.attempts:
                    raise KafkaError(exc.code, "%s of %s failed %d times, the last: %s" % (
                        api.name, key, failures, exc.message or exc.code.name)) from None
                delay = self.backoff.delay_ms(failures, self._rand())
                log.debug("share state request retried", api=api.name, group_id=key[0], topic_id=str(key[1]),
                          partition=key[2], node=node, error=exc.code.name, delay_ms=round(delay))
                await self._sleep(delay / 1000.0)

    # ----- batching per node and API ------------------------------------------------------
    async def _submit(self, node: int, api: _Api, key: ShareKey, data: Any) -> Answer:
        loop = asyncio.get_running_loop()
        lane = self._lanes.setdefault((node, api.key), _Lane())
        future: asyncio.Future[Answer] = loop.create_future()
        lane.pending.append(_Call(key, data, future))
        if not lane.busy:  # started on the next turn: what is asked in this one goes along
            lane.busy = True
            task = loop.create_task(self._drain(node, api, lane))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return await future

    async def _drain(self, node: int, api: _Api, lane: _Lane) -> None:
        try:
            while lane.pending:
                batch: dict[str, list[_Call]] = {}  # by group
                later: list[_Call] = []
                seen: set[ShareKey] = set()
                for call in lane.pending:
                    if call.future.done():  # its caller went away
                        continue
                    if call.key in seen:
                        later.append(call)
                    else:
                        seen.add(call.key)
                        batch.setdefault(call.key[0], []).append(call)
                lane.pending = later
                await asyncio.gather(*(self._send(node, api, group, calls) for group, calls in batch.items()))
        finally:
            lane.busy = False

    async def _send(self, node: int, api: _Api, group_id: str, calls: list[_Call]) -> None:
        by_topic: dict[uuid.UUID, list[Any]] = {}
        for call in calls:
            by_topic.setdefault(call.key[1], []).append(call.data)
        topic_class = getattr(api.request, api.topic)
        request = api.request(group_id=group_id, topics=[topic_class(topic_id=t, partitions=ps)
                                                          for t, ps in by_topic.items()])
        try:
            response = await self.client_for(node).call(api.key, api.version, request)
        except asyncio.CancelledError:  # closed while in flight
            self._answer_all(calls, (E.COORDINATOR_NOT_AVAILABLE, "the persister is closed", None))
            raise
        except KafkaError as exc:
            return self._answer_all(calls, (exc.code, exc.message, None))
        except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
            return self._answer_all(calls, (E.NETWORK_EXCEPTION, "node %d: %r" % (node, exc), None))
        except Exception as exc:
            log.exception("share state request failed", api=api.name, node=node)
            return self._answer_all(calls, (E.UNKNOWN_SERVER_ERROR, repr(exc), None))
        results = {(r.topic_id, p.partition): p for r in response.results for p in r.partitions}
        for call in calls:
            p = results.get((call.key[1], call.key[2]))
            if call.future.done():
                continue
            if p is None:
                call.future.set_result((E.UNKNOWN_SERVER_ERROR, "no answer for %s from node %d" % (call.key, node),
                                        None))
            else:
                call.future.set_result((_CODES.get(p.error_code, E.UNKNOWN_SERVER_ERROR), p.error_message, p))

    @staticmethod
    def _answer_all(calls: list[_Call], answer: Answer) -> None:
        for call in calls:
            if not call.future.done():
                call.future.set_result(answer)


class ShareStateRouter(RemoteSharePersister):
    """Share-partition state wherever its coordinator is: this node's share coordinator `local`
    directly for the keys `coordinator_of` gives to `node_id`, the share-state RPCs for others."""

    def __init__(self, node_id: int, local: ShareCoordinator, coordinator_of: CoordinatorOf,
                 client_for: ClientFor, backoff: Backoff = Backoff(),
                 sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
                 rand: Callable[[], float] = random.random) -> None:
        super().__init__(coordinator_of, client_for, backoff, sleep, rand)
        self.node_id = node_id
        self.local = local

    def local_coordinator(self, node: int) -> ShareCoordinator | None:
        return self.local if node == self.node_id else None


__all__ = ["RETRIABLE", "Backoff", "ClientFor", "CoordinatorOf", "InterBrokerClient", "RemoteSharePersister",
           "ShareStateRouter"]
