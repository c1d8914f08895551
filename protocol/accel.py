"""Optional C acceleration of message decoding and encoding.

protocol/_speedups.c is a generic, schema-driven decoder. For one (message, version) this
module compiles every struct into a `Program`: the generated class to build, its slot names, and
one op per class field in class order (wire fields in wire order; fields absent from the version
carry their default: a constant, a fresh list, or a fresh instance built by a program of defaults
that reads nothing), plus the tagged fields by tag. The C code
walks it and builds exactly the objects the generated Python decoder builds, raising
ProtocolError wherever that decoder fails.

Encoding goes the same way: `build_encoder` compiles every struct into an `Encoder` holding the
fields the version carries in wire order (tagged ones by tag, with the test that leaves a tagged
field at its default out), and `Encoder.encode(obj, head=None)` writes the message into one
buffer: the parts the generated Python encoder writes, joined (records values too large to copy
are passed through as parts of their own). Building one costs microseconds where compiling the
generated encoder costs milliseconds, which the first response of each kind would wait for.

The extension is optional: when it is not built (no compiler at install time) or when
KAFKA_PY_NO_SPEEDUPS=1 is set, MessageCodec.decoder() and encoder() use the generated Python
code. `ENABLED` may be switched at run time (tests compare both paths).
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from protocol import primitives as P
from protocol.errors import ProtocolError
from protocol.schema import FieldSpec, StructSpec

if TYPE_CHECKING:
    from protocol.codegen import MessageCodec

Decoder = Callable[[Any, Any, int], tuple[Any, int]]
Encoder = Callable[..., list[Any]]  # (obj, head=None) -> parts

_speedups: Any = None
UNAVAILABLE_REASON = ""
try:
    _speedups = importlib.import_module("protocol._speedups")
    _speedups.configure(ProtocolError, P.ZERO_UUID, uuid.UUID, uuid.SafeUUID.unknown)
except ImportError as exc:  # not built: pure Python
    _speedups = None
    UNAVAILABLE_REASON = "protocol._speedups is not built (%s)" % exc

AVAILABLE = _speedups is not None
# records values up to this size are copied into the encoder's buffer, larger ones passed through
COPY_RECORDS_MAX: int = _speedups.COPY_RECORDS_MAX if AVAILABLE else 0
ENABLED = AVAILABLE and os.environ.get("KAFKA_PY_NO_SPEEDUPS", "") in ("", "0")
if AVAILABLE and not ENABLED:
    UNAVAILABLE_REASON = "disabled by KAFKA_PY_NO_SPEEDUPS"


def build_decoder(codec: MessageCodec, version: int) -> Decoder:
    """The C decoder of `codec`'s definition at `version`: `(data, mv, pos) -> (obj, pos)`."""
    if _speedups is None:
        raise RuntimeError(UNAVAILABLE_REASON)
    return _ProgramCompiler(codec, version).program(codec.spec.root).decode  # type: ignore[no-any-return]


class _ProgramCompiler:
    def __init__(self, codec: MessageCodec, version: int) -> None:
        self.codec = codec
        self.version = version
        self.flex = codec.spec.is_flexible(version)
        self.kinds: dict[str, int] = _speedups.KINDS
        self.programs: dict[str, Any] = {}
        self.building: set[str] = set()

    def program(self, s: StructSpec) -> Any:
        prog = self.programs.get(s.name)
        if prog is not None:
            return prog
        if s.name in self.building:
            raise ValueError("struct %s contains itself" % s.name)
        self.building.add(s.name)
        version = self.version
        ops: list[tuple[Any, ...]] = []
        tagged: list[tuple[int, tuple[Any, ...]]] = []
        for index, f in enumerate(s.fields):
            if version not in f.versions:
                ops.append(self._default_op(index, f))
            elif self.flex and version in f.tagged:
                ops.append(self._default_op(index, f))  # until the tag shows up
                tagged.append((f.tag or 0, self._wire_op(index, f, s.name)))
            else:
                ops.append(self._wire_op(index, f, s.name))
        slots = tuple(f.attr for f in s.fields)
        prog = _speedups.Program(self.codec.classes[s.name], s.name, slots, tuple(ops), tuple(tagged), self.flex)
        self.building.discard(s.name)
        self.programs[s.name] = prog
        return prog

    def _wire_op(self, index: int, f: FieldSpec, owner: str) -> tuple[Any, ...]:
        version = self.version
        label = "%s.%s" % (owner, f.name)  # how errors name the field
        compact = self.flex if f.flexible is None else version in f.flexible
        flags = (_speedups.NULLABLE if version in f.nullable else 0) | (_speedups.COMPACT if compact else 0)
        if f.is_array:
            elem: Any = self.program(f.struct) if f.struct is not None else self.kinds[f.elem_type]
            return (index, self.kinds["array"], flags, elem, label)
        if f.struct is not None:
            return (index, self.kinds["struct"], flags, self.program(f.struct), label)
        return (index, self.kinds[f.type], flags, None, label)

    def _default_op(self, index: int, f: FieldSpec) -> tuple[Any, ...]:
        """The value the generated decoder gives a field the wire does not carry."""
        k = self.kinds
        if f.is_array:
            if f.default is None:
                return (index, k["const"], 0, None, f.name)
            return (index, k["newlist"], 0, None, f.name)
        if f.struct is not None:
            if f.default is None:
                return (index, k["const"], 0, None, f.name)
            return (index, k["struct"], 0, self.default_program(f.struct), f.name)
        return (index, k["const"], 0, f.default, f.name)

    def default_program(self, s: StructSpec) -> Any:
        """A program that reads nothing and builds `K()`: every field at its default."""
        key = "%s()" % s.name
        prog = self.programs.get(key)
        if prog is None:
            ops = tuple(self._default_op(index, f) for index, f in enumerate(s.fields))
            slots = tuple(f.attr for f in s.fields)
            prog = self.programs[key] = _speedups.Program(self.codec.classes[s.name], key, slots, ops, (), False)
        return prog


