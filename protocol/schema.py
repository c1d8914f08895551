"""Loading of message definitions (Kafka's message-definition JSON format) from schemas/.

The loader turns each file into a `MessageSpec`: a tree of `StructSpec`s whose `FieldSpec`s
carry the wire facts (type, versions, nullable versions, tagged versions, tag, default).
Code generation (protocol.codegen) works only from these objects.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"

MAX_VERSION = 0x7FFF

PRIMITIVES = frozenset(
    ["bool", "int8", "int16", "uint16", "int32", "uint32", "int64", "float64", "string", "bytes", "records", "uuid"]
)


@dataclass(frozen=True)
class Versions:
    """An inclusive version range; `lo > hi` means no version."""

    lo: int
    hi: int

    @classmethod
    def parse(cls, text: str | None) -> Versions:
        if text is None or text == "none":
            return cls(1, 0)
        text = text.strip()
        if text.endswith("+"):
            return cls(int(text[:-1]), MAX_VERSION)
        if "-" in text:
            lo, hi = text.split("-", 1)
            return cls(int(lo), int(hi))
        return cls(int(text), int(text))

    def __contains__(self, version: object) -> bool:
        return isinstance(version, int) and self.lo <= version <= self.hi

    def __iter__(self):  # type: ignore[no-untyped-def]
        return iter(range(self.lo, self.hi + 1))

    @property
    def empty(self) -> bool:
        return self.lo > self.hi


_versions = cache(Versions.parse)  # the loader's: the few distinct ranges recur in every definition


@cache  # field names recur across definitions
def snake_case(name: str) -> str:
    """Kafka field names (CamelCase) to Python attribute names: `TopicId` -> `topic_id`."""
    s = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    s = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", s)
    return s.lower()


@dataclass
class FieldSpec:
    name: str
    attr: str
    type: str  # primitive name, struct name, or "[]T"
    versions: Versions
    nullable: Versions
    tagged: Versions
    tag: int | None
    default: Any
    ignorable: bool
    flexible: Versions | None  # field-level override of the message's flexible versions
    struct: StructSpec | None = None  # for struct and struct-array fields

    @property
    def is_array(self) -> bool:
        return self.type.startswith("[]")

    @property
    def elem_type(self) -> str:
        return self.type[2:] if self.is_array else self.type


@dataclass
class StructSpec:
    name: str
    versions: Versions
    fields: list[FieldSpec] = field(default_factory=list)


@dataclass
class MessageSpec:
    name: str
    type: str  # request, response, header, coordinator-key, coordinator-value, metadata
    api_key: int | None
    valid_versions: Versions
    flexible_versions: Versions
    root: StructSpec
    structs: dict[str, StructSpec]

    def is_flexible(self, version: int) -> bool:
        return version in self.flexible_versions


class _NewStruct:
    """The default of a struct field whose default is not null: a new instance with its own defaults."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEW_STRUCT"


NEW_STRUCT = _NewStruct()


def _default_value(ftype: str, raw: Any, nullable: bool) -> Any:
    """The Python value of a field's default, as Kafka's generator interprets the `default` key."""
    if ftype.startswith("[]"):
        return None if raw == "null" else ()
    if raw == "null" or (raw is None and nullable and ftype not in PRIMITIVES):
        return None
    if ftype == "bool":
        return raw in (True, "true")
    if ftype in ("int8", "int16", "uint16", "int32", "uint32", "int64"):
        if raw is None or raw == "":
            return 0
        return int(str(raw), 0)
    if ftype == "float64":
        return float(raw) if raw not in (None, "") else 0.0
    if ftype == "string":
        return "" if raw is None else str(raw)
    if ftype in ("bytes", "records"):
        return b""
    if ftype == "uuid":
        return uuid.UUID(int=0)
    return NEW_STRUCT  # struct without a null default: a fresh instance, as Kafka's `new T()`


def load_message(path: Path) -> MessageSpec:
    data = json.loads(path.read_text())
    structs: dict[str, StructSpec] = {}
    for common in data.get("commonStructs", []):
        structs[common["name"]] = StructSpec(common["name"], _versions(common.get("versions", "0+")))
    pending: list[tuple[StructSpec, list[dict[str, Any]]]] = [
        (structs[c["name"]], c["fields"]) for c in data.get("commonStructs", [])
    ]
    root = StructSpec(data["name"], _versions(data["validVersions"]))
    pending.append((root, data["fields"]))
    while pending:
        struct, raw_fields = pending.pop()
        for raw in raw_fields:
            ftype = raw["type"]
            elem = ftype[2:] if ftype.startswith("[]") else ftype
            nullable = _versions(raw.get("nullableVersions"))
            spec = FieldSpec(
                name=raw["name"],
                attr=snake_case(raw["name"]),
                type=ftype,
                versions=_versions(raw.get("versions", raw.get("taggedVersions"))),
                nullable=nullable,
                tagged=_versions(raw.get("taggedVersions")),
                tag=raw.get("tag"),
                default=_default_value(ftype, raw.get("default"), not nullable.empty),
                ignorable=bool(raw.get("ignorable", False)),
                flexible=_versions(raw["flexibleVersions"]) if "flexibleVersions" in raw else None,
            )
            # structs defined inline; common structs are resolved below, once every struct is known
            if elem not in PRIMITIVES and "fields" in raw:
                sub = StructSpec(elem, spec.versions)
                structs[elem] = sub
                pending.append((sub, raw["fields"]))
            struct.fields.append(spec)
    for struct in [root, *structs.values()]:
        for f in struct.fields:
            if f.elem_type not in PRIMITIVES:
                f.struct = structs[f.elem_type]
    return MessageSpec(
        name=data["name"],
        type=data["type"],
        api_key=data.get("apiKey"),
        valid_versions=_versions(data["validVersions"]),
        flexible_versions=_versions(data.get("flexibleVersions", "none")),
        root=root,
        structs=structs,
    )


def load_dir(directory: Path) -> dict[str, MessageSpec]:
    return {p.stem: load_message(p) for p in sorted(directory.glob("*.json"))}
