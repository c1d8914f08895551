"""The C decoder (protocol/_speedups.c, driven by protocol/accel.py) against the generated Python one.

For every definition at every version: valid encodings decode to identical objects (same types,
same values, same end position) in both paths, and truncated, bit-flipped and random inputs
give the same outcome (identical object, or ProtocolError with the same code). The C path must
never raise anything but ProtocolError. Then the corners: tagged fields (unknown, repeated,
wrong size), varints, zero-copy records, UUIDs, fresh defaults, GC state, leaks, and the
KAFKA_PY_NO_SPEEDUPS switch.
"""

from __future__ import annotations

import gc
import os
import random
import struct
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from leaks import assert_no_leak
from strategies import example_value, message_values

from protocol import accel
from protocol.codecs import _DECODE_ERRORS
from protocol.errors import ErrorCode, ProtocolError
from protocol.messages import CODECS, MessageBase, decode, encode
from protocol.primitives import ZERO_UUID

pytestmark = pytest.mark.skipif(not accel.AVAILABLE, reason=accel.UNAVAILABLE_REASON or "no speedups")

PAIRS = [(name, v) for name, codec in sorted(CODECS.items()) for v in codec.spec.valid_versions]
PAIR_IDS = ["%s-v%d" % p for p in PAIRS]
SEEDS = 3
MAX_TRUNCATIONS = 80
MUTATIONS = 40
RANDOM_INPUTS = 4

Decoder = Callable[[Any, Any, int], tuple[Any, int]]


def snapshot(value: Any) -> Any:
    """A comparable picture of a decoded value that also pins down every type exactly."""
    if isinstance(value, MessageBase):
        return (type(value), tuple(snapshot(getattr(value, a)) for a in value.FIELDS))
    if type(value) is list:
        return ("list", [snapshot(v) for v in value])
    if type(value) is memoryview:
        return ("memoryview", value.tobytes())
    if type(value) is float:
        return ("float", struct.pack(">d", value))  # NaN payloads too
    if type(value) is uuid.UUID:
        return ("uuid", value.int, value.is_safe)
    return (type(value), value)


def outcome(decoder: Decoder, data: Any, *, native: bool) -> Any:
    """('ok', snapshot, end) or ('error', code). Only the Python path may raise the low-level
    errors that protocol.messages turns into ProtocolError; the C path raises ProtocolError itself."""
    try:
        obj, pos = decoder(data, data if isinstance(data, memoryview) else memoryview(data), 0)
    except ProtocolError as exc:
        return ("error", exc.code)
    except _DECODE_ERRORS:
        if native:
            raise
        return ("error", ErrorCode.CORRUPT_MESSAGE)
    return ("ok", snapshot(obj), pos)


def both(name: str, version: int) -> tuple[Decoder, Decoder]:
    codec = CODECS[name]
    return accel.build_decoder(codec, version), codec.py_decoder(version)


