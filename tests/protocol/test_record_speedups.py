"""The records decoders in C (protocol/_record_speedups.c) against the pure-Python ones in
protocol/records.py, and decode_batch_keys_values against decode_batch.

On random batches (every codec, control batches, LogAppendTime, headers, null keys and values)
both paths give identical records; on truncated, bit-flipped and hand-made malformed sections
(varints too long or cut short, lengths overrunning a record, header counts, trailing bytes)
both raise ProtocolError or both give the same records. (key, value) decoding fails exactly
where full decoding fails.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from leaks import assert_no_leak

import protocol.records as R
from protocol import accel
from protocol.errors import ProtocolError
from protocol.records import (
    LOG_APPEND_TIME,
    RECORDS_OFFSET,
    Record,
    build_batch,
    build_control_batch,
    decode_batch,
    decode_batch_keys_values,
    parse_control_key_value,
    parse_control_record,
)

C = R._c
needs_c = pytest.mark.skipif(C is None, reason="protocol._record_speedups is not built")

CODECS = [0, 1, 2, 3, 4]

_records = st.lists(
    st.tuples(
        st.one_of(st.none(), st.binary(max_size=40)),
        st.one_of(st.none(), st.binary(max_size=300)),
        st.lists(st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=8))), max_size=3),
        st.integers(0, 2**45),
    ),
    max_size=12,
)


@pytest.fixture
def python_only() -> Iterator[None]:
    """accel.ENABLED switched off: protocol/records.py decodes in Python."""
    enabled = accel.ENABLED
    accel.ENABLED = False
    try:
        yield
    finally:
        accel.ENABLED = enabled


def switched(enabled: bool, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(*args) with the C decoders switched on or off."""
    before = accel.ENABLED
    accel.ENABLED = enabled
    try:
        return fn(*args)
    finally:
        accel.ENABLED = before


