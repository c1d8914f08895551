"""The share coordinator: durable share-partition state in `__share_group_state` (KIP-932).

state.py        a share-partition's state and the combination of state batches
records.py      ShareSnapshot / ShareUpdate records in Kafka's format
shard.py        ShareCoordinatorShard: writes, initialization, deletion, replay
coordinator.py  ShareCoordinator service over the runtime (the persister); pruning
"""

from broker.coordinator.share.coordinator import (
    SHARE_STATE_TOPIC,
    ShareCoordinator,
    ShareCoordinatorConfig,
    coordinator_key,
    create_share_coordinator,
    kafka_uuid,
)
from broker.coordinator.share.shard import ShareCoordinatorShard, WriteState
from broker.coordinator.share.state import UNINITIALIZED_START_OFFSET, ShareGroupOffset, StateBatch

__all__ = [
    "SHARE_STATE_TOPIC",
    "UNINITIALIZED_START_OFFSET",
    "ShareCoordinator",
    "ShareCoordinatorConfig",
    "ShareCoordinatorShard",
    "ShareGroupOffset",
    "StateBatch",
    "WriteState",
    "coordinator_key",
    "create_share_coordinator",
    "kafka_uuid",
]
