"""Valid message objects for any (definition, version), for property tests and fuzzing.

    message_values(codec, version) -> hypothesis strategy of message objects
    example_value(codec, version, seed) -> one deterministic message object

`codec` is a `MessageCodec` or a definition name (`"ProduceRequest"`). Every field present in
`version` gets a value of its wire type (ints over their whole range, strings with non-ASCII
characters, None where the field is nullable in that version, arrays of 0..3 elements); fields
absent from `version` keep their class defaults, so an encode/decode round trip is exact.
Both entry points share one walk over the schema; only the source of choices differs.
"""

from __future__ import annotations

import random
import uuid
from typing import Any, Protocol

from hypothesis import strategies as st

from protocol.codegen import MessageCodec
from protocol.messages import CODECS
from protocol.schema import FieldSpec, StructSpec

INT_RANGES: dict[str, tuple[int, int]] = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "uint16": (0, 2**16 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "uint32": (0, 2**32 - 1),
    "int64": (-(2**63), 2**63 - 1),
}
MAX_ARRAY = 3
# non-ASCII on purpose: 2-, 3- and 4-byte UTF-8 sequences and a NUL
_CHARS = "aZ0-._ éßж漢🙂\x00"


class Source(Protocol):
    """Where the walk gets its choices from."""

    def integer(self, lo: int, hi: int) -> int: ...
    def boolean(self) -> bool: ...
    def real(self) -> float: ...
    def text(self) -> str: ...
    def binary(self) -> bytes: ...
    def uuid(self) -> uuid.UUID: ...
    def count(self) -> int: ...
    def null(self) -> bool: ...


class DrawSource:
    """Choices drawn from hypothesis (so failures shrink)."""

    def __init__(self, draw: Any) -> None:
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return int(self.draw(st.integers(lo, hi)))

    def boolean(self) -> bool:
        return bool(self.draw(st.booleans()))

    def real(self) -> float:
        return float(self.draw(st.floats(allow_nan=False)))

    def text(self) -> str:
        return str(self.draw(st.text(max_size=10)))

    def binary(self) -> bytes:
        return bytes(self.draw(st.binary(max_size=24)))

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self.draw(st.integers(0, 2**128 - 1)))

    def count(self) -> int:
        return int(self.draw(st.integers(0, MAX_ARRAY)))

    def null(self) -> bool:
        return bool(self.draw(st.booleans()))


class RandomSource:
    """Choices from a seeded `random.Random`: deterministic, biased towards edge values."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        if self.rng.random() < 0.3:
            return self.rng.choice([v for v in (lo, hi, 0, -1, 1) if lo <= v <= hi])
        return self.rng.randint(lo, hi)

    def boolean(self) -> bool:
        return self.rng.random() < 0.5

    def real(self) -> float:
        return self.rng.choice([0.0, -1.5, 1e300, float("inf"), self.rng.uniform(-1e9, 1e9)])

    def text(self) -> str:
        return "".join(self.rng.choice(_CHARS) for _ in range(self.rng.randint(0, 10)))

    def binary(self) -> bytes:
        return self.rng.randbytes(self.rng.randint(0, 24))

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(int=self.rng.getrandbits(128)) if self.rng.random() < 0.9 else uuid.UUID(int=0)

    def count(self) -> int:
        return self.rng.randint(0, MAX_ARRAY)

    def null(self) -> bool:
        return self.rng.random() < 0.25


def _codec(codec: MessageCodec | str) -> MessageCodec:
    return CODECS[codec] if isinstance(codec, str) else codec


def _scalar(codec: MessageCodec, f: FieldSpec, version: int, src: Source) -> Any:
    if f.struct is not None:
        return build_struct(codec, f.struct, version, src)
    t = f.elem_type
    if t in INT_RANGES:
        return src.integer(*INT_RANGES[t])
    if t == "bool":
        return src.boolean()
    if t == "float64":
        return src.real()
    if t == "string":
        return src.text()
    if t in ("bytes", "records"):
        return src.binary()
    if t == "uuid":
        return src.uuid()
    raise AssertionError("no value for type %s of %s" % (t, f.name))


def field_value(codec: MessageCodec, f: FieldSpec, version: int, src: Source) -> Any:
    """A value of field `f` as it exists in `version` (None only where nullable there)."""
    if version in f.nullable and src.null():
        return None
    if f.is_array:
        return [_scalar(codec, f, version, src) for _ in range(src.count())]
    return _scalar(codec, f, version, src)


def build_struct(codec: MessageCodec, struct: StructSpec, version: int, src: Source) -> Any:
    kwargs = {f.attr: field_value(codec, f, version, src) for f in struct.fields if version in f.versions}
    return codec.classes[struct.name](**kwargs)


def message_values(codec: MessageCodec | str, version: int) -> st.SearchStrategy[Any]:
    """Hypothesis strategy of valid objects of `codec`'s definition for `version`."""
    c = _codec(codec)

    @st.composite
    def values(draw: Any) -> Any:
        return build_struct(c, c.spec.root, version, DrawSource(draw))

    return values()


def example_value(codec: MessageCodec | str, version: int, seed: int = 0) -> Any:
    """One valid object, the same for the same (definition, version, seed)."""
    c = _codec(codec)
    rng = random.Random("%s/%d/%d" % (c.spec.name, version, seed))
    return build_struct(c, c.spec.root, version, RandomSource(rng))