def outcome(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except ProtocolError:
        return ProtocolError


def both_records(data: bytes, count: int, base_offset: int = 5, base_ts: int = 1000,
                 log_append_time: int | None = None) -> Any:
    """The C and Python decoders' outcomes (records or ProtocolError) on one records section."""
    args = (data, count, base_offset, base_ts, log_append_time)
    return outcome(C.decode_records, *args), outcome(R._decode_records, *args)


def both_keys_values(data: bytes, count: int) -> Any:
    return outcome(C.keys_values, data, count), outcome(R._keys_values, data, count)


def section(batch: bytes) -> bytes:
    return batch[RECORDS_OFFSET:]


@needs_c
@settings(max_examples=150, deadline=None)
@given(records=_records, codec=st.sampled_from(CODECS), base_offset=st.integers(0, 2**62),
       log_append=st.booleans(), transactional=st.booleans())
def test_random_batches_decode_alike(records: list[Any], codec: int, base_offset: int, log_append: bool,
                                     transactional: bool) -> None:
    batch = build_batch(records, base_offset=base_offset, compression=codec,
                        timestamp_type=LOG_APPEND_TIME if log_append else 0,
                        producer_id=7 if transactional else -1, producer_epoch=1 if transactional else -1,
                        is_transactional=transactional)
    header, fast = switched(True, decode_batch, batch)
    _, fast_kv = switched(True, decode_batch_keys_values, batch)
    assert switched(False, decode_batch, batch) == (header, fast)
    assert switched(False, decode_batch_keys_values, batch) == (header, fast_kv)
    assert all(type(r) is Record for r in fast)
    assert fast_kv == [(r.key, r.value) for r in fast]
    assert [(r.key, r.value, r.headers) for r in fast] == [(k, v, h) for k, v, h, _ in records]
    assert [r.offset for r in fast] == list(range(base_offset, base_offset + len(records)))


@needs_c
def test_control_batches_decode_alike() -> None:
    for kind in ("COMMIT", "ABORT"):
        batch = build_control_batch(kind, 42, 3, 9, base_offset=100, timestamp=5)
        header, records = decode_batch(batch)
        _, kvs = decode_batch_keys_values(batch)
        assert header.is_control and kvs == [(records[0].key, records[0].value)]
        assert parse_control_key_value(*kvs[0]) == parse_control_record(records[0])
        assert both_records(section(batch), 1) == (records_at(records, 5, 1000), records_at(records, 5, 1000))


def records_at(records: list[Record], base_offset: int, base_ts: int) -> list[Record]:
    """`records` decoded again from offset `base_offset` and time `base_ts` (deltas from 100 and 5)."""
    return [r._replace(offset=r.offset - 100 + base_offset, timestamp=r.timestamp - 5 + base_ts) for r in records]


@needs_c
@pytest.mark.parametrize("codec", CODECS)
def test_damaged_sections_fail_alike(codec: int) -> None:
    rng = random.Random(codec)
    records = [(b"k%d" % i if i % 3 else None, b"v" * (i * 7), [("h", b"x")] * (i % 2), 1000 + i) for i in range(6)]
    data = section(build_batch(records, compression=0))  # the decoders see decompressed sections
    count = len(records)
    cases = [data[:n] for n in range(len(data))]
    for _ in range(300):
        damaged = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            damaged[rng.randrange(len(damaged))] = rng.randrange(256)
        cases.append(bytes(damaged))
    cases += [data + b"\x00", data * 2, bytes(rng.randrange(256) for _ in range(64))]
    for case in cases:
        for n in (count - 1, count, count + 1):
            fast, slow = both_records(case, n)
            assert fast == slow, (case, n)
            fast_kv, slow_kv = both_keys_values(case, n)
            assert fast_kv == slow_kv, (case, n)
            assert fast_kv == (ProtocolError if fast is ProtocolError else [(r.key, r.value) for r in fast])


def varint(n: int) -> bytes:
    """Zigzag varint of any size (the decoders must refuse the long ones)."""
    z = (n << 1) ^ (n >> 63)
    out = bytearray()
    while z > 0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def record(body: bytes) -> bytes:
    return varint(len(body)) + body


PLAIN = b"\x00" + varint(3) + varint(1) + varint(1) + b"k" + varint(1) + b"v" + varint(0)

MALFORMED = {
    "plain": record(PLAIN),
    "null key and value": record(b"\x00\x00\x00\x01\x01\x00"),
    "five-byte varint length": bytes([0x80 | (len(PLAIN) << 1), 0x80, 0x80, 0x80, 0x00]) + PLAIN,
    "six-byte varint": bytes([0x82, 0x80, 0x80, 0x80, 0x80, 0x00]) + PLAIN,
    "varint bits past 32 dropped": bytes([0x80 | (len(PLAIN) << 1), 0x80, 0x80, 0x80, 0x70]) + PLAIN,
    "ten-byte varlong": record(b"\x00" + b"\xff" * 9 + b"\x01" + varint(1) + b"\x01\x01\x00"),
    "eleven-byte varlong": record(b"\x00" + b"\xff" * 10 + b"\x01" + varint(1) + b"\x01\x01\x00"),
    "largest timestamp delta": record(b"\x00" + varint(2**63 - 1) + varint(0) + b"\x01\x01\x00"),
    "smallest timestamp delta": record(b"\x00" + varint(-(2**63)) + varint(0) + b"\x01\x01\x00"),
    "negative offset delta": record(b"\x00\x00" + varint(-5) + b"\x01\x01\x00"),
    "zero length": varint(0),
    "negative length": varint(-3) + PLAIN,
    "length past the end": varint(len(PLAIN) + 1) + PLAIN,
    "key overruns": record(b"\x00\x00\x00" + varint(9) + b"k\x01\x00"),
    "value overruns": record(b"\x00\x00\x00\x01" + varint(9) + b"v\x00"),
    "negative header count": record(b"\x00\x00\x00\x01\x01" + varint(-1)),
    "header count beyond the record": record(b"\x00\x00\x00\x01\x01" + varint(5) + b"\x00\x00"),
    "headers": record(b"\x00\x00\x00\x01\x01" + varint(2) + varint(1) + b"a" + varint(-1) + varint(2) + b"\xff\xfe"
                      + varint(1) + b"z"),
    "negative header key length": record(b"\x00\x00\x00\x01\x01" + varint(1) + varint(-1) + varint(-1)),
    "header value overruns": record(b"\x00\x00\x00\x01\x01" + varint(1) + varint(1) + b"a" + varint(4) + b"x"),
    "record longer than its fields": record(PLAIN + b"\x00"),
    "varints running past the record": varint(2) + b"\x00\x81" + b"\x01" * 8,
    "cut inside a varint": record(PLAIN) + b"\x80",
}


# the sections of MALFORMED that hold one valid record
VALID = {"plain", "null key and value", "five-byte varint length", "varint bits past 32 dropped", "ten-byte varlong",
         "largest timestamp delta", "smallest timestamp delta", "negative offset delta", "headers"}


@needs_c
@pytest.mark.parametrize("name", sorted(MALFORMED))
@pytest.mark.parametrize("extra", [0, 1])
def test_hand_made_sections_decode_alike(name: str, extra: int) -> None:
    data = MALFORMED[name] + b"\x00" * extra  # a trailing 0: a record of length 0, or bytes left over
    for count in (1, 2):
        for base_offset, base_ts, log_append_time in [(0, 0, None), (2**63 - 1, 2**63 - 1, None), (3, -(2**63), 77)]:
            fast, slow = both_records(data, count, base_offset, base_ts, log_append_time)
            assert fast == slow
            assert (fast is not ProtocolError) == (name in VALID and count == 1 and not extra)
        fast_kv, slow_kv = both_keys_values(data, count)
        assert fast_kv == slow_kv and (fast_kv is ProtocolError) == (fast is ProtocolError)


@needs_c
def test_sums_past_64_bits_are_exact() -> None:
    data = MALFORMED["largest timestamp delta"]
    (fast,), (slow,) = both_records(data, 1, base_offset=2**63 - 1, base_ts=2**63 - 1)
    assert fast == slow and fast.timestamp == 2**64 - 2


@needs_c
def test_buffers_of_any_kind() -> None:
    data = section(build_batch([(b"k", b"v", [("h", None)], 1)]))
    expected = C.decode_records(data, 1, 0, 0, None)
    assert C.decode_records(bytearray(data), 1, 0, 0, None) == expected
    assert C.decode_records(memoryview(b"xx" + data)[2:], 1, 0, 0, None) == expected
    assert C.keys_values(memoryview(data), 1) == [(b"k", b"v")]
    with pytest.raises(TypeError):
        C.keys_values("text", 1)
    with pytest.raises(ProtocolError):
        C.keys_values(data, -1)


def test_the_python_path_serves_when_switched_off(python_only: None) -> None:
    batch = build_batch([(b"k", b"v", [], 1), (None, None, [], 2)], compression=1)
    assert decode_batch_keys_values(batch)[1] == [(b"k", b"v"), (None, None)]
    assert [(r.key, r.value) for r in decode_batch(batch)[1]] == [(b"k", b"v"), (None, None)]
    assert decode_batch_keys_values(build_batch([]))[1] == []


@needs_c
def test_repeated_decodes_do_not_leak() -> None:
    samples = [(section(build_batch([(b"k", b"v" * 50, [("h", b"x")], 1)] * 20)), 20)]
    samples += [(data, 2) for data in MALFORMED.values()]

    def run(times: int) -> None:
        for _ in range(times):
            for data, count in samples:
                outcome(C.decode_records, data, count, 10, 10, None)
                outcome(C.keys_values, data, count)

    assert_no_leak(run, [Record], warm=20, rounds=200)
