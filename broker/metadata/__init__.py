"""The cluster's metadata: the image (what the cluster looks like now), the store that changes it
through the metadata log (how it got there), the quorum's epoch, feature levels and which broker
configs may change at run time.

`image` holds the records' framing and `MetadataImage`, changed only by replaying records;
`store` validates a change, makes its records durable and replays them; `features` is the one
registry of feature flags; `quorum` keeps the metadata quorum's epoch; `dynamic_config` says
which broker configs AlterConfigs may change.
"""

from broker.metadata.image import (
    INTERNAL_TOPICS,
    MIN_INSYNC_REPLICAS,
    NO_LEADER_CHANGE,
    PRODUCER_ID_BLOCK,
    RESOURCE_BROKER,
    RESOURCE_CLIENT_METRICS,
    RESOURCE_GROUP,
    RESOURCE_TOPIC,
    Assignment,
    MetadataImage,
    TopicInfo,
    decode_record,
    encode_record,
    validate_topic_name,
)
from broker.metadata.store import InMemoryMetadataLog, MetadataLog, MetadataStore

__all__ = [
    "INTERNAL_TOPICS",
    "MIN_INSYNC_REPLICAS",
    "NO_LEADER_CHANGE",
    "PRODUCER_ID_BLOCK",
    "RESOURCE_BROKER",
    "RESOURCE_CLIENT_METRICS",
    "RESOURCE_GROUP",
    "RESOURCE_TOPIC",
    "Assignment",
    "InMemoryMetadataLog",
    "MetadataImage",
    "MetadataLog",
    "MetadataStore",
    "TopicInfo",
    "decode_record",
    "encode_record",
    "validate_topic_name",
]