def mutations(data: bytes, rng: random.Random) -> Iterator[bytes]:
    """Truncations (evenly spread when there are many), byte and bit changes, random inputs."""
    step = max(1, len(data) // MAX_TRUNCATIONS)
    for end in range(0, len(data), step):
        yield data[:end]
    for _ in range(MUTATIONS if data else 0):
        b = bytearray(data)
        for _ in range(rng.choice((1, 1, 2, 3))):
            i = rng.randrange(len(b))
            if rng.random() < 0.5:
                b[i] ^= 1 << rng.randrange(8)
            else:
                b[i] = rng.choice((0x00, 0x01, 0x7F, 0x80, 0xFF, rng.randrange(256)))
        yield bytes(b)
    yield data + b"\x00"
    for _ in range(RANDOM_INPUTS):
        yield rng.randbytes(rng.randrange(48))


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
def test_valid_and_mutated_inputs_decode_alike(name: str, version: int) -> None:
    fast, slow = both(name, version)
    rng = random.Random("%s/%d" % (name, version))
    for seed in range(SEEDS):
        obj = example_value(name, version, seed)
        data = encode(obj, version)
        got = outcome(fast, data, native=True)
        assert got == outcome(slow, data, native=False)
        assert got[0] == "ok" and got[2] == len(data)
        back, _ = fast(data, memoryview(data), 0)
        assert back == obj
        assert encode(back, version) == data
        for bad in mutations(data, rng):
            assert outcome(fast, bad, native=True) == outcome(slow, bad, native=False), bad.hex()


HYPOTHESIS = settings(
    max_examples=15, deadline=None, derandomize=True, database=None, suppress_health_check=list(HealthCheck)
)
BENCH_PAIRS = [("ProduceRequest", 9), ("FetchResponse", 12), ("MetadataResponse", 12), ("JoinGroupResponse", 7)]


@pytest.mark.parametrize(("name", "version"), BENCH_PAIRS, ids=["%s-v%d" % p for p in BENCH_PAIRS])
@HYPOTHESIS
@given(data=st.data())
def test_hypothesis_values_decode_alike(name: str, version: int, data: st.DataObject) -> None:
    obj = data.draw(message_values(name, version))
    raw = encode(obj, version)
    fast, slow = both(name, version)
    assert outcome(fast, raw, native=True) == outcome(slow, raw, native=False)
    assert fast(raw, memoryview(raw), 0)[0] == obj


# ---- tagged fields and varints --------------------------------------------------------------
# ApiVersionsResponse v3: error_code int16, api_keys compact array, throttle_time_ms int32, then
# tags: 0 SupportedFeatures, 1 FinalizedFeaturesEpoch (int64), 2 FinalizedFeatures, 3 ZkMigrationReady.
_API_VERSIONS_HEAD = b"\x00\x00" + b"\x01" + b"\x00\x00\x00\x07"


def _tags(*fields: tuple[bytes, bytes, bytes]) -> bytes:
    """A tag buffer from (tag varint, size varint, payload) triples."""
    return bytes([len(fields)]) + b"".join(t + s + p for t, s, p in fields)


EPOCH = struct.pack(">q", 1234)
TAGGED_CASES = {
    "no tags": _tags(),
    "known tag": _tags((b"\x01", b"\x08", EPOCH)),
    "unknown tag skipped": _tags((b"\x09", b"\x03", b"abc"), (b"\x01", b"\x08", EPOCH)),
    "repeated tag, last wins": _tags((b"\x01", b"\x08", EPOCH), (b"\x01", b"\x08", struct.pack(">q", 5))),
    "size larger than value": _tags((b"\x01", b"\x09", EPOCH + b"\x00")),
    "size smaller than value": _tags((b"\x01", b"\x07", EPOCH)),
    "size beyond buffer": _tags((b"\x09", b"\x20", b"abc")),
    "bool tag": _tags((b"\x03", b"\x01", b"\x01")),
    "bool tag, odd byte": _tags((b"\x03", b"\x01", b"\x02")),
    "multi-byte tag number": _tags((b"\x80\x01", b"\x01", b"x")),
    "multi-byte size": _tags((b"\x09", b"\x81\x00", b"y")),
    "5-byte varint count": b"\x80\x80\x80\x80\x00",
    "6-byte varint count": b"\x80\x80\x80\x80\x80\x00",
    "huge count": b"\xff\xff\xff\xff\x0f" + b"\x01\x00",
    "truncated varint": b"\x01\x80",
    "array tag with elements": _tags((b"\x00", b"\x08", b"\x02\x02f\x00\x01\x00\x02\x00")),
    "array tag, element overruns": _tags((b"\x00", b"\x08", b"\x02\x09f\x00\x01\x00\x02\x00")),
}


@pytest.mark.parametrize("case", sorted(TAGGED_CASES))
def test_tagged_fields(case: str) -> None:
    data = _API_VERSIONS_HEAD + TAGGED_CASES[case]
    fast, slow = both("ApiVersionsResponse", 3)
    got = outcome(fast, data, native=True)
    assert got == outcome(slow, data, native=False)
    expect_ok = case in {
        "no tags", "known tag", "unknown tag skipped", "repeated tag, last wins", "bool tag",
        "bool tag, odd byte", "multi-byte tag number", "multi-byte size", "5-byte varint count",
        "array tag with elements",
    }  # fmt: skip
    assert got[0] == ("ok" if expect_ok else "error"), got
    if case == "repeated tag, last wins":
        obj, _ = fast(data, memoryview(data), 0)
        assert obj.finalized_features_epoch == 5


@pytest.mark.parametrize(
    "length",
    [b"\x00", b"\x01", b"\x80\x01", b"\xff\xff\xff\xff\x0f", b"\x80\x80\x80\x80\x80\x01", b"\xff"],
    ids=["null", "empty", "two-byte", "five-byte", "six-byte", "truncated"],
)
def test_compact_lengths(length: bytes) -> None:
    # JoinGroupResponse v7: int32 throttle, int16 error, int32 generation, then the nullable
    # compact string protocol_type whose length we vary
    data = b"\x00\x00\x00\x00" + b"\x00\x00" + b"\x00\x00\x00\x01" + length + b"abc" * 50
    fast, slow = both("JoinGroupResponse", 7)
    assert outcome(fast, data, native=True) == outcome(slow, data, native=False)


def test_negative_non_nullable_lengths_are_errors() -> None:
    # MetadataRequest v0: a non-nullable int32-length array of int16-length strings
    for data in (b"\xff\xff\xff\xff", b"\x80\x00\x00\x00", b"\x00\x00\x00\x01\xff\xff", b"\x00\x00\x00\x01\xff\xfe"):
        fast, slow = both("MetadataRequest", 0)
        got = outcome(fast, data, native=True)
        assert got == outcome(slow, data, native=False)
        assert got[0] == "error"


def test_invalid_utf8_is_a_protocol_error() -> None:
    data = b"\x00\x00\x00\x01\x00\x02\xc3\x28"
    fast, slow = both("MetadataRequest", 0)
    assert outcome(fast, data, native=True) == outcome(slow, data, native=False) == ("error", 2)


# ---- values ---------------------------------------------------------------------------------
def test_records_are_zero_copy_slices_of_the_input() -> None:
    M: Any = CODECS["ProduceRequest"].root_class
    batch = bytes(range(200))
    msg = M(acks=-1, timeout_ms=100, topic_data=[M.TopicProduceData(name="t", partition_data=[
        M.PartitionProduceData(index=0, records=batch), M.PartitionProduceData(index=1, records=None)])])  # fmt: skip
    data = encode(msg, 9)
    framed = b"\x00" * 7 + data + b"\x00" * 3  # the message inside a larger buffer
    view = memoryview(framed)[7 : 7 + len(data)]
    for source in (data, bytearray(data), view):
        out = decode("ProduceRequest", 9, source)
        records = out.topic_data[0].partition_data[0].records
        assert type(records) is memoryview and records.tobytes() == batch
        assert records.obj is (source.obj if isinstance(source, memoryview) else source)
        assert records.readonly == (not isinstance(source, bytearray))
        assert records.format == "B" and records.ndim == 1 and records.c_contiguous
        assert bytes(records[5:10]) == batch[5:10]
        assert out.topic_data[0].partition_data[1].records is None
        assert out == msg


def test_uuids_are_real_uuids() -> None:
    M: Any = CODECS["MetadataResponse"].root_class
    ids = [uuid.uuid4(), uuid.UUID(int=0), uuid.UUID(int=2**128 - 1), uuid.UUID(int=1)]
    msg = M(topics=[M.MetadataResponseTopic(name="t%d" % i, topic_id=u) for i, u in enumerate(ids)])
    out = decode("MetadataResponse", 12, encode(msg, 12))
    for topic, u in zip(out.topics, ids):
        assert type(topic.topic_id) is uuid.UUID
        assert topic.topic_id == u and hash(topic.topic_id) == hash(u) and str(topic.topic_id) == str(u)
        assert topic.topic_id.is_safe is uuid.SafeUUID.unknown
        with pytest.raises(TypeError):
            topic.topic_id.int = 5  # type: ignore[misc]  # still immutable
    assert out.topics[1].topic_id is ZERO_UUID


def test_defaults_are_fresh_per_object() -> None:
    F: Any = CODECS["FetchResponse"].root_class
    msg = F(responses=[F.FetchableTopicResponse(topic="t", partitions=[F.PartitionData(), F.PartitionData()])])
    data = encode(msg, 12)  # v12: no node_endpoints field, tagged structs left at their defaults
    first = decode("FetchResponse", 12, data)
    second = decode("FetchResponse", 12, data)
    assert first == msg
    p0, p1 = first.responses[0].partitions
    assert p0.diverging_epoch == F.EpochEndOffset() and p0.diverging_epoch is not p1.diverging_epoch
    assert p0.current_leader is not second.responses[0].partitions[0].current_leader
    assert first.node_endpoints == [] and first.node_endpoints is not second.node_endpoints
    p0.diverging_epoch.epoch = 99
    assert p1.diverging_epoch.epoch == -1


def test_gc_state_is_restored() -> None:
    data = encode(example_value("MetadataResponse", 12, 1), 12)
    was = gc.isenabled()
    try:
        for enabled in (True, False):
            gc.enable() if enabled else gc.disable()
            decode("MetadataResponse", 12, data)
            assert gc.isenabled() is enabled
            with pytest.raises(ProtocolError):
                decode("MetadataResponse", 12, data[:-3])
            assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


def test_repeated_decodes_do_not_leak() -> None:
    samples = []
    for name, version in [*BENCH_PAIRS, ("ApiVersionsResponse", 3), ("ConsumerGroupHeartbeatResponse", 1)]:
        data = encode(example_value(name, version, 2), version)
        samples += [(name, version, data), (name, version, data[: len(data) // 2]), (name, version, data[:-1])]
    samples += [("ApiVersionsResponse", 3, _API_VERSIONS_HEAD + case) for case in TAGGED_CASES.values()]

    def run(times: int) -> None:
        for _ in range(times):
            for name, version, data in samples:
                try:
                    decode(name, version, data)
                except ProtocolError:
                    pass

    partition_class: Any = CODECS["FetchResponse"].root_class
    assert_no_leak(run, [ZERO_UUID, partition_class.PartitionData], warm=50, rounds=300)


# ---- wiring ---------------------------------------------------------------------------------
def test_decoder_follows_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    codec = CODECS["MetadataResponse"]
    monkeypatch.setattr(accel, "ENABLED", True)
    assert type(codec.decoder(12)).__name__ == "builtin_function_or_method"
    monkeypatch.setattr(accel, "ENABLED", False)
    assert codec.decoder(12) is codec.py_decoder(12)


def test_env_var_forces_pure_python() -> None:
    code = "import protocol.accel as a, protocol.messages as m; print(a.ENABLED, a.AVAILABLE, m.CODECS['ProduceRequest'].decoder(9).__name__)"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {**os.environ, "KAFKA_PY_NO_SPEEDUPS": "1", "PYTHONPATH": root}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True, cwd=root)
    assert out.stdout.split() == ["False", "True", "d_ProduceRequest_9"]


def test_program_rejects_bad_descriptions() -> None:
    sp = accel._speedups
    K: Any = CODECS["FetchResponse"].root_class
    K = K.EpochEndOffset
    slots = ("epoch", "end_offset")
    ok = ((0, sp.KINDS["int32"], 0, None, "Epoch"), (1, sp.KINDS["int64"], 0, None, "EndOffset"))
    assert sp.Program(K, "EpochEndOffset", slots, ok, (), False).decode(b"\x00" * 12, None, 0)[1] == 12
    with pytest.raises(ValueError):
        sp.Program(K, "x", slots, ((0, 99, 0, None, "Epoch"),), (), False)
    with pytest.raises(ValueError):
        sp.Program(K, "x", slots, ((5, 3, 0, None, "Epoch"),), (), False)
    with pytest.raises(AttributeError):
        sp.Program(K, "x", ("nope",), ((0, 3, 0, None, "Epoch"),), (), False)
    with pytest.raises(TypeError):  # an attribute, but not a slot
        sp.Program(K, "x", ("FIELDS",), ((0, 3, 0, None, "Epoch"),), (), False)
    with pytest.raises(TypeError):
        sp.Program(K, "x", slots, ((0, sp.KINDS["struct"], 0, None, "Epoch"),), (), False)
    with pytest.raises(ValueError):
        sp.Program(K, "x", slots, ok, ((0, (0, sp.KINDS["const"], 0, 1, "Epoch")),), False)
