"""Code generation: message classes and per-version encoders/decoders built from MessageSpecs.

For every struct we generate one slotted class (all fields of all versions) and, per version,
one decoder `d_<Struct>(data, mv, pos) -> (obj, pos)` and one encoder `e_<Struct>(obj, w)` where
`w` appends a bytes-like part. Runs of fixed-size fields are packed/unpacked with one
precompiled `struct.Struct`. Source is compiled with `compile()`/`exec` into a namespace holding
the helpers below; nothing is written per version by hand.

`MessageCodec.decoder()` and `encoder()` prefer the C codecs of protocol/accel.py
(protocol/_speedups.c walking a description of the same structs) when it is built and not
disabled by KAFKA_PY_NO_SPEEDUPS=1; the generated Python code (`py_decoder()`, `py_encoder()`)
is the fallback and the reference they must equal.
"""

from __future__ import annotations

import struct
import threading
import uuid
from collections.abc import Callable
from typing import Any

from protocol import accel as _accel
from protocol import primitives as P
from protocol.errors import ProtocolError
from protocol.schema import FieldSpec, MessageSpec, StructSpec

_FIXED = {
    "bool": ("?", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "uuid": ("16s", 16),
}

_MISSING = object()
_SIZE = struct.Struct(">i")
# One definition's classes are built once, whichever thread asks first (an embedded broker's
# thread and its test's may both use the codecs): never two classes for one message.
_BUILD_LOCK = threading.Lock()
# unpackers of int32/int64 arrays by length, shared by every codec's generated code
_ARRAY32 = tuple(struct.Struct(">%di" % n) for n in range(64))
_ARRAY64 = tuple(struct.Struct(">%dq" % n) for n in range(64))


_ZERO16 = bytes(16)
_UUID_SLOTS = getattr(uuid.UUID, "__slots__", ())
_UNKNOWN_SAFETY = uuid.SafeUUID.unknown


def _uuid_from_bytes(raw: bytes) -> uuid.UUID:
    """uuid.UUID(bytes=raw) without the cost of its checks (raw is always 16 bytes here)."""
    if raw == _ZERO16:
        return P.ZERO_UUID
    u = object.__new__(uuid.UUID)
    object.__setattr__(u, "int", int.from_bytes(raw, "big"))
    object.__setattr__(u, "is_safe", _UNKNOWN_SAFETY)
    return u


if "int" not in _UUID_SLOTS or "is_safe" not in _UUID_SLOTS:  # another uuid implementation: be plain

    def _uuid_from_bytes(raw: bytes) -> uuid.UUID:
        return P.ZERO_UUID if raw == _ZERO16 else uuid.UUID(bytes=raw)


class _Namespace(dict):  # type: ignore[type-arg]
    """Globals of generated code: helpers plus interned constants and Struct objects."""

    def __init__(self) -> None:
        super().__init__(
            _M=_MISSING,
            _E=ProtocolError,
            _uv=P.read_uvarint,
            _uvb=P.encode_uvarint,
            _i32a=P.int32_array,
            _i64a=P.int64_array,
            _uuid=_uuid_from_bytes,
            _UUID0=P.ZERO_UUID,
            _new=object.__new__,
            _A32=_ARRAY32,
            _A64=_ARRAY64,
            _R16=struct.Struct("16s").unpack_from,
            _I16=P.INT16.unpack_from,
            _I32=P.INT32.unpack_from,
            _I8=P.INT8.unpack_from,
            _PI16=P.INT16.pack,
            _PI32=P.INT32.pack,
            _PI8=P.INT8.pack,
            _arr=self._array_struct,
        )
        self._consts: dict[Any, str] = {}

    @staticmethod
    def _array_struct(code: str, n: int) -> struct.Struct:
        return struct.Struct(">%d%s" % (n, code))

    def const(self, value: Any, hint: str = "c") -> str:
        key = (type(value), value) if not isinstance(value, struct.Struct) else ("S", value.format)
        name = self._consts.get(key)
        if name is None:
            name = "_%s%d" % (hint, len(self._consts))
            self._consts[key] = name
            self[name] = value
        return name


def _fixed(f: FieldSpec) -> tuple[str, int] | None:
    if f.is_array:
        return None
    return _FIXED.get(f.type)


class _Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []
        self.indent = 1

    def __call__(self, line: str) -> None:
        self.lines.append("    " * self.indent + line)

    def block(self) -> _Block:
        return _Block(self)


class _Block:
    def __init__(self, em: _Emitter) -> None:
        self.em = em

    def __enter__(self) -> None:
        self.em.indent += 1

    def __exit__(self, *exc: object) -> None:
        self.em.indent -= 1


def _default_expr(ns: _Namespace, f: FieldSpec, classes: dict[str, type]) -> str:
    """An expression that builds the field's default value (fresh for mutable ones)."""
    if f.is_array:
        return "None" if f.default is None else "[]"
    if f.struct is not None:
        return "None" if f.default is None else "%s()" % ns.const(classes[f.struct.name], "K")
    if f.default is None:
        return "None"
    return ns.const(f.default, "d")


def _children_first(roots: list[StructSpec], version: int | None = None) -> list[StructSpec]:
    """The structs reachable from `roots` (through fields present in `version`, when given),
    each after the structs of its fields, each once."""
    order: list[StructSpec] = []
    seen: set[str] = set()

    def visit(s: StructSpec) -> None:
        if s.name in seen:
            return
        seen.add(s.name)
        for f in s.fields:
            if f.struct is not None and (version is None or version in f.versions):
                visit(f.struct)
        order.append(s)

    for s in roots:
        visit(s)
    return order


class MessageCodec:
    """Classes and per-version codecs of one message definition, each made when first asked for
    (then a plain attribute or a cache hit): a codec whose definition is only read (versions,
    field list) compiles nothing."""

    def __init__(self, spec: MessageSpec) -> None:
        self.spec = spec
        self.ns = _Namespace()
        self._classes: dict[str, type] | None = None
        self._decoders: dict[int, Callable[..., Any]] = {}
        self._fast_decoders: dict[int, Callable[..., Any]] = {}
        self._encoders: dict[int, Callable[..., Any]] = {}
        self._fast_encoders: dict[int, Callable[..., list[Any]]] = {}

    # ----- classes -------------------------------------------------------------------------
    @property
    def classes(self) -> dict[str, type]:
        """The definition's classes by struct name, the root's among them."""
        classes = self._classes
        if classes is None:
            with _BUILD_LOCK:
                if self._classes is None:
                    self._classes = self._build_classes()
                classes = self._classes
        return classes

    @property
    def root_class(self) -> type:
        return self.classes[self.spec.root.name]

    def _build_classes(self) -> dict[str, type]:
        classes: dict[str, type] = {}
        # children first so default constructors can refer to them
        for s in _children_first([*self.spec.structs.values(), self.spec.root]):
            classes[s.name] = self._make_class(s, classes)
        root = classes[self.spec.root.name]
        for name, cls in classes.items():
            if cls is not root:
                setattr(root, name, cls)
                cls.__qualname__ = "%s.%s" % (root.__name__, name)
        return classes

    def _make_class(self, s: StructSpec, classes: dict[str, type]) -> type:
        ns = self.ns
        attrs = [f.attr for f in s.fields]
        params = []
        body = []
        for f in s.fields:
            mutable = (f.is_array and f.default is not None) or (f.struct is not None and f.default is not None)
            if mutable:
                params.append("%s=_M" % f.attr)
                body.append(
                    "    self.%s = %s if %s is _M else %s" % (f.attr, _default_expr(ns, f, classes), f.attr, f.attr)
                )
            else:
                params.append("%s=%s" % (f.attr, _default_expr(ns, f, classes)))
                body.append("    self.%s = %s" % (f.attr, f.attr))
        src = ["def __init__(self, %s):" % ", ".join(params) if params else "def __init__(self):"]
        src += body or ["    pass"]
        src.append("def __eq__(self, other):")
        src.append("    if type(other) is not type(self): return NotImplemented")
        cmp = " and ".join("self.%s == other.%s" % (a, a) for a in attrs) or "True"
        src.append("    return %s" % cmp)
        local: dict[str, Any] = {}
        exec(compile("\n".join(src), "<%s.%s>" % (self.spec.name, s.name), "exec"), ns, local)
        cls = type(
            s.name,
            (_MessageBase,),
            {
                "__slots__": tuple(attrs),
                "__init__": local["__init__"],
                "__eq__": local["__eq__"],
                "__hash__": None,
                "__module__": "protocol.messages",
                "FIELDS": tuple(attrs),
            },
        )
        return cls

    # ----- codecs --------------------------------------------------------------------------
    def decoder(self, version: int) -> Callable[..., Any]:
        """`(data, mv, pos) -> (obj, pos)`: the C decoder when available, else the Python one."""
        if _accel.ENABLED:
            fn = self._fast_decoders.get(version)
            if fn is None:
                fn = self._fast_decoders[version] = _accel.build_decoder(self, version)
            return fn
        return self.py_decoder(version)

    def py_decoder(self, version: int) -> Callable[..., Any]:
        """The generated pure-Python decoder (the reference the C decoder must equal)."""
        fn = self._decoders.get(version)
        if fn is None:
            fn = self._decoders[version] = self._generate(version)[0]
        return fn

    def encoder(self, version: int) -> Callable[..., list[Any]]:
        """`(obj, head=None) -> parts`: the message's bytes as a list of parts (records values
        passed through); with a head (bytes), preceded by the int32 size of all that follows it
        and the head, a whole frame. The C encoder when available, else the Python one."""
        if _accel.ENABLED:
            fn = self._fast_encoders.get(version)
            if fn is None:
                fn = self._fast_encoders[version] = _accel.build_encoder(self, version)
            return fn
        py = self.py_encoder(version)

        def encode(obj: Any, head: bytes | None = None) -> list[Any]:
            parts: list[Any] = [] if head is None else [b"", head]
            py(obj, parts.append)
            if head is not None:
                parts[0] = _SIZE.pack(sum(len(p) for p in parts))
            return parts

        return encode

    def py_encoder(self, version: int) -> Callable[..., Any]:
        """The generated pure-Python encoder `(obj, w)`, `w` taking each part (the reference the
        C encoder must equal)."""
        fn = self._encoders.get(version)
        if fn is None:
            fn = self._encoders[version] = self._generate(version)[1]
        return fn

    def _generate(self, version: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
        spec = self.spec
        flex = spec.is_flexible(version)
        out: list[str] = []
        for s in _children_first([spec.root], version):
            out.extend(self._gen_decoder(s, version, flex))
            out.extend(self._gen_encoder(s, version, flex))
        src = "\n".join(out)
        local: dict[str, Any] = {}
        code = compile(src, "<codec %s v%d>" % (spec.name, version), "exec")
        exec(code, self.ns, local)
        self.ns.update(local)
        return local["d_%s_%d" % (spec.root.name, version)], local["e_%s_%d" % (spec.root.name, version)]

    # decoders -------------------------------------------------------------------------------
    # Each struct's fields are stored straight into a fresh instance (`_new(K)` then slot stores,
    # cheaper than calling the Python __init__), and arrays of structs decode their elements
    # inline in the loop, so only the root and single struct fields cost a call. Names of
    # locals carry the nesting depth so that inlined bodies never clobber their parents' state.
    def _gen_decoder(self, s: StructSpec, version: int, flex: bool) -> list[str]:
        em = _Emitter()
        self._decode_struct(em, s, version, flex, 0)
        em("return o0, pos")
        return ["def d_%s_%d(data, mv, pos):" % (s.name, version)] + em.lines

    def _decode_struct(self, em: _Emitter, s: StructSpec, version: int, flex: bool, d: int) -> None:
        ns = self.ns
        o = "o%d" % d
        em("%s = _new(%s)" % (o, ns.const(self.classes[s.name], "K")))
        defaults: list[FieldSpec] = []
        tagged: list[FieldSpec] = []
        run: list[FieldSpec] = []

        def flush_run() -> None:
            if not run:
                return
            fmt = ">" + "".join(_FIXED[f.type][0] for f in run)
            st = ns.const(struct.Struct(fmt), "S")
            names = ", ".join("%s.%s" % (o, f.attr) for f in run)
            em("%s, = %s.unpack_from(data, pos)" % (names, st))
            em("pos += %d" % sum(_FIXED[f.type][1] for f in run))
            for f in run:
                if f.type == "uuid":
                    em("%s.%s = _uuid(%s.%s)" % (o, f.attr, o, f.attr))
            run.clear()

        for f in s.fields:
            if version not in f.versions:
                defaults.append(f)
            elif flex and version in f.tagged:
                defaults.append(f)
                tagged.append(f)
            elif _fixed(f):
                run.append(f)
            else:
                flush_run()
                self._decode_field(em, f, "%s.%s" % (o, f.attr), version, flex, d)
        flush_run()
        for f in defaults:
            em("%s.%s = %s" % (o, f.attr, _default_expr(ns, f, self.classes)))
        if not flex:
            return
        tn, tend = "tn%d" % d, "tend%d" % d
        em("%s = data[pos]" % tn)
        em("pos += 1")
        em("if %s:" % tn)
        with em.block():
            em("if %s >= 128: %s, pos = _uv(data, pos - 1)" % (tn, tn))
            em("for _ in range(%s):" % tn)
            with em.block():
                em("tag, pos = _uv(data, pos)")
                em("size, pos = _uv(data, pos)")
                em("%s = pos + size" % tend)
                em("if %s > len(data): raise _E('tagged field overruns the buffer')" % tend)
                for i, f in enumerate(tagged):
                    em("%s tag == %d:" % ("elif" if i else "if", f.tag or 0))
                    with em.block():
                        self._decode_field(em, f, "%s.%s" % (o, f.attr), version, flex, d)
                        em("if pos != %s: raise _E('tagged field %s size mismatch')" % (tend, f.name))
                em("pos = %s" % tend)

    def _read_len(self, em: _Emitter, var: str, flex: bool, width: str) -> None:
        """Read a length prefix into `var`: -1 means null (both encodings normalised to -1)."""
        if flex:
            em("%s = data[pos]" % var)
            em("pos += 1")
            em("if %s >= 128: %s, pos = _uv(data, pos - 1)" % (var, var))
            em("%s -= 1" % var)
        elif width == "h":
            em("%s, = _I16(data, pos)" % var)
            em("pos += 2")
        else:
            em("%s, = _I32(data, pos)" % var)
            em("pos += 4")

    def _decode_field(self, em: _Emitter, f: FieldSpec, target: str, version: int, flex: bool, d: int) -> None:
        flex = flex if f.flexible is None else version in f.flexible
        nullable = version in f.nullable
        if f.is_array:
            n = "n%d" % d
            self._read_len(em, n, flex, "i")
            em("if %s < 0:" % n)
            with em.block():
                em("%s = None" % target if nullable else "raise _E('null array for non-nullable field %s')" % f.name)
            em("elif not %s:" % n)
            with em.block():
                em("%s = []" % target)
            em("else:")
            with em.block():
                self._decode_array(em, f, target, version, flex, d)
            return
        if f.struct is not None:
            call = "d_%s_%d(data, mv, pos)" % (f.struct.name, version)
            if nullable:
                em("m, = _I8(data, pos)")
                em("pos += 1")
                em("if m < 0: %s = None" % target)
                em("else: %s, pos = %s" % (target, call))
            else:
                em("%s, pos = %s" % (target, call))
            return
        fixed = _FIXED.get(f.type)
        if fixed:
            st = self.ns.const(struct.Struct(">" + fixed[0]), "S")
            em("%s, = %s.unpack_from(data, pos)" % (target, st))
            em("pos += %d" % fixed[1])
            if f.type == "uuid":
                em("%s = _uuid(%s)" % (target, target))
            return
        # string, bytes, records
        self._read_len(em, "n", flex, "h" if f.type == "string" else "i")
        em("if n < 0:")
        with em.block():
            em("%s = None" % target if nullable else "raise _E('null value for non-nullable field %s')" % f.name)
        em("else:")
        with em.block():
            em("end = pos + n")
            em("if end > len(data): raise _E('field %s overruns the buffer')" % f.name)
            if f.type == "string":
                em("%s = str(data[pos:end], 'utf-8')" % target)
            elif f.type == "bytes":
                em("%s = bytes(data[pos:end])" % target)
            else:
                em("%s = mv[pos:end]" % target)
            em("pos = end")

    def _decode_array(self, em: _Emitter, f: FieldSpec, target: str, version: int, flex: bool, d: int) -> None:
        """Elements of a non-empty array whose length is in `n<d>`."""
        n = "n%d" % d
        et = f.elem_type
        fixed = _FIXED.get(et)
        em("if %s > len(data) - pos: raise _E('array %s is longer than the buffer')" % (n, f.name))
        if fixed and et != "uuid":
            code, size = fixed
            if et in ("int32", "int64"):
                small, big = ("_A32", "_i32a") if et == "int32" else ("_A64", "_i64a")
                em("%s = list((%s[%s] if %s < 64 else %s(%s)).unpack_from(data, pos))" % (target, small, n, n, big, n))
            else:
                em("%s = list(_arr(%r, %s).unpack_from(data, pos))" % (target, code, n))
            em("pos += %d * %s" % (size, n))
            return
        a, ap = "a%d" % d, "ap%d" % d
        em("%s = %s = []" % (target, a))
        em("%s = %s.append" % (ap, a))
        em("for _ in range(%s):" % n)
        with em.block():
            if f.struct is not None:
                self._decode_struct(em, f.struct, version, flex, d + 1)
                em("%s(o%d)" % (ap, d + 1))
            elif et == "uuid":
                em("%s(_uuid(_R16(data, pos)[0]))" % ap)
                em("pos += 16")
            else:  # string / bytes / records; elements are nullable when the array is
                elem = FieldSpec(f.name, f.attr, et, f.versions, f.nullable, f.tagged, None, None, False, f.flexible)
                self._decode_field(em, elem, "o", version, flex, d + 1)
                em("%s(o)" % ap)

    # encoders -------------------------------------------------------------------------------
    def _gen_encoder(self, s: StructSpec, version: int, flex: bool) -> list[str]:
        ns = self.ns
        em = _Emitter()
        fields = [f for f in s.fields if version in f.versions]
        regular = [f for f in fields if not (flex and version in f.tagged)]
        tagged = sorted((f for f in fields if flex and version in f.tagged), key=lambda f: f.tag or 0)
        run: list[FieldSpec] = []

        def flush_run() -> None:
            if not run:
                return
            fmt = ">" + "".join(_FIXED[f.type][0] for f in run)
            st = ns.const(struct.Struct(fmt), "S")
            vals = ", ".join(("o.%s.bytes" if f.type == "uuid" else "o.%s") % f.attr for f in run)
            em("w(%s.pack(%s))" % (st, vals))
            run.clear()

        for f in regular:
            if _fixed(f):
                run.append(f)
                continue
            flush_run()
            self._encode_field(em, f, "o." + f.attr, version, flex, "w")
        flush_run()
        if flex:
            if not tagged:
                em("w(b'\\x00')")
            else:
                em("tg = []")
                for f in tagged:
                    em("x = o.%s" % f.attr)
                    em("if %s:" % self._non_default_test(f, "x"))
                    with em.block():
                        em("tb = []")
                        self._encode_field(em, f, "x", version, flex, "tb.append")
                        em("tg.append((%d, b''.join(tb)))" % (f.tag or 0))
                em("w(_uvb(len(tg)))")
                em("for t, b in tg:")
                with em.block():
                    em("w(_uvb(t))")
                    em("w(_uvb(len(b)))")
                    em("w(b)")
        header = ["def e_%s_%d(o, w):" % (s.name, version)]
        if not em.lines:
            em("pass")
        return header + em.lines

    def _non_default_test(self, f: FieldSpec, var: str) -> str:
        if f.is_array:
            return "%s is not None" % var if f.default is None else "%s" % var
        if f.default is None:
            return "%s is not None" % var
        if f.struct is not None:
            return "%s != %s()" % (var, self.ns.const(self.classes[f.struct.name], "K"))
        return "%s != %s" % (var, self.ns.const(f.default, "d"))

    def _write_len(self, em: _Emitter, expr: str, flex: bool, width: str, w: str) -> None:
        if flex:
            em("%s(_uvb(%s + 1))" % (w, expr))
        elif width == "h":
            em("%s(_PI16(%s))" % (w, expr))
        else:
            em("%s(_PI32(%s))" % (w, expr))

    def _write_null(self, em: _Emitter, flex: bool, width: str, w: str) -> None:
        if flex:
            em("%s(b'\\x00')" % w)
        elif width == "h":
            em("%s(b'\\xff\\xff')" % w)
        else:
            em("%s(b'\\xff\\xff\\xff\\xff')" % w)

    def _encode_field(self, em: _Emitter, f: FieldSpec, expr: str, version: int, flex: bool, w: str) -> None:
        flex = flex if f.flexible is None else version in f.flexible
        if f.is_array:
            em("a = %s" % expr)
            em("if a is None:")
            with em.block():
                self._write_null(em, flex, "i", w)
            em("else:")
            with em.block():
                self._write_len(em, "len(a)", flex, "i", w)
                self._encode_array(em, f, version, flex, w)
            return
        if f.struct is not None:
            if version in f.nullable:
                em("if %s is None: %s(b'\\xff')" % (expr, w))
                em("else:")
                with em.block():
                    em("%s(b'\\x01')" % w)
                    em("e_%s_%d(%s, %s)" % (f.struct.name, version, expr, w))
            else:
                em("e_%s_%d(%s, %s)" % (f.struct.name, version, expr, w))
            return
        fixed = _FIXED.get(f.type)
        if fixed:
            st = self.ns.const(struct.Struct(">" + fixed[0]), "S")
            em("%s(%s.pack(%s%s))" % (w, st, expr, ".bytes" if f.type == "uuid" else ""))
            return
        width = "h" if f.type == "string" else "i"
        em("s = %s" % expr)
        em("if s is None:")
        with em.block():
            self._write_null(em, flex, width, w)
        em("else:")
        with em.block():
            if f.type == "string":
                em("s = s.encode()")
            self._write_len(em, "len(s)", flex, width, w)
            em("%s(s)" % w)

    def _encode_array(self, em: _Emitter, f: FieldSpec, version: int, flex: bool, w: str) -> None:
        et = f.elem_type
        fixed = _FIXED.get(et)
        if fixed and et != "uuid":
            if et == "int32":
                em("%s(_i32a(len(a)).pack(*a))" % w)
            elif et == "int64":
                em("%s(_i64a(len(a)).pack(*a))" % w)
            else:
                em("%s(_arr(%r, len(a)).pack(*a))" % (w, fixed[0]))
            return
        em("for it in a:")
        with em.block():
            if f.struct is not None:
                em("e_%s_%d(it, %s)" % (f.struct.name, version, w))
            elif et == "uuid":
                em("%s(it.bytes)" % w)
            else:
                elem = FieldSpec(f.name, f.attr, et, f.versions, f.nullable, f.tagged, None, None, False, f.flexible)
                self._encode_field(em, elem, "it", version, flex, w)


class _MessageBase:
    __slots__ = ()
    FIELDS: tuple[str, ...] = ()

    def __repr__(self) -> str:
        inner = ", ".join("%s=%r" % (a, getattr(self, a)) for a in self.FIELDS)
        return "%s(%s)" % (type(self).__name__, inner)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for a in self.FIELDS:
            v = getattr(self, a)
            if isinstance(v, _MessageBase):
                v = v.to_dict()
            elif isinstance(v, list):
                v = [x.to_dict() if isinstance(x, _MessageBase) else x for x in v]
            out[a] = v
        return out


MessageBase = _MessageBase
