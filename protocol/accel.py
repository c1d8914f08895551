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
from typing import Any, Protocol

from protocol import primitives as P
from protocol.errors import ProtocolError
from protocol.schema import FieldSpec, MessageSpec, StructSpec


class MessageCodec(Protocol):
    """What the compilers read of a codec (protocol.codegen.MessageCodec, which calls them): its
    definition and the classes generated for its structs."""

    spec: MessageSpec

    @property
    def classes(self) -> dict[str, type]: ...


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
    return _ProgramCompiler(codec, version).build(codec.spec.root).decode  # type: ignore[no-any-return]


def build_encoder(codec: MessageCodec, version: int) -> Encoder:
    """The C encoder of `codec`'s definition at `version`: `(obj, head=None) -> parts`."""
    if _speedups is None:
        raise RuntimeError(UNAVAILABLE_REASON)
    return _EncoderCompiler(codec, version).build(codec.spec.root).encode  # type: ignore[no-any-return]


class _Compiler:
    """Compiles the structs of one (message, version) into C objects of type TYPE (a Program or an
    Encoder per struct, from the ops `_ops` gives), each once: a struct holding itself is refused."""

    TYPE = ""

    def __init__(self, codec: MessageCodec, version: int) -> None:
        self.codec = codec
        self.version = version
        self.flex = codec.spec.is_flexible(version)
        self.kinds: dict[str, int] = _speedups.KINDS
        self.built: dict[str, Any] = {}
        self.building: set[str] = set()

    def build(self, s: StructSpec) -> Any:
        obj = self.built.get(s.name)
        if obj is not None:
            return obj
        if s.name in self.building:
            raise ValueError("struct %s contains itself" % s.name)
        self.building.add(s.name)
        ops, tagged = self._ops(s)
        slots = tuple(f.attr for f in s.fields)
        obj = getattr(_speedups, self.TYPE)(self.codec.classes[s.name], s.name, slots, ops, tagged, self.flex)
        self.building.discard(s.name)
        self.built[s.name] = obj
        return obj

    def _ops(self, s: StructSpec) -> tuple[tuple[Any, ...], tuple[tuple[int, Any], ...]]:
        """The struct's ops and its tagged ops as (tag, op) pairs."""
        raise NotImplementedError

    def _wire(self, f: FieldSpec) -> tuple[int, int, Any]:
        """(kind, flags, arg) of a field the version carries: arg is the compiled struct of a
        struct (or of an array's structs), the element kind of other arrays."""
        version = self.version
        compact = self.flex if f.flexible is None else version in f.flexible
        flags = (_speedups.NULLABLE if version in f.nullable else 0) | (_speedups.COMPACT if compact else 0)
        if f.is_array:
            elem: Any = self.build(f.struct) if f.struct is not None else self.kinds[f.elem_type]
            return self.kinds["array"], flags, elem
        if f.struct is not None:
            return self.kinds["struct"], flags, self.build(f.struct)
        return self.kinds[f.type], flags, None


class _ProgramCompiler(_Compiler):
    TYPE = "Program"

    def _ops(self, s: StructSpec) -> tuple[tuple[Any, ...], tuple[tuple[int, Any], ...]]:
        """Every field in class order: one the version does not carry at its default, as is a
        tagged one until its tag shows up."""
        ops: list[tuple[Any, ...]] = []
        tagged: list[tuple[int, tuple[Any, ...]]] = []
        for index, f in enumerate(s.fields):
            if self.version not in f.versions:
                ops.append(self._default_op(index, f))
            elif self.flex and self.version in f.tagged:
                ops.append(self._default_op(index, f))  # until the tag shows up
                tagged.append((f.tag or 0, self._wire_op(index, f, s.name)))
            else:
                ops.append(self._wire_op(index, f, s.name))
        return tuple(ops), tuple(tagged)

    def _wire_op(self, index: int, f: FieldSpec, owner: str) -> tuple[Any, ...]:
        return (index, *self._wire(f), "%s.%s" % (owner, f.name))  # how errors name the field

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
        prog = self.built.get(key)
        if prog is None:
            ops = tuple(self._default_op(index, f) for index, f in enumerate(s.fields))
            slots = tuple(f.attr for f in s.fields)
            prog = self.built[key] = _speedups.Program(self.codec.classes[s.name], key, slots, ops, (), False)
        return prog


class _EncoderCompiler(_Compiler):
    TYPE = "Encoder"

    def _ops(self, s: StructSpec) -> tuple[tuple[Any, ...], tuple[tuple[int, Any], ...]]:
        """The fields the version carries, tagged ones by tag with the rule that leaves them out."""
        ops: list[tuple[Any, ...]] = []
        tagged: list[tuple[int, tuple[Any, ...]]] = []
        for index, f in enumerate(s.fields):
            if self.version not in f.versions:
                continue
            if self.flex and self.version in f.tagged:
                tagged.append((f.tag or 0, (index, *self._wire(f), *self._skip_rule(f))))
            else:
                ops.append((index, *self._wire(f), 0, None))
        return tuple(ops), tuple(sorted(tagged, key=lambda t: t[0]))

    def _skip_rule(self, f: FieldSpec) -> tuple[int, Any]:
        """When a tagged field is left out, as the generated encoder decides."""
        if f.is_array:
            return (_speedups.SKIP_NONE, None) if f.default is None else (_speedups.SKIP_FALSY, None)
        if f.default is None:
            return _speedups.SKIP_NONE, None
        if f.struct is not None:
            return _speedups.SKIP_EQUAL, self.codec.classes[f.struct.name]()
        return _speedups.SKIP_EQUAL, f.default
