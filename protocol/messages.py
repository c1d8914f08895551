"""The message registry: every definition in schemas/ compiled into classes and codecs.

    decode_request(api_key, version, data) -> message object
    decode_response(api_key, version, data) -> message object
    encode(message, version) -> bytes
    encode_parts(message, version) -> list of bytes-like parts (records values passed through)

Message classes are attributes of this module by their definition name (`ProduceRequest`,
`OffsetCommitKey`, ...); nested structs are attributes of their message class
(`ProduceRequest.TopicProduceData`).
"""

from __future__ import annotations

import struct
from typing import Any

from protocol import accel
from protocol.codegen import MessageBase, MessageCodec
from protocol.errors import ErrorCode, ProtocolError
from protocol.schema import SCHEMA_DIR, MessageSpec, load_dir

_DECODE_ERRORS = (struct.error, IndexError, UnicodeDecodeError, ValueError, OverflowError, TypeError, RecursionError)

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


def __getattr__(name: str) -> Any:
    try:
        return CLASSES[name]
    except KeyError:
        raise AttributeError(name) from None


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


_ENCODERS: dict[tuple[type, int], Any] = {}


def _encoder(message_type: type, version: int) -> Any:
    codec = _BY_CLASS.get(message_type)
    if codec is None:
        raise TypeError("%r is not a top-level message" % message_type.__name__)
    if version not in codec.spec.valid_versions:
        raise ValueError("%s has no version %d" % (codec.spec.name, version))
    fn = _ENCODERS[(message_type, version)] = codec.encoder(version)
    return fn


def encode_parts(message: Any, version: int) -> list[Any]:
    """Encode into a list of parts; records values are passed through untouched (zero copy)."""
    # cached per (class, version), as the decoders are: every response pays for this lookup
    fn = _ENCODERS.get((type(message), version)) or _encoder(type(message), version)
    parts: list[Any] = []
    fn(message, parts.append)
    return parts


def encode(message: Any, version: int) -> bytes:
    return b"".join(encode_parts(message, version))


def is_flexible(api_key: int, version: int) -> bool:
    return REQUESTS[api_key].spec.is_flexible(version)


__all__ = [
    "CLASSES",
    "CODECS",
    "REQUESTS",
    "RESPONSES",
    "SPECS",
    "MessageBase",
    "codec_of",
    "decode",
    "decode_request",
    "decode_response",
    "encode",
    "encode_parts",
    "is_flexible",
]
