"""The C encoder (protocol/_speedups.c, built by protocol/accel.py) against the generated Python one.

For every definition at every version, seeded example values and all-default objects encode to
the same bytes in both paths, and with a head the parts form a whole frame. Then the corners:
records passed through or copied, objects of other classes with the same attributes, values the
encoder must refuse (an exception, never a crash or wrong bytes), reference leaks, and the switch.
"""

from __future__ import annotations

import uuid
from types import SimpleNamespace
from typing import Any

import pytest
from leaks import assert_no_leak
from strategies import example_value

from protocol import accel
from protocol.messages import CLASSES, CODECS, decode, encode, encode_frame, encode_parts

pytestmark = pytest.mark.skipif(not accel.AVAILABLE, reason=accel.UNAVAILABLE_REASON or "no speedups")

PAIRS = [(name, v) for name, codec in sorted(CODECS.items()) for v in codec.spec.valid_versions]
PAIR_IDS = ["%s-v%d" % p for p in PAIRS]


def py_bytes(name: str, version: int, obj: Any) -> bytes:
    parts: list[Any] = []
    CODECS[name].py_encoder(version)(obj, parts.append)
    return b"".join(bytes(p) for p in parts)


def c_bytes(name: str, version: int, obj: Any, head: bytes | None = None) -> bytes:
    parts = accel.build_encoder(CODECS[name], version)(obj, head)
    assert all(type(p) is bytes for p in parts)
    return b"".join(parts)


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
def test_encodes_as_the_generated_encoder(name: str, version: int) -> None:
    for seed in range(3):
        obj = example_value(name, version, seed)
        assert c_bytes(name, version, obj) == py_bytes(name, version, obj)
    default = CLASSES[name]()
    assert c_bytes(name, version, default) == py_bytes(name, version, default)


@pytest.mark.parametrize(("name", "version"), [("OffsetCommitResponse", 9), ("MetadataResponse", 12),
                                               ("ApiVersionsResponse", 3), ("FetchResponse", 16)])
def test_a_head_makes_a_frame(name: str, version: int) -> None:
    obj = example_value(name, version, 1)
    body = py_bytes(name, version, obj)
    head = b"\x00\x00\x00\x07\x00"
    frame = c_bytes(name, version, obj, head)
    assert frame == (len(head) + len(body)).to_bytes(4, "big") + head + body
    assert b"".join(encode_frame(obj, version, head)) == frame


def test_large_records_pass_through_small_ones_are_copied() -> None:
    P: Any = CLASSES["ProduceRequest"]

    def request(records: Any) -> Any:
        return P(acks=-1, timeout_ms=1, topic_data=[P.TopicProduceData(
            name="t", partition_data=[P.PartitionProduceData(index=0, records=records)])])

    small, large = b"s" * accel.COPY_RECORDS_MAX, b"L" * (accel.COPY_RECORDS_MAX + 1)
    assert len(encode_parts(request(small), 9)) == 1
    for value in (large, memoryview(large), bytearray(large)):
        parts = encode_parts(request(value), 9)
        assert [p is value for p in parts] == [False, True, False]
        assert b"".join(bytes(p) for p in parts) == py_bytes("ProduceRequest", 9, request(value))

    class Slice:  # a records value read only when sent (broker.log.FileSlice): no buffer, a length
        def __len__(self) -> int:
            return 3

    piece = Slice()
    parts = accel.build_encoder(CODECS["ProduceRequest"], 9)(request(piece), b"\x00\x00\x00\x01")
    assert parts[1] is piece and len(parts) == 3
    assert int.from_bytes(parts[0][:4], "big") == len(parts[0]) - 4 + 3 + len(parts[2])


def test_objects_of_other_classes_are_read_by_attribute() -> None:
    R: Any = CLASSES["OffsetCommitResponse"]
    real = R(throttle_time_ms=5, topics=[R.OffsetCommitResponseTopic(
        name="t", partitions=[R.OffsetCommitResponsePartition(partition_index=1, error_code=3)])])
    duck = R(throttle_time_ms=5, topics=[SimpleNamespace(
        name="t", partitions=[SimpleNamespace(partition_index=1, error_code=3)])])
    for version in (0, 8, 9):
        assert c_bytes("OffsetCommitResponse", version, duck) == py_bytes("OffsetCommitResponse", version, real)


def test_tagged_fields_at_their_default_are_left_out() -> None:
    R: Any = CLASSES["ApiVersionsResponse"]
    plain = R(error_code=0, api_keys=[])
    assert c_bytes("ApiVersionsResponse", 3, plain) == py_bytes("ApiVersionsResponse", 3, plain)
    tagged = R(error_code=0, api_keys=[], finalized_features_epoch=7, zk_migration_ready=True,
               supported_features=[R.SupportedFeatureKey(name="f", min_version=1, max_version=2)])
    data = c_bytes("ApiVersionsResponse", 3, tagged)
    assert data == py_bytes("ApiVersionsResponse", 3, tagged)
    assert len(data) > len(c_bytes("ApiVersionsResponse", 3, plain))
    assert decode("ApiVersionsResponse", 3, data) == tagged


