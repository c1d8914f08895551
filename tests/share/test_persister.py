"""The share-state RPCs' client (broker/share/persister.py) against in-memory share coordinators
served by the real handlers (broker/apis/share_state.py), every request and response encoded and
decoded at its version: a round trip, Kafka's batching per node and API, retries with a fresh
coordinator lookup and Kafka's backoff, the errors that are not retried, and the local/remote
switch. Time is injected: the backoff's sleeps are recorded, not slept."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

from broker.apis import APIS, load_handlers
from broker.coordinator.runtime import InMemoryWriter
from broker.coordinator.share import ShareCoordinator, StateBatch, WriteState, create_share_coordinator
from broker.coordinator.share.records import ShareKey
from broker.coordinator.timer import ManualClock
from broker.share.persister import Backoff, RemoteSharePersister, ShareStateRouter
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode
T = uuid.UUID("00000000-0000-0000-0000-0000000000bb")
KEY = ("g", T, 0)
AVAILABLE, ACKNOWLEDGED = 0, 2
INITIALIZE, READ, WRITE, DELETE, SUMMARY = 83, 84, 85, 86, 87
load_handlers()


async def coordinator(partitions: int = 1) -> ShareCoordinator:
    c = create_share_coordinator(InMemoryWriter(), {"share.coordinator.state.topic.num.partitions": partitions},
                                 ManualClock(), partition_exists=lambda topic_id, index: 0 <= index < 8)
    await c.start()
    return c


class Node:
    """An inter-broker client to a node whose share coordinator is `coordinator`: each request is
    encoded, decoded, served by the registered handler, and its response encoded and decoded."""

    def __init__(self, coordinator: ShareCoordinator) -> None:
        self.broker = SimpleNamespace(share_coordinator=coordinator, authorizer=None)
        self.requests: list[tuple[int, int, Any]] = []
        self.before: Callable[[int, Any], Any] | None = None  # may raise, or hold the request

    async def call(self, api_key: int, version: int, request: Any) -> Any:
        self.requests.append((api_key, version, request))
        if self.before is not None:
            await self.before(api_key, request)
        decoded = M.decode_request(api_key, version, M.encode(request, version))
        ctx = SimpleNamespace(broker=self.broker, api_key=api_key, api_version=version, connection=None,
                              client_host="127.0.0.1")
        response = await APIS[api_key].handler(ctx, decoded)
        return M.decode_response(api_key, version, M.encode(response, version))

    def sent(self, api_key: int | None = None) -> list[list[ShareKey]]:
        """The share-partitions of each request sent (of one API)."""
        return [[(r.group_id, t.topic_id, p.partition) for t in r.topics for p in t.partitions]
                for key, _, r in self.requests if api_key is None or key == api_key]


class Sleeps:
    def __init__(self) -> None:
        self.delays: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.delays.append(seconds)


def persister(coordinator_of: Callable[[ShareKey], int], nodes: dict[int, Node], sleeps: Sleeps | None = None
              ) -> RemoteSharePersister:
    return RemoteSharePersister(coordinator_of, lambda node: nodes[node], Backoff(initial_ms=100, max_ms=1000),
                                sleep=sleeps or Sleeps(), rand=lambda: 0.5)


def test_kafkas_exponential_backoff() -> None:
    backoff = Backoff()  # 1 s doubling, jitter 0.2, at most 30 s
    assert [backoff.delay_ms(n, 0.5) for n in (1, 2, 3, 4, 5)] == [2000, 4000, 8000, 16000, 30000]
    assert backoff.delay_ms(1, 0.0) == pytest.approx(1600) and backoff.delay_ms(1, 0.999999) == pytest.approx(2400)


async def test_a_round_trip_through_the_rpcs() -> None:
    remote = await coordinator()
    node = Node(remote)
    p = persister(lambda key: 1, {1: node})
    assert await p.read_state_as_leader(KEY, 2) is None  # no state yet: INVALID_REQUEST answers None
    # the first write of a share-partition without state initializes it, then writes
    await p.write_state(WriteState(KEY, 0, 2, 5, 0, ()))
    assert [key for key, _, _ in node.requests] == [READ, WRITE, INITIALIZE, WRITE]
    await p.write_state(WriteState(KEY, 0, 2, 5, 3, (StateBatch(5, 7, ACKNOWLEDGED, 1), StateBatch(8, 9, AVAILABLE, 2))))
    state = await p.read_state_as_leader(KEY, 2)
    assert state is not None
    assert (state.state_epoch, state.start_offset, state.state_batches) == (
        0, 5, (StateBatch(5, 7, ACKNOWLEDGED, 1), StateBatch(8, 9, AVAILABLE, 2)))
    stored = await remote.read_state(KEY)
    assert stored is not None and (stored.leader_epoch, stored.delivery_complete_count) == (2, 3)
    summary = await p.read_summary(KEY)
    assert (summary.start_offset, summary.state_epoch, summary.leader_epoch, summary.delivery_complete_count) == (
        5, 0, 2, 3)
    # the group coordinator's uses: a new state epoch at a new start offset, then the deletion
    await p.initialize_state(KEY, 1, 20)
    with pytest.raises(KafkaError) as fenced:
        await p.write_state(WriteState(KEY, 0, 2, 21, 0, ()))
    assert fenced.value.code is E.FENCED_STATE_EPOCH  # not retried
    await p.delete_state([KEY, ("g", T, 1)])
    assert await p.read_state_as_leader(KEY, 2) is None
    assert (await p.read_summary(KEY)).start_offset == -1
    # an older leader is fenced once a newer one read
    await p.initialize_state(KEY, 0, 0)
    assert await p.read_state_as_leader(KEY, 4) is not None
    with pytest.raises(KafkaError) as err:
        await p.read_state_as_leader(KEY, 3)
    assert err.value.code is E.FENCED_LEADER_EPOCH
    assert [version for key, version, _ in node.requests if key in (WRITE, SUMMARY)] == [1] * 6  # WRITE x4, SUMMARY x2
    await remote.stop()


async def test_what_is_asked_together_goes_in_one_request_per_group_one_key_at_most() -> None:
    node = Node(await coordinator(partitions=4))
    p = persister(lambda key: 1, {1: node})
    keys = [("g", T, i) for i in range(4)] + [("h", T, i) for i in range(2)]
    await asyncio.gather(*(p.initialize_state(key, 0, 0) for key in keys))
    assert sorted(map(sorted, node.sent(INITIALIZE))) == [sorted(keys[:4]), sorted(keys[4:])]
    node.requests.clear()
    # two writes of one share-partition never share a request: the second goes in the next, in order
    first = WriteState(KEY, 0, 0, 0, 0, (StateBatch(0, 4, AVAILABLE, 1),))
    second = WriteState(KEY, 0, 0, 3, 0, (StateBatch(3, 4, ACKNOWLEDGED, 1),))
    await asyncio.gather(p.write_state(first), p.write_state(second), p.write_state(WriteState(("g", T, 1), 0, 0, 9, 0, ())))
    assert node.sent(WRITE) == [[KEY, ("g", T, 1)], [KEY]]
    state = await p.read_state_as_leader(KEY, 0)
    assert state is not None and (state.start_offset, state.state_batches) == (3, (StateBatch(3, 4, ACKNOWLEDGED, 1),))


async def test_one_request_in_flight_per_node_and_api_the_rest_batched_behind_it() -> None:
    node = Node(await coordinator(partitions=4))
    p = persister(lambda key: 1, {1: node})
    release = asyncio.Event()
    held: list[int] = []

    async def hold_the_first(api_key: int, request: Any) -> None:
        if not held:
            held.append(api_key)
            await release.wait()

    node.before = hold_the_first
    first = asyncio.ensure_future(p.initialize_state(("g", T, 0), 0, 0))
    while not held:
        await asyncio.sleep(0)
    later = [asyncio.ensure_future(p.initialize_state(("g", T, i), 0, 0)) for i in (1, 2, 3)]
    summary = asyncio.ensure_future(p.read_summary(("g", T, 5)))  # another API: not held behind it
    assert (await summary).start_offset == -1
    await asyncio.sleep(0)
    assert node.sent(INITIALIZE) == [[("g", T, 0)]]
    release.set()
    await asyncio.gather(first, *later)
    assert node.sent(INITIALIZE) == [[("g", T, 0)], [("g", T, 1), ("g", T, 2), ("g", T, 3)]]


async def test_not_coordinator_is_retried_with_a_fresh_lookup() -> None:
    moved, settled = await coordinator(), await coordinator()
    await moved.runtime.unload(0)  # the key's __share_group_state partition is no longer led there
    nodes = {1: Node(moved), 2: Node(settled)}
    lookups: list[int] = []

    def coordinator_of(key: ShareKey) -> int:
        lookups.append(1 if not lookups else 2)
        return lookups[-1]

    sleeps = Sleeps()
    p = persister(coordinator_of, nodes, sleeps)
    await p.initialize_state(KEY, 0, 7)
    assert lookups == [1, 2] and sleeps.delays == [0.2]  # initial 100 ms x 2^1, rand 0.5: no jitter
    assert len(nodes[1].requests) == len(nodes[2].requests) == 1
    assert (await settled.read_summary(KEY)).start_offset == 7


@pytest.mark.parametrize("code", [E.NOT_COORDINATOR, E.COORDINATOR_LOAD_IN_PROGRESS, E.COORDINATOR_NOT_AVAILABLE,
                                  E.UNKNOWN_TOPIC_OR_PARTITION])
async def test_retriable_errors_are_retried_five_times_then_raised(code: ErrorCode) -> None:
    node = Node(await coordinator())

    async def refuse(api_key: int, request: Any) -> None:
        raise KafkaError(code, "refused")  # as the node's client raises when it cannot reach the node

    node.before = refuse
    sleeps = Sleeps()
    p = persister(lambda key: 1, {1: node}, sleeps)
    with pytest.raises(KafkaError) as err:
        await p.write_state(WriteState(KEY, 0, 0, 0, 0, ()))
    assert err.value.code is code
    assert len(node.requests) == 5
    assert sleeps.delays == [0.2, 0.4, 0.8, 1.0]  # doubling, at most max_ms


async def test_no_coordinator_and_an_unreachable_node_are_retried() -> None:
    node = Node(await coordinator())
    lookups = itertools.chain([-1], itertools.repeat(1))
    failures = [ConnectionRefusedError(111, "refused")]

    async def drop_once(api_key: int, request: Any) -> None:
        if failures:
            raise failures.pop()

    node.before = drop_once
    sleeps = Sleeps()
    p = persister(lambda key: next(lookups), {1: node}, sleeps)
    await p.initialize_state(KEY, 0, 3)
    assert len(sleeps.delays) == 2 and len(node.requests) == 2
    assert (await p.read_summary(KEY)).start_offset == 3


async def test_errors_that_are_not_retried() -> None:
    node = Node(await coordinator())
    sleeps = Sleeps()
    p = persister(lambda key: 1, {1: node}, sleeps)
    await p.initialize_state(KEY, 3, 0)
    with pytest.raises(KafkaError) as err:
        await p.initialize_state(KEY, 2, 0)
    assert (err.value.code, err.value.message) == (
        E.FENCED_STATE_EPOCH, "The share coordinator rejected the request because the share-group state epoch did not "
                              "match.")
    with pytest.raises(KafkaError) as err:
        await p.initialize_state(("g", T, -1), 3, 0)
    assert (err.value.code, err.value.message) == (E.INVALID_REQUEST, "The partition id cannot be a negative number.")
    assert sleeps.delays == []


async def test_the_router_calls_the_local_coordinator_for_its_own_keys() -> None:
    local, remote = await coordinator(), await coordinator()
    node = Node(remote)
    owner = {KEY: 0, ("g", T, 1): 1}
    router = ShareStateRouter(0, local, lambda key: owner[key], lambda n: node,
                              Backoff(initial_ms=100, max_ms=1000), sleep=Sleeps(), rand=lambda: 0.5)
    for key in owner:
        assert await router.read_state_as_leader(key, 0) is None
        await router.write_state(WriteState(key, 0, 0, 4, 1, (StateBatch(4, 4, ACKNOWLEDGED, 1),)))
    assert {k for keys in node.sent() for k in keys} == {("g", T, 1)}  # the local key never went out
    assert await local.read_state(("g", T, 1)) is None and await remote.read_state(KEY) is None
    # both paths answer the same: what the RPCs carry
    local_read, remote_read = await router.read_state_as_leader(KEY, 0), await router.read_state_as_leader(("g", T, 1), 0)
    assert local_read is not None and remote_read is not None
    assert (local_read.start_offset, local_read.state_batches, local_read.leader_epoch,
            local_read.delivery_complete_count) == (
        remote_read.start_offset, remote_read.state_batches, remote_read.leader_epoch,
        remote_read.delivery_complete_count)
    local_summary, remote_summary = await router.read_summary(KEY), await router.read_summary(("g", T, 1))
    assert local_summary == remote_summary
    # the local partition moves away: NOT_COORDINATOR, looked up again, sent to the new coordinator
    await local.runtime.unload(0)
    owner[KEY] = 0
    lookups = iter([0, 1])
    router.coordinator_of = lambda key: next(lookups)
    await router.delete_state([KEY])
    assert node.sent(DELETE) == [[KEY]]


async def test_a_closed_persister_answers_what_waits() -> None:
    node = Node(await coordinator())
    never = asyncio.Event()

    async def hang(api_key: int, request: Any) -> None:
        await never.wait()

    node.before = hang
    p = persister(lambda key: 1, {1: node})
    waiting = asyncio.ensure_future(p.initialize_state(KEY, 0, 0))
    while not node.requests:
        await asyncio.sleep(0)
    queued = asyncio.ensure_future(p.initialize_state(("g", T, 1), 0, 0))
    await asyncio.sleep(0)
    await p.close()
    for task in (waiting, queued):
        with pytest.raises(KafkaError) as err:
            await task
        assert err.value.code is E.COORDINATOR_NOT_AVAILABLE
