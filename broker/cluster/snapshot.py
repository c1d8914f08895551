"""A metadata image as the records that rebuild it: what a snapshot of the metadata log holds
(KRaft's snapshots hold the same: the image's state as records, not the log's history).

`image_records(image)` gives the encoded records, in an order replay accepts (a topic before its
configs and partitions); `image_from_records(records, end_offset)` replays them into a new image
whose next offset is the snapshot's end.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

from broker.metadata import (
    RESOURCE_BROKER,
    RESOURCE_TOPIC,
    MetadataImage,
    decode_record,
    encode_record,
)
from protocol import messages as M

UNASSIGNED_DIRECTORY = uuid.UUID(int=0)  # Kafka's DirectoryId.UNASSIGNED


def image_records(image: MetadataImage) -> list[bytes]:
    records: list[Any] = [M.FeatureLevelRecord(name=name, feature_level=level)
                          for name, level in sorted(image.features.items())]
    for name, configs in sorted(image.broker_configs.items()):
        records += [M.ConfigRecord(resource_type=RESOURCE_BROKER, resource_name=name, name=k, value=v)
                    for k, v in sorted(configs.items())]
    for resource_type, resources in sorted(image.resource_configs.items()):
        for name, configs in sorted(resources.items()):
            records += [M.ConfigRecord(resource_type=resource_type, resource_name=name, name=k, value=v)
                        for k, v in sorted(configs.items())]
    for topic in sorted(image.topics.values(), key=lambda t: t.name):
        records.append(M.TopicRecord(name=topic.name, topic_id=topic.topic_id))
        records += [M.ConfigRecord(resource_type=RESOURCE_TOPIC, resource_name=topic.name, name=k, value=v)
                    for k, v in sorted(topic.configs.items())]
        for index, a in sorted(topic.assignments.items()):
            records.append(M.PartitionRecord(
                partition_id=index, topic_id=topic.topic_id, replicas=list(a.replicas), isr=list(a.isr),
                leader=a.leader, leader_epoch=a.leader_epoch, partition_epoch=a.partition_epoch,
                leader_recovery_state=a.leader_recovery_state,
                # version 2 (with ELR) has a directory per replica: unassigned, as Kafka's default
                directories=[UNASSIGNED_DIRECTORY] * len(a.replicas) if a.elr or a.last_known_elr else [],
                eligible_leader_replicas=list(a.elr) or None, last_known_elr=list(a.last_known_elr) or None,
                adding_replicas=list(a.adding_replicas), removing_replicas=list(a.removing_replicas)))
    if image.next_producer_id:
        records.append(M.ProducerIdsRecord(broker_id=-1, broker_epoch=-1, next_producer_id=image.next_producer_id))
    for b in sorted(image.brokers.values(), key=lambda b: b.node_id):
        records.append(M.RegisterBrokerRecord(
            broker_id=b.node_id, incarnation_id=b.incarnation_id, broker_epoch=b.epoch,
            end_points=[M.RegisterBrokerRecord.BrokerEndpoint(name=e.name, host=e.host, port=e.port,
                                                              security_protocol=e.security_protocol)
                        for e in b.endpoints],
            features=[M.RegisterBrokerRecord.BrokerFeature(name=n, min_supported_version=lo, max_supported_version=hi)
                      for n, (lo, hi) in sorted(b.features.items())],
            rack=b.rack, fenced=b.fenced, in_controlled_shutdown=b.in_controlled_shutdown, log_dirs=[]))
    records += [image.acls[k] for k in sorted(image.acls)]
    records += [image.scram[k] for k in sorted(image.scram)]
    for entity, values in sorted(image.client_quotas.items(), key=lambda kv: repr(kv[0])):
        data = [M.ClientQuotaRecord.EntityData(entity_type=t, entity_name=n) for t, n in entity]
        records += [M.ClientQuotaRecord(entity=list(data), key=k, value=v, remove=False)
                    for k, v in sorted(values.items())]
    return [encode_record(r) for r in records]


def image_from_records(records: Sequence[bytes], end_offset: int) -> MetadataImage:
    image = MetadataImage()
    for value in records:
        record = decode_record(value)
        if record is not None:
            image.replay(record)
    image.records = end_offset  # the next offset of the log, not the count of snapshot records
    return image
