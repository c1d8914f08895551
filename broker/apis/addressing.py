"""What a request is about (topic-partitions, topics, groups) and how part of it is answered with
an error while the handler serves the rest.

Fault injection (`Faults.fail(..., topic=, partition=, group=)`) and the simulated cluster (a
partition led by another node answers NOT_LEADER_OR_FOLLOWER, a group coordinated elsewhere
NOT_COORDINATOR) both answer *part* of a request with an error, as Kafka's ReplicaManager and
group coordinator do per partition and per group: `answer_in_part` takes the failing entries out
of the request, lets the handler serve what is left (nothing is written for a failed partition),
and puts error entries for the failed ones into the response.

The SHAPES table says, per API (and version range), where its request names its groups, topics
and partitions (`Level`s, outermost first) and which response arrays answer them. An error for a
group named in a field of the request (OffsetCommit's group_id) goes where Kafka puts a
request-wide error: the top-level error code when that version has one, else every entry. An API
without a shape can only fail as a whole, through its top-level error code.
"""

from __future__ import annotations

import enum
import re
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, NamedTuple

from broker.apis import Handler, RequestContext, error_response
from protocol.errors import ErrorCode
from protocol.messages import RESPONSES
from protocol.schema import StructSpec

PRODUCE, API_VERSIONS = 0, 18


class Role(enum.Enum):
    GROUP = "group"
    TOPIC = "topic"
    PARTITION = "partition"


class Key(NamedTuple):
    """What one entry of a request is about; None where the request does not say."""

    group: str | None = None
    topic: str | None = None
    partition: int | None = None


@dataclass(frozen=True)
class Level:
    """One array of a request and the response array that answers it. `copy` pairs (request
    attribute, response attribute) identify an entry; "" as the request attribute: the entries
    are the keys themselves (DescribeGroups' list of group ids)."""

    role: Role
    request: str
    response: str
    copy: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Shape:
    levels: tuple[Level, ...]
    group: str | None = None  # a request field naming the one group the whole request is about
    lo: int = 0  # versions this shape applies to
    hi: int = 32767
    wait: str | None = None  # a long-poll bound (Fetch's max_wait_ms) zeroed when a part failed, as Kafka answers at once


def _topics(request: str = "topics", response: str = "topics", name: str = "name", id_: bool = False) -> Level:
    copy = ((name, name), ("topic_id", "topic_id")) if id_ else ((name, name),)
    return Level(Role.TOPIC, request, response, copy)


def _partitions(request: str = "partitions", response: str = "partitions", key: str = "partition_index",
                response_key: str = "partition_index") -> Level:
    return Level(Role.PARTITION, request, response, ((key, response_key),))


def _groups(request: str, response: str, key: str = "", response_key: str = "group_id") -> Level:
    return Level(Role.GROUP, request, response, ((key, response_key),))


_PARTITIONS = (_topics(), _partitions())
_PARTITION_INDEXES = (_topics(), _partitions("partition_indexes", key=""))
# the share-state RPCs (83-87): one group, topics by id, partitions answered one by one
_SHARE_STATE = Shape((_topics("topics", "results", "topic_id"), _partitions(key="partition", response_key="partition")),
                     group="group_id")
SHAPES: dict[int, tuple[Shape, ...]] = {
    0: (Shape((_topics("topic_data", "responses", id_=True), _partitions("partition_data", "partition_responses",
                                                                          "index", "index"))),),
    1: (Shape((_topics("topics", "responses", "topic", id_=True), _partitions(key="partition")), wait="max_wait_ms"),),
    2: (Shape(_PARTITIONS),),
    3: (Shape((_topics(id_=True),)),),  # Metadata: answered by the handler, entries failed afterwards
    8: (Shape((_topics(id_=True), _partitions()), group="group_id"),),
    9: (Shape(_PARTITION_INDEXES, group="group_id", hi=7),
        Shape((_groups("groups", "groups", "group_id"), _topics(id_=True), _partitions("partition_indexes", key="")),
              lo=8)),
    10: (Shape((), group="key", hi=3), Shape((_groups("coordinator_keys", "coordinators", response_key="key"),), lo=4)),
    11: (Shape((), group="group_id"),),
    12: (Shape((), group="group_id"),),
    13: (Shape((), group="group_id"),),
    14: (Shape((), group="group_id"),),
    15: (Shape((_groups("groups", "groups"),)),),
    19: (Shape((_topics(),)),),
    20: (Shape((Level(Role.TOPIC, "topic_names", "responses", (("", "name"),)),), hi=5),
         Shape((Level(Role.TOPIC, "topics", "responses", (("name", "name"), ("topic_id", "topic_id"))),), lo=6)),
    21: (Shape(_PARTITIONS),),
    23: (Shape((_topics(name="topic"), _partitions(key="partition", response_key="partition"))),),
    28: (Shape(_PARTITIONS, group="group_id"),),
    37: (Shape((_topics(response="results"),)),),
    42: (Shape((_groups("groups_names", "results"),)),),
    47: (Shape(_PARTITIONS, group="group_id"),),
    61: (Shape(_PARTITION_INDEXES),),
    68: (Shape((), group="group_id"),),
    69: (Shape((_groups("group_ids", "groups"),)),),
    76: (Shape((), group="group_id"),),
    77: (Shape((_groups("group_ids", "groups"),)),),
    78: (Shape((_topics("topics", "responses", "topic_id"), _partitions()), group="group_id", wait="max_wait_ms"),),
    79: (Shape((_topics("topics", "responses", "topic_id"), _partitions()), group="group_id"),),
    83: (_SHARE_STATE,),
    84: (_SHARE_STATE,),
    85: (_SHARE_STATE,),
    86: (_SHARE_STATE,),
    87: (_SHARE_STATE,),
    90: (Shape((_groups("groups", "groups", "group_id"),)),),
    91: (Shape((), group="group_id"),),
    92: (Shape((), group="group_id"),),
}


