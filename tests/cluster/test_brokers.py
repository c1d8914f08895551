"""Broker registration, heartbeats and fencing on the controller (broker/cluster/brokers.py), as
Kafka's ClusterControlManager and BrokerHeartbeatManager: pure functions of the image."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from broker.cluster import brokers
from broker.cluster.snapshot import image_from_records, image_records
from broker.metadata import MetadataImage
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

CLUSTER = "cluster-a"
SESSION = 9000
R = M.BrokerRegistrationRequest


def registration(node: int, incarnation: uuid.UUID | None = None, cluster: str = CLUSTER,
                 features: dict[str, tuple[int, int]] | None = None) -> Any:
    return R(broker_id=node, cluster_id=cluster, incarnation_id=incarnation or uuid.uuid4(), rack=None,
             listeners=[R.Listener(name="PLAINTEXT", host="127.0.0.1", port=9000 + node, security_protocol=0)],
             features=[R.Feature(name=n, min_supported_version=lo, max_supported_version=hi)
                       for n, (lo, hi) in (features or {}).items()], log_dirs=[])


def beat(image: MetadataImage, node: int, offset: int | None = None, **flags: bool) -> Any:
    return M.BrokerHeartbeatRequest(broker_id=node, broker_epoch=image.brokers[node].epoch,
                                    current_metadata_offset=image.records if offset is None else offset,
                                    want_fence=flags.get("want_fence", False),
                                    want_shut_down=flags.get("want_shut_down", False), offline_log_dirs=[])


class Cluster:
    """An image and a heartbeat book, records replayed as the controller would write them."""

    def __init__(self) -> None:
        self.image = MetadataImage()
        self.heartbeats = brokers.Heartbeats()
        self.now = 0

    def apply(self, records: list[Any]) -> None:
        for r in records:
            self.image.replay(r)

    def register(self, request: Any) -> Any:
        outcome = brokers.register(self.image, self.heartbeats, request, CLUSTER, self.image.records, self.now,
                                   SESSION, {})
        self.apply(outcome.records)
        return outcome.response

    def heartbeat(self, request: Any) -> Any:
        outcome = brokers.heartbeat(self.image, self.heartbeats, request, self.now)
        self.apply(outcome.records)
        return outcome.response

    def topic(self, name: str, replicas: list[list[int]]) -> uuid.UUID:
        topic_id = uuid.uuid4()
        self.apply([M.TopicRecord(name=name, topic_id=topic_id)] + [
            M.PartitionRecord(partition_id=i, topic_id=topic_id, replicas=r, isr=r[:1], leader=r[0], leader_epoch=0)
            for i, r in enumerate(replicas)])
        return topic_id


def test_a_broker_registers_fenced_with_the_records_offset_as_its_epoch_and_is_unfenced_once_caught_up() -> None:
    c = Cluster()
    c.image.records = 41
    response = c.register(registration(1))
    assert response.broker_epoch == 41 and c.image.brokers[1].fenced
    behind = c.heartbeat(beat(c.image, 1, offset=40))
    assert (behind.is_caught_up, behind.is_fenced) == (False, True)
    caught_up = c.heartbeat(beat(c.image, 1))
    assert (caught_up.is_caught_up, caught_up.is_fenced) == (True, False) and not c.image.brokers[1].fenced


def test_a_second_process_with_the_same_id_is_refused_while_the_first_has_a_session() -> None:
    c = Cluster()
    c.register(registration(1))
    with pytest.raises(KafkaError) as failure:
        c.register(registration(1))
    assert failure.value.code == ErrorCode.DUPLICATE_BROKER_REGISTRATION
    c.now += SESSION + 1  # the first one stopped heartbeating: a restart may take the id
    assert c.register(registration(1)).error_code == 0


def test_the_same_incarnation_may_register_again() -> None:
    c = Cluster()
    incarnation = uuid.uuid4()
    first = c.register(registration(1, incarnation)).broker_epoch
    second = c.register(registration(1, incarnation)).broker_epoch
    assert second > first


@pytest.mark.parametrize(("request_", "code"), [
    (registration(1, cluster="other"), ErrorCode.INCONSISTENT_CLUSTER_ID),
    (registration(1, features={"metadata.version": (1, 5)}), ErrorCode.UNSUPPORTED_VERSION),
])
def test_refused_registrations(request_: Any, code: ErrorCode) -> None:
    c = Cluster()
    c.image.features["metadata.version"] = 27
    with pytest.raises(KafkaError) as failure:
        c.register(request_)
    assert failure.value.code == code


def test_heartbeats_of_unknown_or_stale_brokers_are_refused() -> None:
    c = Cluster()
    with pytest.raises(KafkaError) as failure:
        c.heartbeat(M.BrokerHeartbeatRequest(broker_id=7, broker_epoch=0, current_metadata_offset=0))
    assert failure.value.code == ErrorCode.BROKER_ID_NOT_REGISTERED
    c.register(registration(1))
    stale = beat(c.image, 1)
    stale.broker_epoch -= 1
    with pytest.raises(KafkaError) as failure:
        c.heartbeat(stale)
    assert failure.value.code == ErrorCode.STALE_BROKER_EPOCH


def test_a_broker_without_heartbeats_is_fenced_and_its_partitions_move_or_lose_their_leader() -> None:
    c = Cluster()
    for node in (1, 2):
        c.register(registration(node))
        c.heartbeat(beat(c.image, node))
    topic_id = c.topic("t", [[1, 2], [2, 1]])
    c.apply([M.PartitionChangeRecord(topic_id=topic_id, partition_id=1, isr=[2, 1], leader=-2)])
    c.now += SESSION - 1
    c.heartbeat(beat(c.image, 2))
    c.now += 2
    assert c.heartbeats.expired(c.image, c.now, SESSION) == [1]
    c.apply(brokers.fence(c.image, [1]))
    t = c.image.topics["t"]
    assert c.image.brokers[1].fenced
    assert t.assignments[0].leader == -1  # its only in-sync replica is fenced
    assert t.assignments[0].leader_epoch == 1
    assert t.assignments[1].leader == 2  # led by 2 all along
    # back: it leads what waited for it, at a new epoch
    c.heartbeat(beat(c.image, 1))
    assert not c.image.brokers[1].fenced
    assert (t.assignments[0].leader, t.assignments[0].leader_epoch) == (1, 2)


def test_a_controlled_shutdown_goes_in_two_steps() -> None:
    """Kafka's controlled shutdown: the first WantShutDown heartbeat moves the broker's leaderships
    (it stays unfenced, serving as a follower); it may go, and is fenced, once every live broker
    has replayed those changes."""
    c = Cluster()
    for node in (1, 2):
        c.register(registration(node))
        c.heartbeat(beat(c.image, node))
    c.topic("t", [[1, 2]])
    c.heartbeat(beat(c.image, 2))
    first = c.heartbeat(beat(c.image, 1, want_shut_down=True))
    assert (first.is_fenced, first.should_shut_down) == (False, False)
    assert c.image.brokers[1].in_controlled_shutdown and not c.image.brokers[1].fenced
    assert c.image.topics["t"].assignments[0].leader == -1  # it was alone in the ISR (the helper's topics)
    waiting = c.heartbeat(beat(c.image, 1, want_shut_down=True))  # broker 2 has not replayed them yet
    assert (waiting.is_fenced, waiting.should_shut_down) == (False, False)
    c.heartbeat(beat(c.image, 2))  # now it has
    done = c.heartbeat(beat(c.image, 1, want_shut_down=True))
    assert (done.is_fenced, done.should_shut_down) == (True, True) and c.image.brokers[1].fenced


def test_a_fenced_broker_may_shut_down_at_once() -> None:
    c = Cluster()
    c.register(registration(1))
    response = c.heartbeat(beat(c.image, 1, offset=0, want_shut_down=True))
    assert (response.is_fenced, response.should_shut_down) == (True, True)


def test_registrations_survive_a_snapshot() -> None:
    c = Cluster()
    c.register(registration(1))
    c.register(registration(2))
    c.heartbeat(beat(c.image, 2))
    copy = image_from_records(image_records(c.image), c.image.records)
    assert {n: (b.epoch, b.fenced, b.endpoints) for n, b in copy.brokers.items()} == \
        {n: (b.epoch, b.fenced, b.endpoints) for n, b in c.image.brokers.items()}
