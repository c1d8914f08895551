"""Leaders and ISRs on the controller (broker/cluster/elections.py, brokers.py), as Kafka's
PartitionChangeBuilder and ReplicationControlManager decide them: pure functions of the image,
records replayed as the controller would write them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from broker.cluster import brokers, elections
from broker.cluster.elections import Changes, Policy
from broker.cluster.metadata_sync import ClusterMetadataStore
from broker.cluster.snapshot import image_from_records, image_records
from broker.metadata import InMemoryMetadataLog, MetadataImage
from broker.metadata.features import ELR_VERSION
from broker.metadata.image import Assignment
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

CLUSTER = "cluster-a"
R = M.BrokerRegistrationRequest
AP = M.AlterPartitionRequest


class Cluster:
    def __init__(self, nodes: int = 3, elr: bool = True) -> None:
        self.image = MetadataImage()
        if elr:
            self.image.features[ELR_VERSION] = 1
        self.heartbeats = brokers.Heartbeats()
        self.policy = Policy(controller_id=1)
        for node in range(1, nodes + 1):
            self.register(node)
            self.beat(node)

    def apply(self, records: list[Any]) -> list[Any]:
        for r in records:
            self.image.replay(r)
        return records

    def register(self, node: int) -> None:
        request = R(broker_id=node, cluster_id=CLUSTER, incarnation_id=uuid.uuid4(), rack=None, listeners=[],
                    features=[R.Feature(name=ELR_VERSION, min_supported_version=0, max_supported_version=1)],
                    log_dirs=[])
        self.heartbeats.last.pop(node, None)  # a restart: the old incarnation's session is over
        self.apply(brokers.register(self.image, self.heartbeats, request, CLUSTER, self.image.records, 0, 9000, {},
                                    self.policy).records)

    def beat(self, node: int, **flags: bool) -> Any:
        request = M.BrokerHeartbeatRequest(broker_id=node, broker_epoch=self.image.brokers[node].epoch,
                                           current_metadata_offset=self.image.records,
                                           want_fence=False, want_shut_down=flags.get("shut_down", False),
                                           offline_log_dirs=[])
        outcome = brokers.heartbeat(self.image, self.heartbeats, request, 0, self.policy)
        self.apply(outcome.records)
        return outcome.response

    def fence(self, node: int) -> None:
        self.apply(brokers.fence(self.image, [node], self.policy))

    def topic(self, name: str, replicas: list[list[int]], **configs: str) -> uuid.UUID:
        store = ClusterMetadataStore(InMemoryMetadataLog(), 1)
        store.image = self.image
        info = store.create_topic(name, len(replicas), {k.replace("_", "."): v for k, v in configs.items()},
                                  replicas=lambda i: list(replicas[i]))
        return info.topic_id

    def part(self, name: str, index: int = 0) -> Assignment:
        return self.image.topics[name].assignments[index]

    def state(self, name: str, index: int = 0) -> tuple[int, list[int], list[int]]:
        a = self.part(name, index)
        return a.leader, a.isr, a.elr

    def alter(self, node: int, name: str, isr: list[int], index: int = 0, version: int = 3, **override: int) -> Any:
        a = self.part(name, index)
        epochs = {"leader_epoch": a.leader_epoch, "partition_epoch": a.partition_epoch, **override}
        partition = AP.PartitionData(partition_index=index, leader_epoch=epochs["leader_epoch"],
                                     partition_epoch=epochs["partition_epoch"],
                                     leader_recovery_state=override.get("recovery", 0), new_isr=list(isr),
                                     new_isr_with_epochs=[AP.BrokerState(broker_id=b, broker_epoch=self.image.brokers[b].epoch
                                                                         if b in self.image.brokers else -1)
                                                          for b in isr])
        request = AP(broker_id=node, broker_epoch=override.get("broker_epoch", self.image.brokers[node].epoch),
                     topics=[AP.TopicData(topic_id=self.image.topics[name].topic_id, partitions=[partition])])
        changes = Changes(self.image, self.policy)
        response = elections.alter_partition(changes, request, version)
        self.apply(changes.records)
        return response.topics[0].partitions[0]

    def elect(self, election_type: int, name: str, index: int = 0) -> ErrorCode:
        changes = Changes(self.image, self.policy)
        code, _ = elections.elect_leader(changes, name, index, election_type)
        self.apply(changes.records)
        return code


def test_a_new_partition_has_its_live_replicas_in_sync_and_epochs_at_zero() -> None:
    c = Cluster(4)
    c.fence(3)
    c.topic("t", [[1, 2, 3]])
    a = c.part("t")
    assert (a.leader, a.isr, a.leader_epoch, a.partition_epoch) == (1, [1, 2], 0, 0)
    for node in (1, 2, 4):
        c.fence(node)
    with pytest.raises(KafkaError) as failure:
        c.topic("u", [[1, 2]])
    assert failure.value.code == ErrorCode.INVALID_REPLICATION_FACTOR


def test_the_leader_fenced_the_first_in_sync_replica_in_replica_order_leads() -> None:
    c = Cluster()
    c.topic("t", [[1, 3, 2]])
    c.fence(1)
    a = c.part("t")
    assert (a.leader, a.isr, a.leader_epoch, a.partition_epoch) == (3, [3, 2], 1, 1)
    c.fence(2)  # a follower fenced: it leaves the ISR, the leader epoch stays
    assert (a.leader, a.isr, a.leader_epoch, a.partition_epoch) == (3, [3], 1, 2)


def test_without_elr_the_last_in_sync_replica_stays_and_leads_again_when_back() -> None:
    c = Cluster(elr=False)
    c.topic("t", [[1, 2]])
    c.fence(2)
    c.fence(1)
    assert c.state("t") == (-1, [1], [])
    c.beat(2)  # back, but out of sync: no leader (unclean elections are off)
    assert c.state("t") == (-1, [1], [])
    c.beat(1)
    assert c.state("t") == (1, [1], [])


def test_with_elr_replicas_leaving_an_isr_below_min_insync_stay_eligible() -> None:
    c = Cluster()
    c.topic("t", [[1, 2, 3]], min_insync_replicas="2")
    c.fence(1)
    assert c.state("t") == (2, [2, 3], [])
    c.fence(2)
    assert c.state("t") == (3, [3], [2])
    c.fence(3)
    assert c.state("t") == (-1, [], [2, 3]) and c.part("t").last_known_elr == [3]
    c.beat(1)  # never eligible: stays out
    assert c.state("t") == (-1, [], [2, 3])
    c.beat(2)  # eligible: leads, alone in the ISR
    assert c.state("t") == (2, [2], [3]) and c.part("t").last_known_elr == []


def test_a_restarted_broker_is_no_longer_eligible_and_the_last_known_leader_comes_back_last() -> None:
    c = Cluster()
    c.topic("t", [[1, 2]])
    c.fence(2)
    c.fence(1)
    assert c.state("t") == (-1, [], [1]) and c.part("t").last_known_elr == [1]
    c.register(1)  # a new incarnation: an unclean shutdown, it may have lost what it had
    assert c.state("t") == (-1, [], [])
    c.beat(1)  # the last known leader, elected uncleanly: recovering
    a = c.part("t")
    assert c.state("t") == (1, [1], []) and a.leader_recovery_state == elections.RECOVERING


@pytest.mark.parametrize("enabled", [False, True])
def test_unclean_leader_election_by_topic_config(enabled: bool) -> None:
    c = Cluster(elr=False)
    c.topic("t", [[1, 2]], unclean_leader_election_enable=str(enabled).lower())
    c.apply([M.PartitionChangeRecord(topic_id=c.image.topics["t"].topic_id, partition_id=0, isr=[1], leader=-2)])
    c.fence(1)
    if enabled:
        assert c.state("t") == (2, [2], []) and c.part("t").leader_recovery_state == elections.RECOVERING
    else:
        assert c.state("t") == (-1, [1], [])


def test_a_controlled_shutdown_moves_leadership_and_leaves_the_isr() -> None:
    c = Cluster()
    c.topic("t", [[1, 2, 3]])
    response = c.beat(1, shut_down=True)
    assert not response.should_shut_down and c.state("t") == (2, [2, 3], [])
    for node in (2, 3):
        c.beat(node)  # they replay it
    assert c.beat(1, shut_down=True).should_shut_down


def test_alter_partition_changes_the_isr_and_the_partition_epoch_only() -> None:
    c = Cluster()
    c.topic("t", [[1, 2, 3]])
    answer = c.alter(1, "t", [1, 3])
    assert (answer.error_code, answer.leader_id, answer.isr, answer.leader_epoch, answer.partition_epoch) == \
        (0, 1, [1, 3], 0, 1)
    assert c.state("t") == (1, [1, 3], [])
    answer = c.alter(1, "t", [1, 3, 2], version=2)
    assert (answer.error_code, answer.isr, answer.partition_epoch) == (0, [1, 3, 2], 2)


@pytest.mark.parametrize(("node", "isr", "override", "code"), [
    (1, [1, 2], {"leader_epoch": -1}, ErrorCode.FENCED_LEADER_EPOCH),
    (1, [1, 2], {"leader_epoch": 5}, ErrorCode.NOT_CONTROLLER),
    (2, [1, 2], {}, ErrorCode.INVALID_REQUEST),  # not the leader
    (1, [1, 2], {"partition_epoch": -1}, ErrorCode.INVALID_UPDATE_VERSION),
    (1, [2, 3], {}, ErrorCode.INVALID_REQUEST),  # without its leader
    (1, [1, 4], {}, ErrorCode.INVALID_REQUEST),  # not a replica
    (1, [1, 2, 3], {}, ErrorCode.INELIGIBLE_REPLICA),  # 3 is fenced
])
def test_alter_partition_refusals_in_kafkas_order(node: int, isr: list[int], override: dict[str, int],
                                                   code: ErrorCode) -> None:
    c = Cluster()
    c.topic("t", [[1, 2, 3]])
    c.apply([M.PartitionChangeRecord(topic_id=c.image.topics["t"].topic_id, partition_id=0, isr=[1, 2], leader=-2)])
    c.fence(3)
    assert c.alter(node, "t", isr, **override).error_code == code


def test_alter_partition_from_a_stale_broker_epoch_fails_whole() -> None:
    c = Cluster()
    c.topic("t", [[1, 2]])
    with pytest.raises(KafkaError) as failure:
        c.alter(1, "t", [1], broker_epoch=123456)
    assert failure.value.code == ErrorCode.STALE_BROKER_EPOCH


def test_elect_leaders_preferred_and_unclean() -> None:
    c = Cluster(elr=False)
    c.topic("t", [[1, 2]])
    assert c.elect(elections.PREFERRED_TYPE, "t") == ErrorCode.ELECTION_NOT_NEEDED
    c.fence(1)
    assert c.state("t") == (2, [2], [])
    c.beat(1)
    assert c.elect(elections.PREFERRED_TYPE, "t") == ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE  # out of sync
    c.alter(2, "t", [2, 1])
    assert c.elect(elections.PREFERRED_TYPE, "t") == ErrorCode.NONE
    assert c.state("t") == (1, [2, 1], []) and c.part("t").leader_epoch == 2
    assert c.elect(elections.UNCLEAN_TYPE, "t") == ErrorCode.ELECTION_NOT_NEEDED
    assert c.elect(elections.PREFERRED_TYPE, "nope") == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    # unclean: the only in-sync replica gone, an out-of-sync live one leads
    c.alter(1, "t", [1])
    c.fence(1)
    assert c.state("t") == (-1, [1], [])
    assert c.elect(elections.UNCLEAN_TYPE, "t") == ErrorCode.NONE and c.state("t") == (2, [2], [])
    c.fence(2)
    assert c.elect(elections.UNCLEAN_TYPE, "t") == ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE


def test_balancing_brings_preferred_leaders_back() -> None:
    c = Cluster()
    c.topic("t", [[1, 2], [2, 1]])
    c.fence(1)
    c.beat(1)
    c.alter(2, "t", [2, 1])
    changes = Changes(c.image, c.policy)
    changes.preferred(1000)
    c.apply(changes.records)
    assert [c.part("t", i).leader for i in (0, 1)] == [1, 2]


def test_partition_state_survives_a_snapshot() -> None:
    c = Cluster()
    c.topic("t", [[1, 2, 3]], min_insync_replicas="2")
    c.fence(1)
    c.fence(2)
    copy = image_from_records(image_records(c.image), c.image.records)
    assert copy.topics["t"].assignments == c.image.topics["t"].assignments
