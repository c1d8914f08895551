"""Fuzz: random, truncated and bit-flipped record batches only ever raise ProtocolError."""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.compression import CODEC_NAMES, compress, decompress
from protocol.errors import ProtocolError
from protocol.records import (
    build_batch,
    build_control_batch,
    decode_batch,
    decode_batch_keys_values,
    iter_batches,
    parse_batch_header,
    parse_control_record,
    rewrite_crc,
    validate_batch,
)

CODECS = [0, 1, 2, 3, 4]
RECORDS = [
    (b"k1", b"value one", [("h", b"x"), ("n", None)], 1000),
    (None, b"v" * 40, [], 1003),
    (b"k3", None, [], 990),
]


def _consume(buf: Any) -> None:
    """Every reader of untrusted batch bytes; each may succeed or raise ProtocolError only."""
    readers: list[Callable[[], object]] = [
        lambda: parse_batch_header(buf),
        lambda: validate_batch(buf),
        lambda: decode_batch(buf),
        lambda: decode_batch(buf, verify_crc=False),
        lambda: decode_batch_keys_values(buf, verify_crc=False),
        lambda: list(iter_batches(buf)),
        lambda: list(iter_batches(buf, strict=True, validate=True)),
    ]
    for read in readers:
        try:
            read()
        except ProtocolError:
            pass


def _decode_ignoring_crc(buf: bytearray) -> None:
    """Fix the CRC first so the flip reaches the record and decompression code."""
    try:
        rewrite_crc(buf, 0)
        _, recs = decode_batch(buf)
        for rec in recs:
            parse_control_record(rec)
    except ProtocolError:
        pass


def test_random_bytes() -> None:
    rng = random.Random(1234)
    template = bytearray(build_batch(RECORDS))
    for i in range(3000):
        n = rng.choice([0, 1, 11, 12, 13, 60, 61, 62, 100, 300, rng.randrange(2000)])
        buf = bytearray(rng.getrandbits(8) for _ in range(n))
        if i % 2 and n >= 61:
            # keep a plausible header so the fuzz gets past the magic/length checks
            buf[:17] = template[:17]
            buf[8:12] = (n - 12).to_bytes(4, "big")
            if i % 4 == 1:
                rewrite_crc(buf, 0)
        _consume(bytes(buf))
        _decode_ignoring_crc(buf)


@pytest.mark.parametrize("codec", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_truncations(codec: int) -> None:
    batch = build_batch(RECORDS, compression=codec)
    for cut in range(len(batch)):
        _consume(batch[:cut])
        fixed = bytearray(batch[:cut])
        if cut >= 61:  # declare the truncated length and a valid CRC: decoding must still fail cleanly
            fixed[8:12] = (cut - 12).to_bytes(4, "big")
            _decode_ignoring_crc(fixed)


@pytest.mark.parametrize("codec", CODECS, ids=[CODEC_NAMES[c] for c in CODECS])
def test_bit_flips(codec: int) -> None:
    batch = build_batch(RECORDS, compression=codec, producer_id=1, producer_epoch=0, base_sequence=0)
    for bit in range(len(batch) * 8):
        flipped = bytearray(batch)
        flipped[bit // 8] ^= 1 << (bit % 8)
        _consume(flipped)
        _decode_ignoring_crc(flipped)


def test_bit_flips_control_batch() -> None:
    batch = build_control_batch("COMMIT", 5, 1, 2, timestamp=0)
    for bit in range(len(batch) * 8):
        flipped = bytearray(batch)
        flipped[bit // 8] ^= 1 << (bit % 8)
        _consume(flipped)
        _decode_ignoring_crc(flipped)


@pytest.mark.parametrize("codec", [1, 2, 3, 4], ids=[CODEC_NAMES[c] for c in [1, 2, 3, 4]])
def test_decompress_fuzz(codec: int) -> None:
    rng = random.Random(codec)
    packed = compress(codec, b"".join(b"record %d;" % i for i in range(300)))
    inputs = [packed[:cut] for cut in range(len(packed))]
    for _ in range(2000):
        flipped = bytearray(packed)
        for _ in range(rng.choice([1, 1, 2, 8])):
            flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
        inputs.append(bytes(flipped))
    inputs += [bytes(rng.getrandbits(8) for _ in range(rng.randrange(300))) for _ in range(500)]
    inputs += [packed[:16] + bytes(rng.getrandbits(8) for _ in range(100)) for _ in range(500)]
    for data in inputs:
        try:
            decompress(codec, data, max_size=1 << 20)
        except ProtocolError:
            pass


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=400), codec=st.sampled_from(CODECS))
def test_hypothesis_bytes(data: bytes, codec: int) -> None:
    _consume(data)
    try:
        decompress(codec, data, max_size=1 << 20)
    except ProtocolError:
        pass


@settings(max_examples=200, deadline=None)
@given(
    codec=st.sampled_from(CODECS),
    edits=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), max_size=6),
)
def test_hypothesis_edits(codec: int, edits: list[tuple[int, int]]) -> None:
    buf = bytearray(build_batch(RECORDS, compression=codec))
    for pos, value in edits:
        buf[pos % len(buf)] = value
    _consume(buf)
    _decode_ignoring_crc(buf)
