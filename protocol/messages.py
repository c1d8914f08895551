"""The message registry: every definition in schemas/ compiled into classes and codecs.

    decode_request(api_key, version, data) -> message object
    decode_response(api_key, version, data) -> message object
    encode(message, version) -> bytes
    encode_parts(message, version) -> list of bytes-like parts (records values passed through)
    encode_frame(message, version, head) -> the same, preceded by the frame's size and `head`

Message classes are attributes of this module by their definition name (`ProduceRequest`,
`OffsetCommitKey`, ...); nested structs are attributes of their message class
(`ProduceRequest.TopicProduceData`). They are made from schemas/ (protocol.codegen) when first
named, so the type checker reads them from messages.pyi, generated from the same schemas by
protocol/stubs.py (`python -m protocol.stubs > protocol/messages.pyi`; a test keeps it current).
The functions live in protocol/codecs.py.
"""

from __future__ import annotations

from typing import Any

from protocol import codecs
from protocol.codecs import *  # noqa: F403 (the functions and registries: codecs.__all__)

__all__ = list(codecs.__all__)


def __getattr__(name: str) -> Any:
    """A message class, built the first time it is named (PEP 562) and kept as a module attribute:
    from then on `M.OffsetCommitResponse` is a plain lookup (handlers make several per request),
    and `from protocol.messages import ProduceResponse` works as for any name."""
    cls = codecs.CLASSES.get(name)
    if cls is None:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    globals()[name] = cls
    return cls


def __dir__() -> list[str]:
    return sorted({*globals(), *codecs.CLASSES})
