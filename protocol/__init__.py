"""Sans-IO Kafka protocol: codecs generated from schemas/, frames, record batches, error codes."""

from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.messages import decode, decode_request, decode_response, encode, encode_parts

__all__ = [
    "ErrorCode",
    "KafkaError",
    "ProtocolError",
    "decode",
    "decode_request",
    "decode_response",
    "encode",
    "encode_parts",
]
