"""The codec registry behind protocol.messages: every definition in schemas/ compiled into
classes and codecs, and the functions that pick them (use them through protocol.messages, whose
stub tells the type checker the classes' fields).

A definition's file is read, and its classes built, when it is first used (a lookup in a
registry below, or its class named through protocol.messages): a process that serves a few APIs
compiles a few dozen of the 178 definitions. The registries list every definition all the same
(protocol/schema_index.py, generated from schemas/); iterating one builds all it holds. What a
request pays is unchanged: the server keeps the decoder and encoder of each API version, and the
functions below cache theirs.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from protocol import accel
from protocol.codegen import MessageBase, MessageCodec
from protocol.errors import ErrorCode, ProtocolError
from protocol.schema import SCHEMA_DIR, MessageSpec, load_message
from protocol.schema_index import DEFINITIONS

_DECODE_ERRORS = (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError, TypeError, RecursionError)
# what a decoder from `decoder_of` may raise on malformed input (the C decoders: ProtocolError only)
DECODE_ERRORS = (ProtocolError, *_DECODE_ERRORS)

K = TypeVar("K")
V = TypeVar("V")
_LOCK = threading.RLock()  # an entry is made once, whichever thread asks first


class Registry(Mapping[K, V]):
    """A fixed set of keys whose values are made on first lookup (then a dict hit)."""

    def __init__(self, keys: Iterable[K], make: Callable[[K], V]) -> None:
        self._keys = dict.fromkeys(keys)
        self._made: dict[K, V] = {}
        self._make = make

    def __getitem__(self, key: K) -> V:
        try:
            return self._made[key]
        except KeyError:
            if key not in self._keys:
                raise
        with _LOCK:
            value = self._made.get(key)
            if value is None:
                value = self._made[key] = self._make(key)
        return value

    def __contains__(self, key: object) -> bool:
        return key in self._keys

    def __iter__(self) -> Iterator[K]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)

    def __repr__(self) -> str:
        return "<Registry of %d, %d made>" % (len(self._keys), len(self._made))


def _keyed(type_: str) -> dict[int, str]:
    return {key: name for name, (_, t, key) in DEFINITIONS.items() if t == type_ and key is not None}


_REQUEST_NAMES = _keyed("request")
_RESPONSE_NAMES = _keyed("response")
_METADATA_NAMES = _keyed("metadata")
# what metrics and logs call the APIs ("Produce" for key 0), without reading a definition
API_NAMES: dict[int, str] = {key: name.removesuffix("Request") for key, name in _REQUEST_NAMES.items()}

# by definition name: messages (ProduceRequest), headers, internal records (OffsetCommitKey)
SPECS: Registry[str, MessageSpec] = Registry(
    DEFINITIONS, lambda name: load_message(SCHEMA_DIR / DEFINITIONS[name][0] / (name + ".json"))
)
CODECS: Registry[str, MessageCodec] = Registry(DEFINITIONS, lambda name: MessageCodec(SPECS[name]))
CLASSES: Registry[str, type] = Registry(DEFINITIONS, lambda name: CODECS[name].root_class)
# by API key
REQUESTS: Registry[int, MessageCodec] = Registry(_REQUEST_NAMES, lambda key: CODECS[_REQUEST_NAMES[key]])
RESPONSES: Registry[int, MessageCodec] = Registry(_RESPONSE_NAMES, lambda key: CODECS[_RESPONSE_NAMES[key]])
# KRaft metadata records by record type
METADATA_RECORDS: Registry[int, MessageCodec] = Registry(_METADATA_NAMES, lambda key: CODECS[_METADATA_NAMES[key]])

_BY_CLASS: dict[type, MessageCodec] = {}  # codecs by root class, as their classes are met


def _codec_of_class(cls: type) -> MessageCodec | None:
    codec = _BY_CLASS.get(cls)
    if codec is None:
        # a root class is named after its definition, and exists once its codec has built it
        codec = CODECS.get(cls.__name__)
        if codec is None or codec.root_class is not cls:
            return None
        _BY_CLASS[cls] = codec
    return codec


def codec_of(message: Any) -> MessageCodec:
    codec = _codec_of_class(type(message))
    if codec is None:
        raise TypeError("%r is not a top-level message" % type(message).__name__)
    return codec


_DECODERS: dict[tuple[str, int, bool], Any] = {}


def _decoder(codec: MessageCodec, version: int) -> Any:
    # cached per (message, version, accelerated) so a decode costs one dict lookup before the work
    key = (codec.spec.name, version, accel.ENABLED)
    fn = _DECODERS.get(key)
    if fn is None:
        if version not in codec.spec.valid_versions:
            raise ProtocolError(
                "%s has no version %d" % (codec.spec.name, version), ErrorCode.UNSUPPORTED_VERSION
            )
        fn = _DECODERS[key] = codec.decoder(version)
    return fn


# `(data, mv, pos) -> (request, end)`: `mv` a memoryview of `data`, `pos` where the body starts
RequestDecoder = Callable[[bytes | bytearray | memoryview, memoryview, int], tuple[MessageBase, int]]


def request_decoder(api_key: int, version: int) -> RequestDecoder:
    """The decoder `(data, mv, pos) -> (request, end)` of a request version (cached), for the
    server, which reads the header itself; it raises one of DECODE_ERRORS on malformed input."""
    codec = REQUESTS.get(api_key)
    if codec is None:
        raise ProtocolError("unknown api key %d" % api_key, ErrorCode.UNSUPPORTED_VERSION)
    decode: RequestDecoder = _decoder(codec, version)
    return decode


def _decode(codec: MessageCodec, version: int, data: Any, strict: bool = True) -> Any:
    fn = _decoder(codec, version)
    mv = data if isinstance(data, memoryview) else memoryview(data)
    try:
        obj, pos = fn(data, mv, 0)
    except ProtocolError:
        raise
    except _DECODE_ERRORS as exc:
        raise ProtocolError("malformed %s v%d: %s" % (codec.spec.name, version, exc)) from None
    if strict and pos != len(data):
        raise ProtocolError("%d trailing bytes after %s v%d" % (len(data) - pos, codec.spec.name, version))
    return obj


def decode_request(api_key: int, version: int, data: Any, strict: bool = False) -> Any:
    """Kafka ignores bytes after a request body (librdkafka 2.16 leaves some after an "all topics"
    Metadata request), so by default a request may carry trailing bytes."""
    codec = REQUESTS.get(api_key)
    if codec is None:
        raise ProtocolError("unknown api key %d" % api_key, ErrorCode.UNSUPPORTED_VERSION)
    return _decode(codec, version, data, strict)


def decode_response(api_key: int, version: int, data: Any) -> Any:
    codec = RESPONSES.get(api_key)
    if codec is None:
        raise ProtocolError("unknown api key %d" % api_key, ErrorCode.UNSUPPORTED_VERSION)
    return _decode(codec, version, data)


def decode(name: str | type, version: int, data: Any) -> Any:
    """Decode any definition (message, header or internal record) by name or class."""
    codec = CODECS[name] if isinstance(name, str) else _codec_of_class(name)
    if codec is None:
        raise KeyError(name)
    return _decode(codec, version, data)


_ENCODERS: dict[tuple[type, int, bool], Any] = {}


def _encoder(message_type: type, version: int) -> Any:
    codec = _codec_of_class(message_type)
    if codec is None:
        raise TypeError("%r is not a top-level message" % message_type.__name__)
    if version not in codec.spec.valid_versions:
        raise ValueError("%s has no version %d" % (codec.spec.name, version))
    fn = _ENCODERS[(message_type, version, accel.ENABLED)] = codec.encoder(version)
    return fn


def encoder_of(message_type: type, version: int) -> Any:
    """`(message, head=None) -> parts` for messages of `message_type` at `version` (cached: the
    server keeps one per API version)."""
    return _ENCODERS.get((message_type, version, accel.ENABLED)) or _encoder(message_type, version)


def encode_parts(message: Any, version: int) -> list[Any]:
    """Encode into a list of parts; records values too large to copy (or not bytes at all: file
    slices) are passed through as parts of their own (zero copy)."""
    # cached per (class, version), as the decoders are: every response pays for this lookup
    fn = _ENCODERS.get((type(message), version, accel.ENABLED)) or _encoder(type(message), version)
    return fn(message)  # type: ignore[no-any-return]


def encode_frame(message: Any, version: int, head: bytes) -> list[Any]:
    """A whole frame as parts: the int32 size of what follows, `head` (a response header), then
    the message (one buffer unless records are passed through)."""
    fn = _ENCODERS.get((type(message), version, accel.ENABLED)) or _encoder(type(message), version)
    return fn(message, head)  # type: ignore[no-any-return]


def encode(message: Any, version: int) -> bytes:
    parts = encode_parts(message, version)
    return parts[0] if len(parts) == 1 and type(parts[0]) is bytes else b"".join(parts)


def is_flexible(api_key: int, version: int) -> bool:
    return REQUESTS[api_key].spec.is_flexible(version)


__all__ = [
    "API_NAMES",
    "CLASSES",
    "CODECS",
    "DECODE_ERRORS",
    "METADATA_RECORDS",
    "REQUESTS",
    "RESPONSES",
    "SPECS",
    "MessageBase",
    "codec_of",
    "decode",
    "decode_request",
    "decode_response",
    "encode",
    "encode_frame",
    "encode_parts",
    "encoder_of",
    "is_flexible",
    "request_decoder",
]
