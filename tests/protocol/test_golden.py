"""Golden request frames captured from real clients (tools/capture_golden.py, index.json).

Each frame (size prefix, header, body) is split, its header and body decoded with our codec,
meaningful fields checked against what the client is known to send, and re-encoding the
decoded header and body must reproduce the captured bytes exactly.
"""

from __future__ import annotations

import json
import re
import struct
import uuid
from pathlib import Path
from typing import Any

import crc32c
import pytest

from protocol.errors import ProtocolError
from protocol.frames import FrameSplitter, decode_request_header, encode_request_header
from protocol.messages import decode_request, encode

GOLDEN = Path(__file__).resolve().parent / "golden"
INDEX: list[dict[str, Any]] = json.loads((GOLDEN / "index.json").read_text())
TOPIC = "golden-topic"
TOPIC_ID = uuid.uuid5(uuid.NAMESPACE_URL, "golden/" + TOPIC)  # the id the capture broker gave it
CLIENT_IDS = {"confluent-kafka": r"rdkafka", "kafka-python": r"kafka-python-.*", "aiokafka": r"aiokafka-.*"}
MEMBER_ID = re.compile(r"[A-Za-z0-9+/]{22}")  # librdkafka's client-generated base64 uuid
# bytes a client sends after the request body, which Kafka (and decode_request) ignore
TRAILING = {
    # librdkafka 2.16 ends an all-topics Metadata v13 request with three stray bytes
    "confluent-kafka_Metadata_v13_all_topics.bin": bytes.fromhex("010000"),
}

# (client, api, variant) -> {attribute path: expected value}
EXPECTED: dict[tuple[str, str, str], dict[str, Any]] = {
    ("confluent-kafka", "ApiVersions", ""): {
        "client_software_name": "confluent-kafka-python",
        "client_software_version": "2.16.1-rdkafka-2.16.0",
    },
    ("kafka-python", "ApiVersions", ""): {
        "client_software_name": "kafka-python",
        "client_software_version": "3.0.12",
    },
    ("aiokafka", "ApiVersions", ""): {},
    ("confluent-kafka", "Metadata", ""): {
        "topics[0].name": TOPIC,
        "topics[0].topic_id": uuid.UUID(int=0),
        "allow_auto_topic_creation": True,
        "include_topic_authorized_operations": False,
    },
    ("confluent-kafka", "Metadata", "by_topic_id"): {"topics[0].name": None, "topics[0].topic_id": TOPIC_ID},
    ("confluent-kafka", "Metadata", "all_topics"): {"topics": None, "allow_auto_topic_creation": False},
    ("kafka-python", "Metadata", "all_topics"): {"topics": None, "allow_auto_topic_creation": True},
    ("kafka-python", "Metadata", ""): {"topics": [], "allow_auto_topic_creation": True},
    ("aiokafka", "Metadata", ""): {"topics": [], "allow_auto_topic_creation": True},
    ("confluent-kafka", "Produce", ""): {"acks": -1, "timeout_ms": 30000, "transactional_id": None},
    ("kafka-python", "Produce", ""): {"acks": -1, "timeout_ms": 30000, "transactional_id": None},
    ("aiokafka", "Produce", ""): {"acks": 1, "timeout_ms": 40000, "transactional_id": None},
    ("kafka-python", "InitProducerId", ""): {
        "transactional_id": None,
        "transaction_timeout_ms": 0,
        "producer_id": -1,
        "producer_epoch": -1,
    },
    ("confluent-kafka", "FindCoordinator", ""): {"key": "golden-classic", "key_type": 0},
    ("kafka-python", "FindCoordinator", ""): {"coordinator_keys": ["golden-classic"], "key_type": 0},
    ("aiokafka", "FindCoordinator", ""): {"key": "golden-classic"},
    ("confluent-kafka", "JoinGroup", ""): {
        "group_id": "golden-classic",
        "member_id": "",
        "protocol_type": "consumer",
        "session_timeout_ms": 45000,
        "rebalance_timeout_ms": 300000,
        "protocols[0].name": "range",
        "protocols[1].name": "roundrobin",
        "group_instance_id": None,
    },
    ("kafka-python", "JoinGroup", ""): {
        "group_id": "golden-classic",
        "member_id": "",
        "protocol_type": "consumer",
        "session_timeout_ms": 45000,
        "rebalance_timeout_ms": 300000,
        "protocols[0].name": "range",
        "protocols[1].name": "roundrobin",
        "reason": None,
    },
    ("aiokafka", "JoinGroup", ""): {
        "group_id": "golden-classic",
        "member_id": "",
        "protocol_type": "consumer",
        "session_timeout_ms": 10000,
        "rebalance_timeout_ms": 10000,
        "protocols[0].name": "roundrobin",
    },
    ("confluent-kafka", "ConsumerGroupHeartbeat", ""): {
        "group_id": "golden-consumer",
        "member_epoch": 0,
        "instance_id": None,
        "rebalance_timeout_ms": 300000,
        "subscribed_topic_names": [TOPIC],
        "subscribed_topic_regex": "",  # empty, not null, without a regex
        "server_assignor": None,
        "topic_partitions": [],
    },
    ("confluent-kafka", "ShareGroupHeartbeat", ""): {
        "group_id": "golden-share",
        "member_epoch": 0,
        "subscribed_topic_names": [TOPIC],
    },
    ("confluent-kafka", "ShareFetch", ""): {
        "group_id": "golden-share",
        "share_session_epoch": 0,
        "max_records": 500,
        "batch_size": 500,
        "topics[0].topic_id": TOPIC_ID,
        "topics[0].partitions[0].partition_index": 0,
        "topics[0].partitions[0].acknowledgement_batches": [],
        "forgotten_topics_data": [],
    },
    ("confluent-kafka", "ShareAcknowledge", ""): {
        "group_id": "golden-share",
        "share_session_epoch": -1,
        "topics": [],
    },
}

