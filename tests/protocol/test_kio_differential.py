"""Differential tests against kio 0.6.5, an independent codec generated from Kafka's schemas.

For every (api, version) we define that kio has, for requests and responses (and the headers and
DefaultPrincipalData, the principal an Envelope carries):
what we encode kio decodes to the same values, what kio encodes we decode to the same values,
and both encoders produce the same bytes.

kio's dataclasses hold the fields present in their version, in schema order, so the field
mapping is built by walking both field lists side by side (checking types, tags and names, kio
renaming `*_ms` fields), not written per message. kio's value conventions are converted:
error codes are `ErrorCode` enums, `*_ms` durations and timestamps are timedelta/datetime,
arrays are tuples, and a zero uuid reads as None.

Values outside what kio can represent are moved into its range first (`fit_for_kio`); those
limits are kio's, not the protocol's (listed below, shown by test_kio_limits_are_real).
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import types
import typing
from dataclasses import dataclass
from functools import cache
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode as KioErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.serial import entity_reader, entity_writer
from kio.static.constants import EntityType
from strategies import example_value, message_values

from protocol.codegen import MessageCodec
from protocol.messages import CODECS, REQUESTS, RESPONSES, decode, encode
from protocol.primitives import ZERO_UUID
from protocol.schema import FieldSpec, StructSpec, snake_case

# Kafka type of our field -> the kio `kafka_type`s it may appear as
COMPATIBLE = {
    "int16": {"int16", "error_code"},
    "int32": {"int32", "timedelta_i32"},
    "int64": {"int64", "timedelta_i64", "datetime_i64"},
}

# kio's limits (fit_for_kio moves values into its range; test_kio_limits_are_real shows them):
# - error codes: kio decodes an int16 error code into its ErrorCode enum and fails on unknown codes.
# - datetime_i64 (e.g. DescribeTransactions TransactionStartTimeMs): kio refuses negative
#   timestamps, although Kafka sends -1 for a transaction in the Empty state; the nullable form
#   (Produce LogAppendTimeMs) maps -1 to None. kio reads through float seconds, which is exact
#   to the millisecond only below about 2**43 ms (year 2248): 35092336375807 reads as ...806.
# - timedelta_i64 (OffsetCommit v2-4 RetentionTimeMs, SaslAuthenticate SessionLifetimeMs): kio's
#   writer goes through float seconds, so it is exact only up to about 2**43 ms.

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_MS = datetime.timedelta(milliseconds=1)
_KIO_CODES = sorted(int(c) for c in KioErrorCode)

HYPOTHESIS = settings(
    max_examples=5,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)


# ----- mapping our definitions onto kio's dataclasses ------------------------------------------


@dataclass(frozen=True)
class FieldMap:
    ours: FieldSpec
    kio_name: str
    kafka_type: str | None  # None for struct fields
    optional: bool  # kio's type admits None
    sub: StructMap | None  # for struct (array) fields


@dataclass(frozen=True)
class StructMap:
    ours: StructSpec
    kio_cls: type
    fields: tuple[FieldMap, ...]


def _unwrap(tp: Any) -> tuple[bool, bool, Any]:
    """(optional, is_array, element type) of a kio field annotation."""
    optional = False
    if typing.get_origin(tp) in (types.UnionType, typing.Union):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        (tp,) = args
    if typing.get_origin(tp) is tuple:
        return optional, True, typing.get_args(tp)[0]
    return optional, False, tp


def build_map(ours: StructSpec, kio_cls: type, version: int, flexible: bool) -> StructMap:
    present = [f for f in ours.fields if version in f.versions]
    theirs = dataclasses.fields(kio_cls)
    where = "%s v%d" % (ours.name, version)
    assert len(present) == len(theirs), "%s: ours %s, kio %s" % (
        where,
        [f.attr for f in present],
        [k.name for k in theirs],
    )
    maps = []
    for f, k in zip(present, theirs):
        at = "%s.%s" % (where, f.attr)
        # kio drops `_ms` suffixes and suffixes `_` to builtin names (DefaultPrincipalData's `type_`)
        assert k.name in (f.attr, f.attr + "_") or f.attr == k.name + "_ms", "%s: kio calls it %s" % (at, k.name)
        tagged = flexible and version in f.tagged
        assert k.metadata.get("tag") == (f.tag if tagged else None), at + ": tags differ"
        optional, is_array, elem = _unwrap(k.type)
        assert is_array == f.is_array, at + ": array-ness differs"
        kafka_type = k.metadata.get("kafka_type")
        sub = None
        if f.struct is not None:
            assert kafka_type is None and dataclasses.is_dataclass(elem), at
            sub = build_map(f.struct, typing.cast(type, elem), version, flexible)
        else:
            assert kafka_type in COMPATIBLE.get(f.elem_type, {f.elem_type}), "%s: %s vs kio %s" % (
                at,
                f.elem_type,
                kafka_type,
            )
        # nullability agrees, except kio's conventions: a zero uuid and a -1 timestamp read as None
        if kafka_type not in ("uuid", "datetime_i64"):
            assert optional == (version in f.nullable), at + ": nullability differs"
        maps.append(FieldMap(f, k.name, kafka_type, optional, sub))
    return StructMap(ours, kio_cls, tuple(maps))


def _load(path: str) -> type:
    module, _, name = path.partition(":")
    return typing.cast(type, getattr(importlib.import_module(module), name))


def kio_class(codec: MessageCodec, version: int) -> type | None:
    spec = codec.spec
    if spec.name in ("RequestHeader", "ResponseHeader"):
        module = "kio.schema.%s.v%d.header" % (
            "request_header" if spec.name == "RequestHeader" else "response_header",
            version,
        )
        return typing.cast(type, getattr(importlib.import_module(module), spec.name))
    if spec.type == "data":
        module = "kio.schema.%s.v%d" % (snake_case(spec.name), version)
        return typing.cast(type, getattr(importlib.import_module(module), spec.name))
    assert spec.api_key is not None
    versions = schema_name_map[api_key_map[spec.api_key]]
    if version not in versions:
        return None
    return _load(versions[version][EntityType.request if spec.type == "request" else EntityType.response])


@cache
def struct_map(name: str, version: int) -> StructMap:
    codec = CODECS[name]
    cls = kio_class(codec, version)
    assert cls is not None
    return build_map(codec.spec.root, cls, version, codec.spec.is_flexible(version))


# ----- value conversion ------------------------------------------------------------------------


def _to_kio_scalar(fm: FieldMap, v: Any) -> Any:
    if fm.sub is not None:
        return to_kio(fm.sub, v)
    t = fm.kafka_type
    if t == "error_code":
        return KioErrorCode(v)
    if t in ("timedelta_i32", "timedelta_i64"):
        return datetime.timedelta(milliseconds=v)
    if t == "datetime_i64":
        return None if v == -1 and fm.optional else _EPOCH + v * _MS
    if t == "uuid":
        return None if v == ZERO_UUID else v
    if t in ("records", "bytes") and v is not None:
        return bytes(v)
    return v


def to_kio(m: StructMap, obj: Any) -> Any:
    kwargs: dict[str, Any] = {}
    for fm in m.fields:
        v = getattr(obj, fm.ours.attr)
        if v is None:
            kwargs[fm.kio_name] = None
        elif fm.ours.is_array:
            kwargs[fm.kio_name] = tuple(_to_kio_scalar(fm, x) for x in v)
        else:
            kwargs[fm.kio_name] = _to_kio_scalar(fm, v)
    return m.kio_cls(**kwargs)


def _from_kio_scalar(fm: FieldMap, v: Any) -> Any:
    if fm.sub is not None:
        return from_kio(fm.sub, v)
    t = fm.kafka_type
    if t == "error_code":
        return int(v)
    if t in ("timedelta_i32", "timedelta_i64"):
        return v // _MS
    if t == "datetime_i64":
        return -1 if v is None else (v - _EPOCH) // _MS
    if t == "uuid":
        return ZERO_UUID if v is None else v
    return v


def from_kio(m: StructMap, kobj: Any) -> Any:
    kwargs: dict[str, Any] = {}
    for fm in m.fields:
        v = getattr(kobj, fm.kio_name)
        if v is None and fm.kafka_type not in ("uuid", "datetime_i64"):
            kwargs[fm.ours.attr] = None
        elif fm.ours.is_array:
            kwargs[fm.ours.attr] = [_from_kio_scalar(fm, x) for x in v]
        else:
            kwargs[fm.ours.attr] = _from_kio_scalar(fm, v)
    codec_classes = CODECS_BY_STRUCT[id(m.ours)]
    return codec_classes[m.ours.name](**kwargs)


CODECS_BY_STRUCT: dict[int, dict[str, type]] = {
    id(s): c.classes for c in CODECS.values() for s in [c.spec.root, *c.spec.structs.values()]
}


def _fit_scalar(fm: FieldMap, v: Any) -> Any:
    t = fm.kafka_type
    if fm.sub is not None:
        fit_for_kio(fm.sub, v)
        return v
    if t == "error_code" and v not in _KIO_CODES:
        return _KIO_CODES[v % len(_KIO_CODES)]
    if t == "datetime_i64" and not (0 <= v < 2**42 or (v == -1 and fm.optional)):
        return -1 if fm.optional and v < 0 else abs(v) % 2**42
    if t == "timedelta_i64" and abs(v) > 2**43:
        return v % 2**43
    return v


def fit_for_kio(m: StructMap, obj: Any) -> Any:
    """Move values that kio cannot represent (see its limits above) into its range, in place."""
    for fm in m.fields:
        v = getattr(obj, fm.ours.attr)
        if v is None:
            continue
        if fm.ours.is_array:
            setattr(obj, fm.ours.attr, [_fit_scalar(fm, x) for x in v])
        else:
            setattr(obj, fm.ours.attr, _fit_scalar(fm, v))
    return obj


# ----- the tests -------------------------------------------------------------------------------


def _pairs() -> list[tuple[str, int]]:
    out = []
    for registry in (REQUESTS, RESPONSES):
        for key in sorted(registry):
            codec = registry[key]
            out += [
                (codec.spec.name, v) for v in codec.spec.valid_versions if kio_class(codec, v) is not None
            ]
    out += [("RequestHeader", 1), ("RequestHeader", 2), ("ResponseHeader", 0), ("ResponseHeader", 1)]
    out += [("DefaultPrincipalData", 0)]
    return out


PAIRS = _pairs()
PAIR_IDS = ["%s-v%d" % p for p in PAIRS]


def kio_encode(kobj: Any) -> bytes:
    buf = io.BytesIO()
    entity_writer(type(kobj))(buf, kobj)
    return buf.getvalue()


def kio_decode(cls: type, data: bytes) -> Any:
    kobj: Any
    kobj, size = entity_reader(typing.cast(Any, cls))(data, 0)
    assert size == len(data), "kio read %d of %d bytes" % (size, len(data))
    return kobj


def check_both_ways(name: str, version: int, obj: Any) -> None:
    m = struct_map(name, version)
    obj = fit_for_kio(m, obj)
    ours = encode(obj, version)
    # ours -> kio
    kobj = kio_decode(m.kio_cls, ours)
    assert from_kio(m, kobj) == obj, "kio decoded our bytes differently"
    expected = to_kio(m, obj)
    assert kobj == expected
    # kio -> ours
    theirs = kio_encode(expected)
    assert decode(name, version, theirs) == obj, "we decoded kio's bytes differently"
    assert theirs == ours, "encodings differ:\n ours %s\n kio  %s" % (ours.hex(), theirs.hex())


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
def test_field_mapping(name: str, version: int) -> None:
    """The two field lists line up (checked inside build_map), at every nesting level."""
    m = struct_map(name, version)
    assert m.kio_cls.__name__ == name


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
def test_seeded(name: str, version: int) -> None:
    for seed in range(3):
        check_both_ways(name, version, example_value(name, version, seed))
    check_both_ways(name, version, CODECS[name].root_class())


@pytest.mark.parametrize(("name", "version"), PAIRS, ids=PAIR_IDS)
@HYPOTHESIS
@given(data=st.data())
def test_hypothesis(name: str, version: int, data: st.DataObject) -> None:
    check_both_ways(name, version, data.draw(message_values(name, version)))


def test_version_ranges_against_kio() -> None:
    """Our ranges equal kio's except where kio has versions Kafka 4.2 does not call stable."""
    differences = {}
    for key, codec in REQUESTS.items():
        kio_versions = sorted(schema_name_map[api_key_map[key]])
        ours = list(codec.spec.valid_versions)
        if ours != kio_versions:
            differences[codec.spec.name] = (ours[0], ours[-1], kio_versions[0], kio_versions[-1])
    assert differences == {
        "InitProducerIdRequest": (0, 5, 0, 6),  # v6 is unstable in Kafka 4.2
        "DescribeLogDirsRequest": (1, 4, 1, 5),  # v5 (IsCordoned) is newer than Kafka 4.2
        "BrokerHeartbeatRequest": (0, 1, 0, 2),  # v2 (CordonedLogDirs) is newer than Kafka 4.2
    }
    assert all(api_key_map[key] for key in REQUESTS)


def test_kio_limits_are_real() -> None:
    """The documented kio limits hold, so fit_for_kio is not hiding a bug of ours."""
    from protocol.messages import DescribeTransactionsResponse as R  # type: ignore[attr-defined]

    state = R.TransactionState(transactional_id="t", transaction_state="Empty", transaction_start_time_ms=-1)
    data = encode(R(transaction_states=[state]), 0)
    assert decode("DescribeTransactionsResponse", 0, data).transaction_states[0] == state
    cls = kio_class(CODECS["DescribeTransactionsResponse"], 0) or type
    with pytest.raises(Exception, match="negative"):
        kio_decode(cls, data)
    # far-future timestamps lose a millisecond in kio's float conversion; ours are exact
    state.transaction_start_time_ms = 35092336375807
    data = encode(R(transaction_states=[state]), 0)
    assert decode("DescribeTransactionsResponse", 0, data).transaction_states[0] == state
    kio_time = kio_decode(cls, data).transaction_states[0].transaction_start_time
    assert (kio_time - _EPOCH) // _MS == 35092336375806
