"""The message registry: every definition in schemas/ compiled into classes and codecs.

    decode_request(api_key, version, data) -> message object
    decode_response(api_key, version, data) -> message object
    encode(message, version) -> bytes
    encode_parts(message, version) -> list of bytes-like parts (records values passed through)
    encode_frame(message, version, head) -> the same, preceded by the frame's size and `head`

Message classes are attributes of this module by their definition name (`ProduceRequest`,
`OffsetCommitKey`, ...); nested structs are attributes of their message class
(`ProduceRequest.TopicProduceData`). They are made at import from schemas/ (protocol.codegen),
so the type checker reads them from messages.pyi, generated from the same schemas by
protocol/stubs.py (`python -m protocol.stubs > protocol/messages.pyi`; a test keeps it current).
The functions live in protocol/codecs.py.
"""

from __future__ import annotations

from protocol import codecs
from protocol.codecs import *  # noqa: F403 (the functions and registries: codecs.__all__)

# The classes as module attributes: `M.OffsetCommitResponse` is a plain lookup (handlers make
# several per request), `from protocol.messages import ProduceResponse` works as for any name.
globals().update(codecs.CLASSES)

__all__ = list(codecs.__all__)
