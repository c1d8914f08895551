"""Partition reassignment on the controller (KIP-455), as Kafka's ReplicationControlManager does
it: pure functions that keep their PartitionChangeRecord in a `Changes`.

A reassignment to target replicas T of a partition with replicas C goes in two records:

1. the replicas become T followed by those leaving (C - T), with AddingReplicas T - C and
   RemovingReplicas C - T: the joining replicas follow the leader and catch up;
2. once every replica of T is in the ISR (the leader's AlterPartition says so), the next change of
   the partition completes it (elections.complete_reassignment): the replicas become T, the
   leaving ones drop out of the ISR, and a leader that is leaving hands over to the first in-sync
   replica of T. Those that left delete their copy (broker/cluster/publisher.py).

When the ISR already holds all of T (replicas reordered, or only removed), the first record
completes it at once. Cancelling (no target) reverts to the replicas before: the joining ones
leave, the leaving ones stay; when that would leave the ISR empty it needs an unclean election.
"""

from __future__ import annotations

from broker.cluster.elections import Changes, Election, unclean_enabled
from protocol.errors import ErrorCode

Result = tuple[ErrorCode, str | None]


def reassign(changes: Changes, topic_name: str, index: int, target: list[int] | None,
             allow_replication_factor_change: bool = True) -> Result:
    """One partition of AlterPartitionReassignments (its target already checked against the
    registered brokers); its change, if any, is kept in `changes`. Without
    `allow_replication_factor_change` (v1, KIP-860) the target keeps the replica count."""
    topic = changes.image.topics.get(topic_name)
    if topic is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find a topic named %s." % topic_name
    if index not in topic.assignments:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "Unable to find partition %s:%d." % (topic_name, index)
    a = changes.assignment(topic, index)
    original = [r for r in a.replicas if r not in a.adding_replicas]  # before any reassignment in progress
    if target is None:
        if not a.reassigning:
            return ErrorCode.NO_REASSIGNMENT_IN_PROGRESS, "No partition reassignment is in progress."
        isr = [r for r in a.isr if r not in a.adding_replicas]
        unclean = unclean_enabled(changes.image, topic, changes.policy)
        if not isr:  # only joining replicas were in sync: the first of the others, uncleanly
            if not unclean:
                return ErrorCode.INVALID_REPLICA_ASSIGNMENT, (
                    "Unable to revert partition assignment for %s:%d because it would require an unclean leader "
                    "election." % (topic_name, index))
            isr = original[:1]
        changes.change((topic, index), changes.acceptable(), Election.UNCLEAN if unclean else Election.ONLINE,
                       target_isr=isr, target_replicas=original, target_adding=[], target_removing=[])
        return ErrorCode.NONE, None
    if not allow_replication_factor_change and len(target) != len(original):
        return ErrorCode.INVALID_REPLICATION_FACTOR, "The replication factor is changed from %d to %d" % (
            len(original), len(target))
    removing = sorted(set(a.replicas) - set(target))
    adding = sorted(set(target) - set(a.replicas))
    changes.change((topic, index), changes.acceptable(), Election.ONLINE, target_replicas=list(target) + removing,
                   target_adding=adding, target_removing=removing)
    return ErrorCode.NONE, None
