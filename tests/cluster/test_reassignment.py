"""Partition reassignment on the controller (broker/cluster/reassignment.py), as Kafka's
ReplicationControlManager and PartitionChangeBuilder do it: the replicas grow by the joining
ones, the reassignment completes when the leader's AlterPartition brings them all in sync, a
cancel reverts, and a snapshot keeps a reassignment in progress."""

from __future__ import annotations

from broker.cluster import reassignment
from broker.cluster.elections import Changes
from broker.cluster.snapshot import image_from_records, image_records
from protocol.errors import ErrorCode
from tests.cluster.test_elections import Cluster


def reassign(c: Cluster, target: list[int] | None, name: str = "t", index: int = 0,
             allow: bool = True) -> tuple[ErrorCode, str | None]:
    changes = Changes(c.image, c.policy)
    result = reassignment.reassign(changes, name, index, target, allow)
    c.apply(changes.records)
    return result


def replicas(c: Cluster) -> tuple[list[int], list[int], list[int], list[int], int]:
    a = c.part("t")
    return a.replicas, a.isr, a.adding_replicas, a.removing_replicas, a.leader


def test_moving_a_replica_adds_it_first_and_completes_once_it_is_in_sync() -> None:
    c = Cluster(4)
    c.topic("t", [[1, 2, 3]])
    epoch = c.part("t").leader_epoch
    assert reassign(c, [1, 2, 4]) == (ErrorCode.NONE, None)
    assert replicas(c) == ([1, 2, 4, 3], [1, 2, 3], [4], [3], 1)
    assert c.part("t").leader_epoch == epoch  # nothing left the replicas yet
    # the joining replica caught up: the leader's ISR expansion completes the reassignment
    answer = c.alter(1, "t", [1, 2, 3, 4])
    assert answer.error_code == 0
    assert replicas(c) == ([1, 2, 4], [1, 2, 4], [], [], 1)
    assert answer.isr == [1, 2, 4]
    assert c.part("t").leader_epoch == epoch + 1  # a replica left: its fetches are fenced


def test_a_leader_moved_away_hands_over_when_the_reassignment_completes() -> None:
    c = Cluster(4)
    c.topic("t", [[1, 2, 3]])
    reassign(c, [4, 2, 3])
    assert replicas(c) == ([4, 2, 3, 1], [1, 2, 3], [4], [1], 1)
    answer = c.alter(1, "t", [1, 2, 3, 4])
    assert answer.error_code == ErrorCode.NEW_LEADER_ELECTED
    assert replicas(c) == ([4, 2, 3], [2, 3, 4], [], [], 4)


def test_reordering_or_removing_in_sync_replicas_completes_at_once() -> None:
    c = Cluster(3)
    c.topic("t", [[1, 2, 3]])
    reassign(c, [3, 2, 1])
    assert replicas(c) == ([3, 2, 1], [1, 2, 3], [], [], 1)  # the leader stays until an election
    reassign(c, [3, 2])
    assert replicas(c) == ([3, 2], [2, 3], [], [], 3)
    assert reassign(c, [3, 2]) == (ErrorCode.NONE, None)  # the same target: nothing to do


def test_cancelling_reverts_to_the_replicas_before() -> None:
    c = Cluster(4)
    c.topic("t", [[1, 2, 3]])
    assert reassign(c, None) == (ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress.")
    reassign(c, [1, 2, 4])
    assert reassign(c, None) == (ErrorCode.NONE, None)
    assert replicas(c) == ([1, 2, 3], [1, 2, 3], [], [], 1)


def test_a_cancel_that_needs_an_unclean_election_is_refused_unless_enabled() -> None:
    c = Cluster(4)
    c.topic("t", [[1, 2]])
    reassign(c, [3, 4])
    c.alter(1, "t", [1, 3])  # 3 caught up; 4 not yet: still in progress
    c.fence(1)
    c.fence(2)
    assert c.part("t").isr == [3]
    code, message = reassign(c, None)
    assert code == ErrorCode.INVALID_REPLICA_ASSIGNMENT
    assert message == ("Unable to revert partition assignment for t:0 because it would require an unclean leader "
                       "election.")


def test_unknown_partitions_and_a_changed_replication_factor_are_refused() -> None:
    c = Cluster(4)
    c.topic("t", [[1, 2, 3]])
    assert reassign(c, [1], name="nope") == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                                             "Unable to find a topic named nope.")
    assert reassign(c, [1], index=5) == (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition t:5.")
    assert reassign(c, [1, 2], allow=False) == (ErrorCode.INVALID_REPLICATION_FACTOR,
                                                "The replication factor is changed from 3 to 2")
    assert reassign(c, [4, 2, 3], allow=False) == (ErrorCode.NONE, None)


def test_a_snapshot_keeps_a_reassignment_in_progress() -> None:
    c = Cluster(4)
    c.topic("t", [[1, 2, 3]])
    reassign(c, [1, 2, 4])
    again = image_from_records(image_records(c.image), c.image.records).topics["t"].assignments[0]
    assert (again.replicas, again.adding_replicas, again.removing_replicas) == ([1, 2, 4, 3], [4], [3])