def build_encoder(codec: MessageCodec, version: int) -> Encoder:
    """The C encoder of `codec`'s definition at `version`: `(obj, head=None) -> parts`."""
    if _speedups is None:
        raise RuntimeError(UNAVAILABLE_REASON)
    return _EncoderCompiler(codec, version).encoder(codec.spec.root).encode  # type: ignore[no-any-return]


class _EncoderCompiler:
    def __init__(self, codec: MessageCodec, version: int) -> None:
        self.codec = codec
        self.version = version
        self.flex = codec.spec.is_flexible(version)
        self.kinds: dict[str, int] = _speedups.KINDS
        self.encoders: dict[str, Any] = {}
        self.building: set[str] = set()

    def encoder(self, s: StructSpec) -> Any:
        enc = self.encoders.get(s.name)
        if enc is not None:
            return enc
        if s.name in self.building:
            raise ValueError("struct %s contains itself" % s.name)
        self.building.add(s.name)
        version = self.version
        ops: list[tuple[Any, ...]] = []
        tagged: list[tuple[int, tuple[Any, ...]]] = []
        for index, f in enumerate(s.fields):
            if version not in f.versions:
                continue
            if self.flex and version in f.tagged:
                tagged.append((f.tag or 0, self._op(index, f, tagged=True)))
            else:
                ops.append(self._op(index, f, tagged=False))
        tagged.sort(key=lambda t: t[0])
        slots = tuple(f.attr for f in s.fields)
        enc = _speedups.Encoder(self.codec.classes[s.name], s.name, slots, tuple(ops), tuple(tagged), self.flex)
        self.building.discard(s.name)
        self.encoders[s.name] = enc
        return enc

    def _op(self, index: int, f: FieldSpec, tagged: bool) -> tuple[Any, ...]:
        compact = self.flex if f.flexible is None else self.version in f.flexible
        flags = (_speedups.NULLABLE if self.version in f.nullable else 0) | (_speedups.COMPACT if compact else 0)
        skip, default = (self._skip_rule(f) if tagged else (0, None))
        if f.is_array:
            elem: Any = self.encoder(f.struct) if f.struct is not None else self.kinds[f.elem_type]
            return (index, self.kinds["array"], flags, elem, skip, default)
        if f.struct is not None:
            return (index, self.kinds["struct"], flags, self.encoder(f.struct), skip, default)
        return (index, self.kinds[f.type], flags, None, skip, default)

    def _skip_rule(self, f: FieldSpec) -> tuple[int, Any]:
        """When a tagged field is left out, as the generated encoder decides."""
        if f.is_array:
            return (_speedups.SKIP_NONE, None) if f.default is None else (_speedups.SKIP_FALSY, None)
        if f.default is None:
            return _speedups.SKIP_NONE, None
        if f.struct is not None:
            return _speedups.SKIP_EQUAL, self.codec.classes[f.struct.name]()
        return _speedups.SKIP_EQUAL, f.default