@pytest.mark.parametrize("field, value", [
    ("throttle_time_ms", 2**31), ("throttle_time_ms", -(2**31) - 1), ("throttle_time_ms", "1"),
    ("throttle_time_ms", None), ("throttle_time_ms", 1.5), ("topics", 5), ("topics", [object()]),
])
def test_bad_values_raise(field: str, value: Any) -> None:
    R: Any = CLASSES["OffsetCommitResponse"]
    obj = R(topics=[])
    setattr(obj, field, value)
    with pytest.raises((TypeError, ValueError, OverflowError, AttributeError)):
        accel.build_encoder(CODECS["OffsetCommitResponse"], 9)(obj)


def test_bad_nested_values_raise() -> None:
    P: Any = CLASSES["OffsetCommitResponse"].OffsetCommitResponsePartition
    enc = accel.build_encoder(CODECS["OffsetCommitResponse"], 9)
    R: Any = CLASSES["OffsetCommitResponse"]
    cases = [
        R(topics=[R.OffsetCommitResponseTopic(name=None, partitions=[P(partition_index=70000)])]),  # int16 error code ok, int32 index
        R(topics=[R.OffsetCommitResponseTopic(name=b"bytes", partitions=[])]),
        R(topics=[R.OffsetCommitResponseTopic(name="t", partitions=[P(error_code=40000)])]),
        R(topics=[SimpleNamespace(name="t")]),
    ]
    assert enc(cases[0]) == [py_bytes("OffsetCommitResponse", 9, cases[0])]  # None string: written as null
    for obj in cases[1:]:
        with pytest.raises((TypeError, ValueError, OverflowError, AttributeError)):
            enc(obj)
    U: Any = CLASSES["MetadataResponse"]
    topic = U.MetadataResponseTopic(name="t", topic_id=uuid.UUID(int=2**128 - 1), partitions=[])
    assert c_bytes("MetadataResponse", 12, U(topics=[topic])) == py_bytes("MetadataResponse", 12, U(topics=[topic]))


def test_no_leaks() -> None:
    samples = [(name, v, example_value(name, v, 0)) for name, v in PAIRS[::7]]
    encoders = {(name, v): accel.build_encoder(CODECS[name], v) for name, v, _ in samples}
    R: Any = CLASSES["OffsetCommitResponse"]
    bad = R(throttle_time_ms=2**40, topics=[])

    def run(times: int) -> None:
        for _ in range(times):
            for name, v, obj in samples:
                encoders[(name, v)](obj, b"\x00\x00\x00\x01")
            try:
                encoders.get(("OffsetCommitResponse", 9), accel.build_encoder(CODECS["OffsetCommitResponse"], 9))(bad)
            except OverflowError:
                pass

    assert_no_leak(run, [samples[0][2], CLASSES["OffsetCommitResponse"]], warm=10, rounds=50)


def test_encoder_follows_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    obj = example_value("MetadataResponse", 12, 2)
    monkeypatch.setattr(accel, "ENABLED", True)
    fast = encode(obj, 12)
    assert type(CODECS["MetadataResponse"].encoder(12)).__name__ == "builtin_function_or_method"
    monkeypatch.setattr(accel, "ENABLED", False)
    assert encode(obj, 12) == fast
    assert b"".join(encode_frame(obj, 12, b"\x00\x00\x00\x09")) == (len(fast) + 4).to_bytes(4, "big") + \
        b"\x00\x00\x00\x09" + fast


def test_encoder_rejects_bad_descriptions() -> None:
    sp = accel._speedups
    K: Any = CLASSES["FetchResponse"].EpochEndOffset
    slots = ("epoch", "end_offset")
    ok = ((0, sp.KINDS["int32"], 0, None, 0, None), (1, sp.KINDS["int64"], 0, None, 0, None))
    assert sp.Encoder(K, "EpochEndOffset", slots, ok, (), False).encode(K(epoch=1, end_offset=2)) == [
        b"\x00\x00\x00\x01" + b"\x00" * 7 + b"\x02"]
    with pytest.raises(ValueError):
        sp.Encoder(K, "x", slots, ((0, 99, 0, None, 0, None),), (), False)
    with pytest.raises(ValueError):  # a default kind reads nothing: no encoder op
        sp.Encoder(K, "x", slots, ((0, sp.KINDS["const"], 0, None, 0, None),), (), False)
    with pytest.raises(ValueError):
        sp.Encoder(K, "x", slots, ((5, 3, 0, None, 0, None),), (), False)
    with pytest.raises(TypeError):
        sp.Encoder(K, "x", slots, ((0, sp.KINDS["struct"], 0, None, 0, None),), (), False)
    with pytest.raises(ValueError):  # a tagged op needs a skip rule
        sp.Encoder(K, "x", slots, (), ((0, (0, 3, 0, None, 0, None)),), True)