def shape_of(api_key: int, version: int) -> Shape | None:
    for shape in SHAPES.get(api_key, ()):
        if shape.lo <= version <= shape.hi:
            return shape
    return None


def roles(api_key: int) -> set[Role]:
    """What requests of this API can be about, over all versions (to check a fault's filter)."""
    out: set[Role] = set()
    for shape in SHAPES.get(api_key, ()):
        out.update(level.role for level in shape.levels)
        if shape.group is not None:
            out.add(Role.GROUP)
    return out


ErrorFor = Callable[[Key], ErrorCode | None]
Resolve = Callable[[Any], str | None]  # a topic id -> its name


# ---- reading a request -------------------------------------------------------------------------
def _entry_key(level: Level, entry: Any) -> Any:
    attr = level.copy[0][0]
    return entry if attr == "" else getattr(entry, attr)


def _topic_name(level: Level, entry: Any, resolve: Resolve) -> str | None:
    name = _entry_key(level, entry)
    if isinstance(name, uuid.UUID):  # a level keyed by topic id (the share APIs): its name
        return resolve(name)
    if name:
        return str(name)
    topic_id = getattr(entry, "topic_id", None)
    return resolve(topic_id) if topic_id is not None else None


def _with(key: Key, level: Level, entry: Any, resolve: Resolve) -> Key:
    if level.role is Role.GROUP:
        return key._replace(group=_entry_key(level, entry))
    if level.role is Role.TOPIC:
        return key._replace(topic=_topic_name(level, entry, resolve))
    return key._replace(partition=_entry_key(level, entry))


def keys(api_key: int, version: int, request: Any, resolve: Resolve) -> Iterator[Key]:
    """Every innermost entry of the request as a Key (one Key() for a request naming nothing)."""
    shape = shape_of(api_key, version)
    if shape is None:
        yield Key()
        return
    base = Key(group=getattr(request, shape.group)) if shape.group else Key()
    if not shape.levels:
        yield base
        return

    def walk(container: Any, depth: int, key: Key) -> Iterator[Key]:
        level = shape.levels[depth]
        for entry in getattr(container, level.request) or ():
            inner = _with(key, level, entry, resolve)
            if depth + 1 == len(shape.levels):
                yield inner
            else:
                yield from walk(entry, depth + 1, inner)

    yield from walk(request, 0, base)


# ---- answering in part -------------------------------------------------------------------------
# fields an error entry reports as unknown (-1), as Kafka's error responses do
_UNKNOWN = re.compile(r"(offset|epoch|watermark|timestamp|append_time_ms|node_id|leader_id|^port)$")


def _struct_class(api_key: int, parent: StructSpec, attr: str) -> tuple[type, StructSpec]:
    field = next(f for f in parent.fields if f.attr == attr)
    assert field.struct is not None, attr
    return RESPONSES[api_key].classes[field.struct.name], field.struct


def _new_entry(cls: type, spec: StructSpec, level: Level, request_entry: Any, code: ErrorCode | None) -> Any:
    entry = cls()
    for request_attr, response_attr in level.copy:
        value = request_entry if request_attr == "" else getattr(request_entry, request_attr, None)
        if value is not None and hasattr(entry, response_attr):
            setattr(entry, response_attr, value)
    if code is not None:
        entry.error_code = int(code)
        _mark_unknown(entry, spec)
    return entry


def _mark_unknown(entry: Any, spec: StructSpec) -> None:
    """What an error answer does not know is -1 (offsets, epochs, node ids), records are empty."""
    for f in spec.fields:
        if f.type in ("int32", "int64") and f.default in (0, "0") and _UNKNOWN.search(f.attr):
            setattr(entry, f.attr, -1)
        elif f.attr == "records":
            setattr(entry, f.attr, b"")  # never null: librdkafka rejects null records


@dataclass
class _Failed:
    """A request entry taken out of the request: failed as a whole (code) or in part (inner)."""

    entry: Any
    code: ErrorCode | None
    inner: list[_Failed]


