"""Round trips of every definition (requests, responses, headers, internal records) at every version.

encode -> decode gives back an equal object, and decode -> encode gives back the same bytes.
Values come from tests/protocol/strategies.py: hypothesis (a few examples per pair, derandomized)
plus seeded examples biased towards edge values.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import example_value, message_values

from protocol import accel
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import (
    CLASSES,
    CODECS,
    REQUESTS,
    RESPONSES,
    decode,
    decode_request,
    decode_response,
    encode,
    encode_parts,
)
from protocol.schema import StructSpec

PAIRS = [(name, v) for name, codec in sorted(CODECS.items()) for v in codec.spec.valid_versions]
PAIR_IDS = ["%s-v%d" % p for p in PAIRS]

HYPOTHESIS = settings(
    max_examples=6,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)

_PY_TYPES: dict[str, type | tuple[type, ...]] = {
    "bool": bool,
    "int8": int,
    "int16": int,
    "uint16": int,
    "int32": int,
    "uint32": int,
    "int64": int,
    "float64": float,
    "string": str,
    "bytes": bytes,
    "records": memoryview,
    "uuid": uuid.UUID,
}


def check_types(struct: StructSpec, obj: Any, version: int, path: str = "") -> None:
    """Decoded values have the documented Python types: lists, UUIDs, str, bytes, memoryview."""
    for f in struct.fields:
        value = getattr(obj, f.attr)
        where = "%s.%s" % (path or struct.name, f.attr)
        if value is None:
            assert version in f.nullable or version not in f.versions, "%s is None" % where
            continue
        items = value if f.is_array else [value]
        if f.is_array:
            assert type(value) is list, where
        for item in items:
            if f.struct is not None:
                assert type(item).__name__ == f.struct.name, where
                check_types(f.struct, item, version, where)
            else:
                assert isinstance(item, _PY_TYPES[f.elem_type]), "%s: %r" % (where, type(item))


def assert_round_trip(name: str, version: int, obj: Any) -> None:
    data = encode(obj, version)
    assert b"".join(bytes(p) for p in encode_parts(obj, version)) == data
    back = decode(name, version, data)
    assert back == obj, "%s v%d: %r != %r" % (name, version, back, obj)
    check_types(CODECS[name].spec.root, back, version)
    assert encode(back, version) == data


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
@HYPOTHESIS
@given(data=st.data())
def test_round_trip_hypothesis(name: str, version: int, data: st.DataObject) -> None:
    obj = data.draw(message_values(name, version))
    assert_round_trip(name, version, obj)


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
def test_round_trip_seeded(name: str, version: int) -> None:
    for seed in range(4):
        assert_round_trip(name, version, example_value(name, version, seed))


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
def test_defaults_encode(name: str, version: int) -> None:
    """A freshly constructed object (all defaults) encodes and decodes at every version."""
    obj = CLASSES[name]()
    data = encode(obj, version)
    assert decode(name, version, data) == obj


def test_registry_covers_every_definition() -> None:
    assert set(REQUESTS) == set(RESPONSES)
    for key, codec in REQUESTS.items():
        assert codec.spec.api_key == key and codec.spec.type == "request"
        assert RESPONSES[key].spec.api_key == key and RESPONSES[key].spec.type == "response"
    assert {"RequestHeader", "ResponseHeader"} <= set(CODECS)
    assert any(c.spec.type.startswith("coordinator") for c in CODECS.values())


def test_entry_points_agree() -> None:
    """decode_request/decode_response/decode(name)/decode(class) give the same object."""
    for key in sorted(REQUESTS):
        for registry, by_key in ((REQUESTS, decode_request), (RESPONSES, decode_response)):
            codec = registry[key]
            version = codec.spec.valid_versions.hi
            obj = example_value(codec, version, 1)
            data = encode(obj, version)
            assert by_key(key, version, data) == obj
            assert decode(codec.spec.name, version, data) == obj
            assert decode(codec.root_class, version, memoryview(data)) == obj
            assert decode(codec.spec.name, version, bytearray(data)) == obj


def test_records_are_zero_copy() -> None:
    """Records values larger than the C encoder copies (all of them in pure Python) are parts of
    their own, and decoding slices them out of the input."""
    from protocol.messages import ProduceRequest  # type: ignore[attr-defined]

    batch = b"\x00" * 61 + b"payload" * (accel.COPY_RECORDS_MAX // 7 + 1)
    req = ProduceRequest(
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            ProduceRequest.TopicProduceData(
                name="t", partition_data=[ProduceRequest.PartitionProduceData(index=0, records=batch)]
            )
        ],
    )
    parts = encode_parts(req, 9)
    assert any(p is batch for p in parts), "records value must be passed through, not copied"
    data = b"".join(parts)
    back = decode_request(0, 9, data)
    records = back.topic_data[0].partition_data[0].records
    assert isinstance(records, memoryview) and records.obj is data
    assert records == batch


def test_unknown_version_and_key() -> None:
    data = encode(CLASSES["MetadataRequest"](), 1)
    with pytest.raises(ProtocolError) as exc:
        decode_request(3, 99, data)
    assert exc.value.code == ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(ProtocolError) as exc:
        decode_request(9999, 0, data)
    assert exc.value.code == ErrorCode.UNSUPPORTED_VERSION
    with pytest.raises(ProtocolError):
        decode_response(9999, 0, data)
    with pytest.raises(ValueError):
        encode(CLASSES["MetadataRequest"](), 99)
    nested: Any = CLASSES["MetadataRequest"]
    with pytest.raises(TypeError):
        encode(nested.MetadataRequestTopic(), 1)


def test_trailing_bytes() -> None:
    """Like Kafka, a request may carry bytes after its body (unless asked to be strict);
    responses, headers and internal records may not."""
    req = CLASSES["HeartbeatRequest"](group_id="g")
    data = encode(req, 0)
    assert decode_request(12, 0, data + b"\x00\x01") == req
    with pytest.raises(ProtocolError):
        decode_request(12, 0, data + b"\x00", strict=True)
    with pytest.raises(ProtocolError):
        decode("HeartbeatRequest", 0, data + b"\x00")
    resp = encode(CLASSES["HeartbeatResponse"](), 0)
    with pytest.raises(ProtocolError):
        decode_response(12, 0, resp + b"\x00")
    with pytest.raises(ProtocolError):
        decode("OffsetCommitKey", 0, encode(CLASSES["OffsetCommitKey"](), 0) + b"\x00")


def test_struct_fields_default_to_an_instance() -> None:
    """A non-nullable struct field defaults to an instance with its own defaults (as Kafka's `new T()`).

    Absent tagged structs decode to that instance, and an instance equal to it is not written.
    """
    from protocol.messages import FetchResponse, ShareFetchResponse  # type: ignore[attr-defined]

    part = ShareFetchResponse.PartitionData()
    assert part.current_leader == ShareFetchResponse.LeaderIdAndEpoch()
    assert part.current_leader is not ShareFetchResponse.PartitionData().current_leader
    assert (
        decode(
            "ShareFetchResponse",
            1,
            encode(
                ShareFetchResponse(
                    responses=[ShareFetchResponse.ShareFetchableTopicResponse(partitions=[part])]
                ),
                1,
            ),
        )
        .responses[0]
        .partitions[0]
        == part
    )

    fetched = FetchResponse.PartitionData(partition_index=3)
    assert fetched.diverging_epoch == FetchResponse.EpochEndOffset(epoch=-1, end_offset=-1)
    assert fetched.current_leader == FetchResponse.LeaderIdAndEpoch(leader_id=-1, leader_epoch=-1)
    assert fetched.snapshot_id == FetchResponse.SnapshotId(end_offset=-1, epoch=-1)
    resp = FetchResponse(responses=[FetchResponse.FetchableTopicResponse(topic="t", partitions=[fetched])])
    data = encode(resp, 12)
    # no tagged field is written for default-valued structs: partition, topic and response tag buffers are empty
    assert data[-3:] == b"\x00\x00\x00"
    back = decode("FetchResponse", 12, data)
    assert back == resp
    assert back.responses[0].partitions[0].current_leader.leader_id == -1
