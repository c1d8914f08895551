"""Decoding of OTLP metrics (opentelemetry.proto.metrics.v1.MetricsData), as clients push them.

A small protobuf wire reader, pure and bounded: only the parts a metrics pipeline needs are read
(resource attributes; each metric's name and its Gauge or Sum data points with their attributes,
value, time, temporality and monotonicity); histograms and summaries are skipped. Malformed
input raises OtlpError.

Field numbers (metrics.proto / common.proto):
    MetricsData      1 resource_metrics
    ResourceMetrics  1 resource, 2 scope_metrics          Resource  1 attributes
    ScopeMetrics     2 metrics                            Metric    1 name, 5 gauge, 7 sum
    Gauge            1 data_points                        Sum       1 data_points, 2 temporality, 3 monotonic
    NumberDataPoint  7 attributes, 3 time_unix_nano, 4 as_double, 6 as_int
    KeyValue         1 key, 2 value                       AnyValue  1 string, 2 bool, 3 int, 4 double
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from dataclasses import dataclass

DELTA, CUMULATIVE = 1, 2
GAUGE, SUM = "gauge", "sum"
_MAX_DEPTH_BYTES = 64 << 20


class OtlpError(ValueError):
    """The payload is not a valid MetricsData message."""


@dataclass(frozen=True)
class Point:
    name: str
    kind: str  # GAUGE or SUM
    value: float
    attributes: tuple[tuple[str, str], ...]
    time_unix_nano: int = 0
    temporality: int = 0  # Sum: DELTA or CUMULATIVE
    monotonic: bool = False


@dataclass(frozen=True)
class Decoded:
    resource: tuple[tuple[str, str], ...]
    points: list[Point]


def _varint(data: memoryview, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise OtlpError("truncated or overlong varint")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7


def _fields(data: memoryview) -> Iterator[tuple[int, int, int | memoryview]]:
    """(field number, wire type, value) of a message: ints for varint/fixed, views for bytes."""
    pos = 0
    end = len(data)
    while pos < end:
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        value: int | memoryview
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            if pos + 8 > end:
                raise OtlpError("truncated fixed64")
            value = int.from_bytes(data[pos:pos + 8], "little")
            pos += 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            if pos + size > end:
                raise OtlpError("truncated length-delimited field")
            value = data[pos:pos + size]
            pos += size
        elif wire == 5:
            if pos + 4 > end:
                raise OtlpError("truncated fixed32")
            value = int.from_bytes(data[pos:pos + 4], "little")
            pos += 4
        else:
            raise OtlpError("unsupported wire type %d" % wire)
        if number == 0:
            raise OtlpError("field number 0")
        yield number, wire, value


def _text(value: int | memoryview) -> str:
    if not isinstance(value, memoryview):
        raise OtlpError("expected a string")
    try:
        return bytes(value).decode()
    except UnicodeDecodeError:
        raise OtlpError("string is not UTF-8") from None


def _message(value: int | memoryview) -> memoryview:
    if not isinstance(value, memoryview):
        raise OtlpError("expected a message")
    return value


def _double(bits: int) -> float:
    return float(struct.unpack("<d", bits.to_bytes(8, "little"))[0])


def _signed64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _any_value(data: memoryview) -> str:
    for number, wire, value in _fields(data):
        if number == 1:
            return _text(value)
        if number == 2 and wire == 0:
            return "true" if value else "false"
        if number == 3 and wire == 0 and isinstance(value, int):
            return str(_signed64(value))
        if number == 4 and wire == 1 and isinstance(value, int):
            return repr(_double(value))
    return ""  # arrays, maps and bytes are not label material


def _key_value(data: memoryview) -> tuple[str, str]:
    key, text = "", ""
    for number, _, value in _fields(data):
        if number == 1:
            key = _text(value)
        elif number == 2:
            text = _any_value(_message(value))
    return key, text


def _attributes(data: memoryview, number_of_attributes: int) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(_key_value(_message(v)) for n, _, v in _fields(data) if n == number_of_attributes))


def _number_point(data: memoryview, name: str, kind: str, temporality: int, monotonic: bool) -> Point | None:
    value: float | None = None
    attributes: tuple[tuple[str, str], ...] = ()
    time_nano = 0
    for number, wire, raw in _fields(data):
        if number == 4 and wire == 1 and isinstance(raw, int):
            value = _double(raw)
        elif number == 6 and wire == 1 and isinstance(raw, int):
            value = float(_signed64(raw))
        elif number == 3 and wire == 1 and isinstance(raw, int):
            time_nano = raw
        elif number == 7:
            attributes = attributes + (_key_value(_message(raw)),)
    if value is None:
        return None
    return Point(name, kind, value, tuple(sorted(attributes)), time_nano, temporality, monotonic)


def _metric(data: memoryview) -> list[Point]:
    name = ""
    body: tuple[str, memoryview] | None = None
    for number, _, value in _fields(data):
        if number == 1:
            name = _text(value)
        elif number == 5:
            body = (GAUGE, _message(value))
        elif number == 7:
            body = (SUM, _message(value))
    if body is None or not name:
        return []
    kind, payload = body
    temporality, monotonic = 0, False
    raw_points = []
    for number, wire, value in _fields(payload):
        if number == 1:
            raw_points.append(_message(value))
        elif number == 2 and wire == 0 and isinstance(value, int):
            temporality = value
        elif number == 3 and wire == 0:
            monotonic = bool(value)
    points = [_number_point(p, name, kind, temporality, monotonic) for p in raw_points]
    return [p for p in points if p is not None]


def decode_metrics_data(payload: bytes) -> Decoded:
    """The points of every metric in a MetricsData payload (uncompressed)."""
    if len(payload) > _MAX_DEPTH_BYTES:
        raise OtlpError("payload too large")
    resource: tuple[tuple[str, str], ...] = ()
    points: list[Point] = []
    for number, _, resource_metrics in _fields(memoryview(payload)):
        if number != 1:
            continue
        for n, _, value in _fields(_message(resource_metrics)):
            if n == 1:
                resource = _attributes(_message(value), 1)
            elif n == 2:
                for m, _, metric in _fields(_message(value)):
                    if m == 2:
                        points.extend(_metric(_message(metric)))
    return Decoded(resource, points)


# -- encoding (for tests and tools: what a client sends) -------------------------------------------


def _key(number: int, wire: int) -> bytes:
    return _uvarint(number << 3 | wire)


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _len(number: int, body: bytes) -> bytes:
    return _key(number, 2) + _uvarint(len(body)) + body


def _kv(key: str, value: str) -> bytes:
    return _len(1, key.encode()) + _len(2, _len(1, value.encode()))


def encode_metrics_data(resource: dict[str, str], points: list[Point]) -> bytes:
    """A MetricsData payload holding `points` (one metric each), as a client would encode it."""
    metrics = b""
    for p in points:
        point = (_key(3, 1) + p.time_unix_nano.to_bytes(8, "little")
                 + _key(4, 1) + struct.pack("<d", p.value)
                 + b"".join(_len(7, _kv(k, v)) for k, v in p.attributes))
        body = _len(1, point)
        if p.kind == SUM:
            body += _key(2, 0) + _uvarint(p.temporality) + _key(3, 0) + _uvarint(int(p.monotonic))
        metrics += _len(2, _len(1, p.name.encode()) + _len(5 if p.kind == GAUGE else 7, body))
    resource_body = b"".join(_len(1, _kv(k, v)) for k, v in sorted(resource.items()))
    scope = _len(2, metrics)
    return _len(1, _len(1, resource_body) + scope)
