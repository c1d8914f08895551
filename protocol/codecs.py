"""The codec registry behind protocol.messages: every definition in schemas/ compiled into
classes and codecs, and the functions that pick them (use them through protocol.messages, whose
stub tells the type checker the classes' fields).
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from protocol import accel
from protocol.codegen import MessageBase, MessageCodec
from protocol.errors import ErrorCode, ProtocolError
from protocol.schema import SCHEMA_DIR, MessageSpec, load_dir

_DECODE_ERRORS = (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError, TypeError, RecursionError)
# what a decoder from `decoder_of` may raise on malformed input (the C decoders: ProtocolError only)
DECODE_ERRORS = (ProtocolError, *_DECODE_ERRORS)

SPECS: dict[str, MessageSpec] = {**load_dir(SCHEMA_DIR / "messages"), **load_dir(SCHEMA_DIR / "records")}
CODECS: dict[str, MessageCodec] = {name: MessageCodec(spec) for name, spec in SPECS.items()}
REQUESTS: dict[int, MessageCodec] = {
    c.spec.api_key: c for c in CODECS.values() if c.spec.type == "request" and c.spec.api_key is not None
}
RESPONSES: dict[int, MessageCodec] = {
    c.spec.api_key: c for c in CODECS.values() if c.spec.type == "response" and c.spec.api_key is not None
}
_BY_CLASS: dict[type, MessageCodec] = {c.root_class: c for c in CODECS.values()}
CLASSES: dict[str, type] = {name: c.root_class for name, c in CODECS.items()}


def codec_of(message: Any) -> MessageCodec:
    try:
        return _BY_CLASS[type(message)]
    except KeyError:
        raise TypeError("%r is not a top-level message" % type(message).__name__) from None


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
    codec = CODECS[name] if isinstance(name, str) else _BY_CLASS[name]
    return _decode(codec, version, data)


_ENCODERS: dict[tuple[type, int, bool], Any] = {}


def _encoder(message_type: type, version: int) -> Any:
    codec = _BY_CLASS.get(message_type)
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
    "CLASSES",
    "CODECS",
    "DECODE_ERRORS",
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
