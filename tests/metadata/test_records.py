"""The metadata log's records as the image reads them: the types it replays are decoded; every
other KRaft record type (broker registrations and fencing, NoOp, metadata transactions, ...), at
any version, even one newer than our definition, is skipped and still takes its offset."""

from __future__ import annotations

import uuid

import pytest

from broker.metadata import InMemoryMetadataLog, MetadataStore, decode_record, encode_record
from broker.metadata.image import REPLAYED
from protocol import messages as M
from protocol.primitives import encode_uvarint

METADATA = sorted(name for name, c in M.CODECS.items() if c.spec.type == "metadata")
NOT_REPLAYED = [name for name in METADATA if name not in REPLAYED]


def frame(api_key: int, version: int, body: bytes) -> bytes:
    return encode_uvarint(1) + encode_uvarint(api_key) + encode_uvarint(version) + body


def test_every_kraft_record_type_is_defined() -> None:
    """Kafka 4.2's metadata record types (metadata/src/main/resources/common/metadata) by api key."""
    by_key = {M.CODECS[name].spec.api_key: name for name in METADATA}
    assert by_key == {
        0: "RegisterBrokerRecord", 1: "UnregisterBrokerRecord", 2: "TopicRecord", 3: "PartitionRecord",
        4: "ConfigRecord", 5: "PartitionChangeRecord", 7: "FenceBrokerRecord", 8: "UnfenceBrokerRecord",
        9: "RemoveTopicRecord", 10: "DelegationTokenRecord", 11: "UserScramCredentialRecord",
        12: "FeatureLevelRecord", 14: "ClientQuotaRecord", 15: "ProducerIdsRecord",
        17: "BrokerRegistrationChangeRecord", 18: "AccessControlEntryRecord", 19: "RemoveAccessControlEntryRecord",
        20: "NoOpRecord", 21: "ZkMigrationStateRecord", 22: "RemoveUserScramCredentialRecord",
        23: "BeginTransactionRecord", 24: "EndTransactionRecord", 25: "AbortTransactionRecord",
        26: "RemoveDelegationTokenRecord", 27: "RegisterControllerRecord", 28: "ClearElrRecord",
    }


@pytest.mark.parametrize("name", NOT_REPLAYED)
def test_records_the_image_does_not_replay_are_skipped(name: str) -> None:
    codec = M.CODECS[name]
    assert codec.spec.api_key is not None
    for version in codec.spec.valid_versions:
        assert decode_record(encode_record(codec.root_class(), version)) is None
    # a version newer than ours, with bytes our definition could not read, is skipped too
    assert decode_record(frame(codec.spec.api_key, codec.spec.valid_versions.hi + 1, b"\xff\xff")) is None


@pytest.mark.parametrize("name", sorted(REPLAYED))
def test_records_the_image_replays_are_decoded(name: str) -> None:
    record = getattr(M, name)()
    assert decode_record(encode_record(record)) == record


def test_load_replays_around_records_it_skips() -> None:
    topic_id = uuid.uuid4()
    log = InMemoryMetadataLog()
    log.append([
        encode_record(M.RegisterBrokerRecord(broker_id=1, broker_epoch=5, incarnation_id=uuid.uuid4()), 3),
        encode_record(M.BeginTransactionRecord(name="create t")),
        encode_record(M.TopicRecord(name="t", topic_id=topic_id)),
        encode_record(M.PartitionRecord(partition_id=0, topic_id=topic_id, replicas=[1], isr=[1], leader=1)),
        encode_record(M.EndTransactionRecord()),
        encode_record(M.NoOpRecord()),
        encode_record(M.BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=5, fenced=-1), 2),
        frame(0, 4, b"\x00" * 40),  # RegisterBrokerRecord v4 (Kafka 4.3), newer than our definition
        frame(99, 0, b"\x00"),  # a record type no version of Kafka we know has
    ])
    store = MetadataStore(log, node_id=1)
    store.load()
    topic = store.topic("t")
    assert topic is not None and topic.topic_id == topic_id and topic.assignments[0].leader == 1
    assert store.image.records == 9  # every record has its offset, replayed or not
