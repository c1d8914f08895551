"""Optional C acceleration of message decoding.

protocol/_speedups.c is a generic, schema-driven decoder. For one (message, version) this
module compiles every struct into a `Program`: the generated class to build, its slot names, and
one op per class field in class order (wire fields in wire order; fields absent from the version
carry their default: a constant, a fresh list, or a fresh instance built by a program of defaults
that reads nothing), plus the tagged fields by tag. The C code
walks it and builds exactly the objects the generated Python decoder builds, raising
ProtocolError wherever that decoder fails.

The extension is optional: when it is not built (no compiler at install time) or when
KAFKA_PY_NO_SPEEDUPS=1 is set, MessageCodec.decoder() uses the generated Python decoders.
`ENABLED` may be switched at run time (tests compare both paths).
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

_speedups: Any = None
UNAVAILABLE_REASON = ""
try:
    _speedups = importlib.import_module("protocol._speedups")
    _speedups.configure(ProtocolError, P.ZERO_UUID, uuid.UUID, uuid.SafeUUID.unknown)
except ImportError as exc:  # not built: pure Python
    _speedups = None
    UNAVAILABLE_REASON = "protocol._speedups is not built (%s)" % exc

AVAILABLE = _speedups is not None
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
