"""Share-partition state on another node, over real connections: two brokers in one test, A
serving a share group's data partition and its engine, B the share coordinator of the
share-partition's key (the topic is registered in B's metadata under A's topic id, as a cluster's
shared metadata would have it). A's engine persists through the share-state RPCs to B, a restarted
A reads its state back from B, the group coordinator's uses (initialize, delete) go the same way,
a NOT_COORDINATOR from a node that no longer coordinates the key sends the request to the next
one the lookup names, and one still loading is retried."""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from broker.cluster.client import NodeClient
from broker.coordinator.share import StateBatch, WriteState
from broker.coordinator.share.records import ShareKey
from broker.share.persister import Backoff, RemoteSharePersister, ShareStateRouter
from protocol.errors import ErrorCode, KafkaError
from tests.integration.test_server_support import BrokerThread
from tests.integration.test_share_raw import Share, ack_batch, acquired, partition_of

E = ErrorCode
AVAILABLE, ACKNOWLEDGED, RELEASE = 0, 2, 2
FAST = Backoff(initial_ms=10, max_ms=50)


@pytest.fixture
def brokers(tmp_path: Path) -> Iterator[tuple[BrokerThread, BrokerThread]]:
    with BrokerThread(tmp_path / "a", **{"node.id": "1"}) as a, BrokerThread(tmp_path / "b", **{"node.id": "2"}) as b:
        yield a, b


async def _register(broker: BrokerThread, name: str, topic_id: uuid.UUID, partitions: int) -> None:
    broker.broker.metadata.create_topic(name, partitions, {}, topic_id=topic_id)


def register(broker: BrokerThread, name: str, topic_id: uuid.UUID, partitions: int = 1) -> None:
    """The topic in `broker`'s metadata under the same id (its data stays on the other node)."""
    broker.call(_register(broker, name, topic_id, partitions))


def clients_to(*nodes: tuple[int, BrokerThread]) -> Callable[[int], NodeClient]:
    """client_for over real connections (made on the loop that first uses them)."""
    made: dict[int, NodeClient] = {}
    ports = {node: broker.port for node, broker in nodes}

    def client_for(node: int) -> NodeClient:
        if node not in made:
            made[node] = NodeClient(lambda: ("127.0.0.1", ports[node]), "share-state-test")
        return made[node]

    return client_for


async def _wire(a: BrokerThread, b: BrokerThread) -> ShareStateRouter:
    """A's share-partition manager persisting to B (every key coordinated by node 2)."""
    app = a.broker
    router = ShareStateRouter(app.node_id, app.share_coordinator, lambda key: 2, clients_to((2, b)), FAST)
    app.share_manager.persister = router
    return router


def test_an_engine_persists_to_the_share_coordinator_of_another_node_and_reads_it_back(
        brokers: tuple[BrokerThread, BrokerThread]) -> None:
    a, b = brokers
    s = Share(a, a.client(), records=10)
    key = (s.group, s.topic_id, 0)
    register(b, s.topic, s.topic_id)
    a.call(_wire(a, b))
    s.join()
    assert acquired(s.fetch(0, [0])) == [(0, 9, 1)]
    done = s.acknowledge(1, {0: [ack_batch(0, 4), ack_batch(5, 6, RELEASE)]})
    assert partition_of(done).error_code == 0
    on_b = b.call(b.broker.share_coordinator.read_state(key))
    assert on_b is not None and on_b.delivery_complete_count == 5  # the start offset moves at the next write
    assert on_b.state_batches == (StateBatch(0, 4, ACKNOWLEDGED, 1), StateBatch(5, 6, AVAILABLE, 1))
    assert on_b.leader_epoch == a.broker.leader_epoch_of(s.topic, 0)  # the engine's read recorded it
    assert a.call(a.broker.share_coordinator.read_state(key)) is None  # nothing went to A's own coordinator
    s.fetch(-1)  # the session ends: 7-9 are released, through B too
    s.leave()
    s.client.close()

    a.restart()  # a new engine, nothing of the share-partition in A's memory or A's __share_group_state
    router = a.call(_wire(a, b))
    s.client, s.member, s.epoch = a.client(), uuid.uuid4().hex[:22], 0
    s.join()
    assert acquired(s.fetch(0, [0])) == [(5, 6, 2), (7, 9, 1)]  # from B's state: 0-4 done, 5-6 delivered once
    assert a.call(a.broker.share_coordinator.read_state(key)) is None
    s.fetch(-1)
    s.leave()
    s.client.close()

    # the group coordinator's uses: AlterShareGroupOffsets' initialization, a deleted group's state
    a.call(router.initialize_state(key, 1, 8))
    on_b = b.call(b.broker.share_coordinator.read_state(key))
    assert on_b is not None and (on_b.state_epoch, on_b.start_offset, on_b.state_batches) == (1, 8, ())
    summary = a.call(router.read_summary(key))
    assert (summary.start_offset, summary.state_epoch, summary.delivery_complete_count) == (8, 1, 0)
    keys = a.call(a.broker.group_coordinator.share_state_keys(s.group))
    assert keys == [key]
    a.call(router.delete_state(keys))
    assert b.call(b.broker.share_coordinator.read_state(key)) is None
    assert a.errors == [] and b.errors == []


def test_not_coordinator_sends_the_request_to_the_coordinator_the_next_lookup_names(
        brokers: tuple[BrokerThread, BrokerThread]) -> None:
    a, b = brokers
    topic_id = b.create_topic("moved", 1).topic_id
    register(a, "moved", topic_id)
    key = ("moved-group", topic_id, 0)
    # A no longer leads the key's __share_group_state partition
    a.call(a.broker.share_coordinator.runtime.unload(a.broker.share_coordinator.partition_for(key)))
    looked_up: list[int] = []
    answers = itertools.chain([1], itertools.repeat(2))

    def coordinator_of(k: ShareKey) -> int:
        looked_up.append(next(answers))
        return looked_up[-1]

    persister = RemoteSharePersister(coordinator_of, clients_to((1, a), (2, b)), FAST)
    a.call(persister.initialize_state(key, 0, 3))
    assert looked_up == [1, 2]
    on_b = b.call(b.broker.share_coordinator.read_state(key))
    assert on_b is not None and on_b.start_offset == 3
    assert a.call(persister.read_state_as_leader(key, 0)) is not None

    # a coordinator still loading (fault injection on B, partition by partition): retried
    loading = b.faults.fail("WriteShareGroupState", "COORDINATOR_LOAD_IN_PROGRESS", times=2, group="moved-group")
    a.call(persister.write_state(WriteState(key, 0, 0, 3, 1, (StateBatch(3, 3, ACKNOWLEDGED, 1),))))
    assert loading.injected == 2
    on_b = b.call(b.broker.share_coordinator.read_state(key))
    assert on_b is not None and on_b.state_batches == (StateBatch(3, 3, ACKNOWLEDGED, 1),)

    # a coordinator that stays wrong: Kafka's 5 attempts, then its error
    stuck = RemoteSharePersister(lambda k: 1, clients_to((1, a)), FAST)
    assert a.call(code_of(stuck.initialize_state(key, 0, 0))) is E.NOT_COORDINATOR


async def code_of(operation: Awaitable[Any]) -> ErrorCode | None:
    try:
        await operation
    except KafkaError as exc:
        return exc.code
    return None
