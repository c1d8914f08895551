"""Malformed input to the message decoders only ever raises ProtocolError.

For every request definition at every version, a sample of responses, the headers and the
internal records: random bytes, every truncation of valid encodings and bit flips of valid
encodings. Seeded and bounded (at most a few hundred inputs per (definition, version)).
A successful decode of a mutated input must give an object that encodes and decodes again.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from strategies import example_value

from protocol.errors import ProtocolError
from protocol.frames import decode_request_header
from protocol.messages import CODECS, REQUESTS, RESPONSES, decode, decode_request, decode_response, encode

SAMPLED_RESPONSES = [0, 1, 2, 3, 8, 9, 10, 11, 14, 18, 22, 68, 76, 78, 79]
MAX_TRUNCATIONS = 120
FLIPS = 60
RANDOM_INPUTS = 24


def _targets() -> list[tuple[str, int, str]]:
    out = []
    for key in sorted(REQUESTS):
        for v in REQUESTS[key].spec.valid_versions:
            out.append(("request", key, REQUESTS[key].spec.name + "-v%d" % v))
    for key in SAMPLED_RESPONSES:
        for v in RESPONSES[key].spec.valid_versions:
            out.append(("response", key, RESPONSES[key].spec.name + "-v%d" % v))
    for name, codec in sorted(CODECS.items()):
        if codec.spec.type not in ("request", "response"):
            for v in codec.spec.valid_versions:
                out.append(("other", -1, name + "-v%d" % v))
    return out


TARGETS = _targets()


def _decoder(kind: str, key: int, name: str, version: int) -> Callable[[Any], Any]:
    if kind == "request":
        return lambda data: decode_request(key, version, data)
    if kind == "response":
        return lambda data: decode_response(key, version, data)
    return lambda data: decode(name, version, data)


def _mutations(valid: list[bytes], rng: random.Random) -> Iterator[tuple[str, bytes]]:
    for i in range(RANDOM_INPUTS):
        yield "random", rng.randbytes(rng.choice([0, 1, 2, 5, 8, 16, 33, 64, 200]) if i else 0)
    for data in valid:
        cuts = list(range(len(data)))
        if len(data) > MAX_TRUNCATIONS:
            cuts = sorted(rng.sample(cuts, MAX_TRUNCATIONS))
        for n in cuts:
            yield "truncated", data[:n]
        if not data:
            continue
        for _ in range(FLIPS):
            buf = bytearray(data)
            pos = rng.randrange(len(buf))
            if rng.random() < 0.7:
                buf[pos] ^= 1 << rng.randrange(8)
            else:  # lengths and counts are the interesting targets: make them huge, null or negative
                buf[pos] = rng.choice([0x00, 0x7F, 0x80, 0xFF])
            yield "mutated", bytes(buf)
        yield "extended", data + rng.randbytes(rng.randint(1, 4))


@pytest.mark.parametrize(("kind", "key", "label"), TARGETS, ids=[t[2] for t in TARGETS])
def test_malformed_input_raises_protocol_error(kind: str, key: int, label: str) -> None:
    name, _, v = label.rpartition("-v")
    version = int(v)
    rng = random.Random(label)
    dec = _decoder(kind, key, name, version)
    valid = [encode(example_value(name, version, seed), version) for seed in range(2)]
    for how, data in _mutations(valid, rng):
        try:
            obj = dec(data)
        except ProtocolError:
            continue
        except Exception as exc:  # pragma: no cover - this is the failure being looked for
            raise AssertionError("%s %s input %r raised %r" % (label, how, data.hex(), exc)) from exc
        assert how != "truncated", "%s: truncated input %s decoded" % (label, data.hex())
        # requests, as in Kafka, may carry trailing bytes; nothing else may
        assert how != "extended" or kind == "request", "%s: extended input %s decoded" % (label, data.hex())
        again = encode(obj, version)
        assert encode(dec(again), version) == again  # bytes, not objects: a flip can make a NaN
    if kind == "request":  # trailing bytes are ignored, unless strict
        for data in valid:
            assert encode(dec(data + b"\x00\xff"), version) == data
            with pytest.raises(ProtocolError):
                decode_request(key, version, data + b"\x00", strict=True)


def test_memoryview_and_bytearray_inputs() -> None:
    data = encode(example_value("FetchResponse", 12, 0), 12)
    for cut in (len(data) // 2, len(data) - 1):
        for wrapped in (memoryview(data)[:cut], bytearray(data[:cut])):
            with pytest.raises(ProtocolError):
                decode_response(1, 12, wrapped)


def test_request_header_fuzz() -> None:
    rng = random.Random(7)
    for _ in range(3000):
        data = rng.randbytes(rng.randint(0, 24))
        if rng.random() < 0.5 and len(data) >= 4:
            # a known api key and a flexible version so that header v2 parsing is reached
            data = b"\x00\x12\x00\x03" + data[4:]
        try:
            hdr = decode_request_header(data)
        except ProtocolError:
            continue
        assert 0 <= hdr.body_offset <= len(data)
