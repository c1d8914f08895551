"""The topics of a consumer-protocol subscription (ConsumerProtocolSubscription), as Kafka reads
them: the int16 version, then the version-0 prefix every later version keeps (an int32 count of
int16-length strings). Anything else in the metadata is opaque to the broker."""

from __future__ import annotations

import struct

CONSUMER_PROTOCOL_TYPE = "consumer"

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


def subscribed_topics(metadata: bytes) -> list[str] | None:
    """The subscribed topic names, or None if `metadata` is not a consumer subscription."""
    try:
        (version,) = _I16.unpack_from(metadata, 0)
        if version < 0:
            return None
        (count,) = _I32.unpack_from(metadata, 2)
        if count < 0 or count > len(metadata):
            return None
        pos = 6
        topics = []
        for _ in range(count):
            (n,) = _I16.unpack_from(metadata, pos)
            pos += 2
            if n < 0 or pos + n > len(metadata):
                return None
            topics.append(bytes(metadata[pos:pos + n]).decode("utf-8"))
            pos += n
        return topics
    except (struct.error, UnicodeDecodeError):
        return None


def encode_subscription(topics: list[str], version: int = 0, user_data: bytes | None = None) -> bytes:
    """A minimal ConsumerProtocolSubscription (used by tests and tools)."""
    out = [_I16.pack(version), _I32.pack(len(topics))]
    for t in topics:
        raw = t.encode()
        out += [_I16.pack(len(raw)), raw]
    out.append(_I32.pack(-1) if user_data is None else _I32.pack(len(user_data)) + user_data)
    return b"".join(out)
