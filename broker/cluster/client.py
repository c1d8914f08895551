"""Requests from this broker to another node of the cluster, over its inter-broker listener.

One connection per node, one request at a time on it, answered in order; a connection that fails
is opened again at the next request, and the failed request raises KafkaError with the code the
caller passes (COORDINATOR_NOT_AVAILABLE by default: the caller's clients retry). Requests go as
Kafka's own APIs (AddPartitionsToTxn, WriteTxnMarkers, the share-state RPCs, Envelope,
BrokerRegistration, BrokerHeartbeat ...), so a node cannot tell a peer from a Kafka broker.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Callable
from typing import Any

from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

TIMEOUT_S = 30.0


class NodeClient:
    """Requests to one node, answered in order on one connection."""

    def __init__(self, address: Callable[[], tuple[str, int] | None], client_id: str,
                 timeout_s: float = TIMEOUT_S) -> None:
        self.address = address  # where the node is now (None: unknown, e.g. not registered)
        self.client_id = client_id
        self.timeout_s = timeout_s
        self._lock = asyncio.Lock()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation_id = 0

    async def call(self, api_key: int, version: int, request: Any,
                   unreachable: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> Any:
        """The response; KafkaError(`unreachable`) when the node cannot be reached in time."""
        async with self._lock:
            try:
                return await asyncio.wait_for(self._call(api_key, version, request), self.timeout_s)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, _Unknown) as exc:
                self.close()
                raise KafkaError(unreachable, "node %s: %r" % (self.address(), exc)) from None

    async def call_raw(self, api_key: int, version: int, payload: bytes,
                       unreachable: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> Any:
        """As `call`, with the request body already encoded."""
        async with self._lock:
            try:
                return await asyncio.wait_for(self._send(api_key, version, payload), self.timeout_s)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, _Unknown) as exc:
                self.close()
                raise KafkaError(unreachable, "node %s: %r" % (self.address(), exc)) from None

    async def _call(self, api_key: int, version: int, request: Any) -> Any:
        return await self._send(api_key, version, M.encode(request, version))

    async def _send(self, api_key: int, version: int, body: bytes) -> Any:
        if self._streams is None:
            address = self.address()
            if address is None:
                raise _Unknown("the node's address is not known")
            self._streams = await asyncio.open_connection(*address)
        reader, writer = self._streams
        self._correlation_id += 1
        payload = frames.encode_request_header(api_key, version, self._correlation_id, self.client_id) + body
        writer.write(struct.pack(">i", len(payload)) + payload)
        await writer.drain()
        (size,) = struct.unpack(">i", await reader.readexactly(4))
        data = await reader.readexactly(size)
        offset = 5 if frames.response_header_version(api_key, version) == 1 else 4
        return M.decode_response(api_key, version, data[offset:])

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class _Unknown(Exception):
    pass


class NodeClients:
    """One NodeClient per node, made on first use."""

    def __init__(self, address_of: Callable[[int], tuple[str, int] | None], client_id: str) -> None:
        self.address_of = address_of
        self.client_id = client_id
        self._clients: dict[int, NodeClient] = {}

    def __call__(self, node: int) -> NodeClient:
        client = self._clients.get(node)
        if client is None:
            client = self._clients[node] = NodeClient(lambda: self.address_of(node), self.client_id)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