# the versions each client is documented to send (shared/reference/client-api-versions.md)
VERSIONS = {
    ("confluent-kafka", "ApiVersions"): 3,
    ("kafka-python", "ApiVersions"): 4,
    ("aiokafka", "ApiVersions"): 0,
    ("confluent-kafka", "Produce"): 10,
    ("kafka-python", "Produce"): 9,
    ("aiokafka", "Produce"): 7,
    ("confluent-kafka", "JoinGroup"): 5,
    ("kafka-python", "JoinGroup"): 7,
    ("aiokafka", "JoinGroup"): 5,
    ("confluent-kafka", "ConsumerGroupHeartbeat"): 1,
    ("confluent-kafka", "ShareGroupHeartbeat"): 1,
    ("confluent-kafka", "ShareFetch"): 1,
    ("confluent-kafka", "ShareAcknowledge"): 1,
}


def lookup(obj: Any, path: str) -> Any:
    for part in path.split("."):
        m = re.fullmatch(r"(\w+)(?:\[(\d+)\])?", part)
        assert m, path
        obj = getattr(obj, m.group(1))
        if m.group(2) is not None:
            obj = obj[int(m.group(2))]
    return obj


def load(entry: dict[str, Any]) -> tuple[bytes, Any, Any]:
    raw = (GOLDEN / entry["file"]).read_bytes()
    splitter = FrameSplitter()
    frames = [bytes(f) for f in splitter.feed(raw)]
    assert len(frames) == 1 and splitter.buffered == 0, "exactly one whole frame"
    frame = frames[0]
    hdr = decode_request_header(frame)
    body = decode_request(hdr.api_key, hdr.api_version, frame[hdr.body_offset :])
    return frame, hdr, body


def test_index_covers_the_targets() -> None:
    have = {(e["client"], e["api"]) for e in INDEX}
    for client in ("confluent-kafka", "kafka-python", "aiokafka"):
        for api in ("ApiVersions", "Metadata", "Produce", "JoinGroup"):
            assert (client, api) in have
    for api in ("ConsumerGroupHeartbeat", "ShareGroupHeartbeat", "ShareFetch"):
        assert ("confluent-kafka", api) in have
    assert {(e["client"], e["api"], e["variant"]) for e in INDEX} == set(EXPECTED)
    assert sorted(p.name for p in GOLDEN.glob("*.bin")) == sorted(e["file"] for e in INDEX)


@pytest.mark.parametrize("entry", INDEX, ids=[e["file"] for e in INDEX])
def test_golden_frame(entry: dict[str, Any]) -> None:
    frame, hdr, body = load(entry)
    client, api = entry["client"], entry["api"]
    assert (hdr.api_key, hdr.api_version) == (entry["api_key"], entry["api_version"])
    assert type(body).__name__ == api + "Request"
    assert hdr.client_id == entry["client_id"]
    assert re.fullmatch(CLIENT_IDS[client], hdr.client_id or "")
    if (client, api) in VERSIONS:
        assert hdr.api_version == VERSIONS[(client, api)]
    for path, expected in EXPECTED[(client, api, entry["variant"])].items():
        assert lookup(body, path) == expected, path
    # byte-exact re-encoding of header and body
    header = encode_request_header(
        hdr.api_key, hdr.api_version, hdr.correlation_id, hdr.client_id, hdr.header_version
    )
    assert header == frame[: hdr.body_offset]
    trailing = TRAILING.get(entry["file"], b"")
    assert encode(body, hdr.api_version) + trailing == frame[hdr.body_offset :]
    if trailing:
        with pytest.raises(ProtocolError):
            decode_request(hdr.api_key, hdr.api_version, frame[hdr.body_offset :], strict=True)


@pytest.mark.parametrize(
    "entry", [e for e in INDEX if e["api"] in ("ConsumerGroupHeartbeat", "ShareGroupHeartbeat", "ShareFetch")]
)
def test_member_ids_are_client_generated(entry: dict[str, Any]) -> None:
    _frame, _hdr, body = load(entry)
    assert MEMBER_ID.fullmatch(body.member_id), body.member_id


# RecordBatch v2 header, up to the record count (big endian)
_BATCH = struct.Struct(">qiibIhiqqqhii")


@pytest.mark.parametrize("entry", [e for e in INDEX if e["api"] == "Produce"], ids=lambda e: e["file"])
def test_produce_carries_one_record_batch(entry: dict[str, Any]) -> None:
    _frame, _hdr, body = load(entry)
    (topic,) = body.topic_data
    assert topic.name == TOPIC
    (part,) = topic.partition_data
    assert part.index == 0
    records = bytes(part.records)
    (
        base_offset,
        length,
        _epoch,
        magic,
        crc,
        attributes,
        last_delta,
        _ts,
        _max_ts,
        producer_id,
        _pe,
        _seq,
        count,
    ) = _BATCH.unpack_from(records)
    assert magic == 2 and base_offset == 0
    assert length + 12 == len(records)
    assert crc == crc32c.crc32c(records[21:])
    assert attributes & 0x7 == 0, "uncompressed by default"
    assert (last_delta, count) == (0, 1)
    # only kafka-python is idempotent by default: it carries the id our InitProducerId gave it
    assert producer_id == (1000 if entry["client"] == "kafka-python" else -1)
    assert b"golden-key" in records and b"golden-value" in records
