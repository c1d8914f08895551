"""The group coordinator: classic and KIP-848 consumer groups, committed offsets, in `__consumer_offsets`.

classic.py      ClassicGroup state machine, members, protocol selection, Kafka's checks
membership.py   JoinGroup/SyncGroup/Heartbeat/LeaveGroup handlers and rebalance timers
consumer.py     KIP-848 ConsumerGroup and its members, derived state, record replay
consumer_heartbeat.py  ConsumerGroupHeartbeat/ConsumerGroupDescribe, epochs, target assignment, timers
reconciliation.py      a member's way to its target assignment (CurrentAssignmentBuilder)
assignors.py    server-side uniform and range assignors
consumer_classic.py    classic members in consumer groups; online upgrade and downgrade
consumer_wait.py       heartbeats of members waiting for partitions, answered when they are free
offsets.py      committed offsets: OffsetCommit/OffsetFetch/OffsetDelete and expiry
records.py      __consumer_offsets record formats
shard.py        GroupCoordinatorShard: handlers and replay for one partition
coordinator.py  GroupCoordinator service over the runtime; create_group_coordinator()
"""

from broker.coordinator.group.classic import ClassicGroup, ClassicMember, GroupState
from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.coordinator import GroupCoordinator, create_group_coordinator
from broker.coordinator.group.membership import RequestInfo
from broker.coordinator.group.shard import GroupCoordinatorShard

__all__ = [
    "ClassicGroup",
    "ClassicMember",
    "GroupCoordinator",
    "GroupCoordinatorConfig",
    "GroupCoordinatorShard",
    "GroupState",
    "RequestInfo",
    "create_group_coordinator",
]