def _split(shape: Shape, container: Any, depth: int, key: Key, error_for: ErrorFor, resolve: Resolve) -> list[_Failed]:
    """Take the failing entries out of `container`'s array at `depth`; returns them."""
    level = shape.levels[depth]
    entries = getattr(container, level.request) or []
    kept, failed = [], []
    innermost = depth + 1 == len(shape.levels)
    for entry in entries:
        inner_key = _with(key, level, entry, resolve)
        code = error_for(inner_key) if innermost or level.role is Role.GROUP else None
        if code is not None:
            failed.append(_Failed(entry, code, []))
            continue
        if innermost:
            kept.append(entry)
            continue
        inner = _split(shape, entry, depth + 1, inner_key, error_for, resolve)
        if inner:
            failed.append(_Failed(entry, None, inner))
        if getattr(entry, shape.levels[depth + 1].request):
            kept.append(entry)
    if failed:
        setattr(container, level.request, kept)
    return failed


def _merge(api_key: int, spec: StructSpec, container: Any, shape: Shape, depth: int, failed: list[_Failed]) -> None:
    level = shape.levels[depth]
    cls, entry_spec = _struct_class(api_key, spec, level.response)
    entries = getattr(container, level.response)
    if entries is None:
        entries = []
        setattr(container, level.response, entries)
    for f in failed:
        if f.code is not None:
            entries.append(_new_entry(cls, entry_spec, level, f.entry, f.code))
            continue
        probe = _new_entry(cls, entry_spec, level, f.entry, None)
        target = next((e for e in entries if all(getattr(e, r) == getattr(probe, r) for _, r in level.copy)), None)
        if target is None:
            target = probe
            entries.append(target)
        _merge(api_key, entry_spec, target, shape, depth + 1, f.inner)


def _empty_response(api_key: int) -> Any:
    return RESPONSES[api_key].root_class()


def _fail_everything(api_key: int, version: int, request: Any, code: ErrorCode) -> Any | None:
    """The whole request failed: the top-level error code when the version has one, else every
    innermost entry (None: this version cannot express the failure)."""
    shape = shape_of(api_key, version)
    top = error_response(api_key, request, code, version)
    if top is not None and api_key != API_VERSIONS:
        _mark_unknown(top, RESPONSES[api_key].spec.root)
    if top is not None or shape is None or not shape.levels:
        return top
    response = _empty_response(api_key)
    failed = _split(shape, request, 0, Key(), lambda _key: code, lambda _id: None)
    _merge(api_key, RESPONSES[api_key].spec.root, response, shape, 0, failed)
    return response


async def answer_in_part(ctx: RequestContext, request: Any, handler: Handler, error_for: ErrorFor, resolve: Resolve) -> Any:
    """Answer the entries `error_for` fails with their error and let `handler` serve the rest.
    Returns the response (None: none is sent, as for Produce with acks=0, or the connection was
    closed because the failure cannot be expressed in this version's response)."""
    api_key, version = ctx.api_key, ctx.api_version
    shape = shape_of(api_key, version)
    if shape is None:
        code = error_for(Key())
        return await handler(ctx, request) if code is None else fail_whole(ctx, request, code)
    if shape.group is not None:
        code = error_for(Key(group=getattr(request, shape.group)))
        if code is not None:
            return fail_whole(ctx, request, code)
    if not shape.levels:
        return await handler(ctx, request)
    base = Key(group=getattr(request, shape.group)) if shape.group else Key()
    failed = _split(shape, request, 0, base, error_for, resolve)
    if not failed:
        return await handler(ctx, request)
    if getattr(request, shape.levels[0].request):
        if shape.wait is not None:
            setattr(request, shape.wait, 0)
        response = await handler(ctx, request)
        if response is None:  # acks=0: Kafka closes the connection when a fire-and-forget write failed
            ctx.connection.close()
            return None
    elif api_key == PRODUCE and request.acks == 0:
        ctx.connection.close()  # nothing was written and no answer is expected
        return None
    else:
        response = _empty_response(api_key)
    _merge(api_key, RESPONSES[api_key].spec.root, response, shape, 0, failed)
    return response


def fail_whole(ctx: RequestContext, request: Any, code: ErrorCode) -> Any | None:
    """The whole request answered with `code` (None: the connection was closed, as the version
    cannot express it)."""
    response = _fail_everything(ctx.api_key, ctx.api_version, request, code)
    if response is None:
        ctx.connection.close()
    return response


def fail_entries_after(response: Any, error_for: ErrorFor) -> None:
    """Metadata: fail the matching topics (or partitions) of a response the handler built, so that
    topics a request did not name (all of them) can fail too."""
    for topic in getattr(response, "topics", None) or ():
        code = error_for(Key(topic=topic.name))
        if code is not None:
            topic.error_code = int(code)
            topic.partitions = []
            continue
        for p in topic.partitions or ():
            code = error_for(Key(topic=topic.name, partition=p.partition_index))
            if code is not None:
                p.error_code = int(code)
                p.leader_id = -1
