"""A snapshot of the metadata image rebuilds the same image (topics, partitions and their
placement, configs of every resource type, features, producer ids, ACLs, SCRAM credentials,
client quotas), also through the metadata log on etcd."""

from __future__ import annotations

import uuid
from typing import Any

from broker.cluster.election import campaign
from broker.cluster.etcd_fake import FakeEtcd
from broker.cluster.keys import ClusterKeys
from broker.cluster.metadata_log import MetadataLog, Snapshot
from broker.cluster.snapshot import image_from_records, image_records
from broker.metadata import (
    RESOURCE_BROKER,
    RESOURCE_CLIENT_METRICS,
    RESOURCE_GROUP,
    RESOURCE_TOPIC,
    InMemoryMetadataLog,
    MetadataImage,
    MetadataStore,
)
from protocol import messages as M


def busy_store() -> MetadataStore:
    store = MetadataStore(InMemoryMetadataLog(), node_id=1)
    store.bootstrap(1)
    store.create_topic("orders", 3, {"retention.ms": "1000", "cleanup.policy": "compact"},
                       replicas=lambda p: [1 + p % 3, 1 + (p + 1) % 3])
    store.create_topic("gone", 1)
    store.create_topic("logs", 2)
    store.delete_topic("gone")
    store.change_partition("orders", 1, leader=3, isr=[3])
    store.create_partitions("logs", 4)
    store.set_configs(RESOURCE_TOPIC, "logs", {"segment.bytes": "1048576"})
    store.set_configs(RESOURCE_BROKER, "", {"log.retention.ms": "5000"})
    store.set_configs(RESOURCE_BROKER, "2", {"log.cleaner.threads": "2"})
    store.set_configs(RESOURCE_BROKER, "2", {"log.cleaner.threads": None})
    store.set_configs(RESOURCE_CLIENT_METRICS, "sub", {"interval.ms": "1000"})
    store.set_configs(RESOURCE_GROUP, "g", {"consumer.session.timeout.ms": "50000"})
    store.allocate_producer_id()
    acl = M.AccessControlEntryRecord(id=uuid.uuid4(), resource_type=2, resource_name="orders", pattern_type=3,
                                     principal="User:alice", host="*", operation=3, permission_type=3)
    dropped = M.AccessControlEntryRecord(id=uuid.uuid4(), resource_type=2, resource_name="x", pattern_type=3,
                                         principal="User:bob", host="*", operation=3, permission_type=3)
    scram = M.UserScramCredentialRecord(name="alice", mechanism=1, salt=b"s", stored_key=b"k", server_key=b"v",
                                        iterations=4096)
    entity = [M.ClientQuotaRecord.EntityData(entity_type="user", entity_name="alice"),
              M.ClientQuotaRecord.EntityData(entity_type="client-id", entity_name=None)]
    store.append_records([acl, dropped, scram, M.RemoveAccessControlEntryRecord(id=dropped.id),
                          M.ClientQuotaRecord(entity=entity, key="producer_byte_rate", value=1024.0, remove=False),
                          M.ClientQuotaRecord(entity=entity, key="consumer_byte_rate", value=2048.0, remove=False),
                          M.ClientQuotaRecord(entity=entity, key="consumer_byte_rate", value=0.0, remove=True)])
    return store


def state(image: MetadataImage) -> dict[str, Any]:
    return {
        "topics": {n: (t.topic_id, t.partitions, t.configs, {p: vars(a) for p, a in t.assignments.items()})
                   for n, t in image.topics.items()},
        "ids": set(image.topics_by_id),
        "broker_configs": {n: c for n, c in image.broker_configs.items() if c},
        "resource_configs": image.resource_configs,
        "features": image.features,
        "next_producer_id": image.next_producer_id,
        "acls": image.acls, "scram": image.scram, "quotas": image.client_quotas,
    }


def test_a_snapshot_rebuilds_the_image() -> None:
    store = busy_store()
    rebuilt = image_from_records(image_records(store.image), store.image.records)
    assert state(rebuilt) == state(store.image)
    assert rebuilt.records == store.image.records
    assert "gone" not in rebuilt.topics and rebuilt.topics["orders"].assignments[1].leader_epoch == 1
    # and replaying it again gives the same records (nothing depends on history)
    assert image_records(rebuilt) == image_records(store.image)


async def test_a_snapshot_through_etcd_rebuilds_the_image() -> None:
    etcd = FakeEtcd()
    keys = ClusterKeys("snap")
    log = MetadataLog(etcd, keys)
    leader = await campaign(etcd, keys, 1, await etcd.grant_lease(5))
    assert leader is not None
    store = busy_store()
    end = store.image.records
    await log.write_snapshot(leader, Snapshot(end, leader.epoch, image_records(store.image)))
    loaded = await log.read_snapshot()
    assert loaded is not None and loaded.end_offset == end
    assert state(image_from_records(loaded.records, loaded.end_offset)) == state(store.image)
