"""Requests from this broker to another node of the cluster, over its inter-broker listener.

One connection per node, one request at a time on it, answered in order; a connection that fails
is opened again at the next request, and the failed request raises KafkaError with the code the
caller passes (COORDINATOR_NOT_AVAILABLE by default: the caller's clients retry). Requests go as
Kafka's own APIs (AddPartitionsToTxn, WriteTxnMarkers, the share-state RPCs, Envelope,
BrokerRegistration, BrokerHeartbeat ...), so a node cannot tell a peer from a Kafka broker.

A connection speaks the inter-broker listener's security protocol (broker/security/interbroker.py):
TLS with the listener's key and trust stores, then, on a SASL listener, the SASL exchange
(ApiVersions, SaslHandshake, SaslAuthenticate) with sasl.mechanism.inter.broker.protocol before
the first request, and again on the same connection before a request once the server's session
lifetime is nearly over (KIP-368). A refused authentication or TLS handshake is logged as an
error with the other node and the reason, every time (as Kafka's NetworkClient logs it), and the
request fails as an unreachable node's does: its caller retries.
"""

from __future__ import annotations

import asyncio
import ssl
import struct
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from broker.cluster.etcd import within
from broker.cluster.resolve import Resolver
from broker.observability.logger import get_logger
from broker.security.errors import AuthenticationError
from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

if TYPE_CHECKING:
    from broker.security.interbroker import InterBrokerSecurity

log = get_logger("broker.cluster")

TIMEOUT_S = 30.0
_SIZE = struct.Struct(">i")


class NodeClient:
    """Requests to one node, answered in order on one connection."""

    def __init__(self, address: Callable[[], tuple[str, int] | None], client_id: str,
                 timeout_s: float = TIMEOUT_S, security: InterBrokerSecurity | None = None, node: int = -1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.address = address  # where the node is now (None: unknown, e.g. not registered)
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.security = security
        self.node = node
        self.clock = clock
        self._lock = asyncio.Lock()
        self._streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self._correlation_id = 0
        self._sasl_versions: tuple[int, int] | None = None  # SaslHandshake/SaslAuthenticate of this connection
        self._reauthenticate_at: float | None = None  # clock time; None: the session does not expire
        self.resolver = Resolver()

    async def call(self, api_key: int, version: int, request: Any,
                   unreachable: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> Any:
        """The response; KafkaError(`unreachable`) when the node cannot be reached in time."""
        return await self._guarded(lambda: self._send(api_key, version, M.encode(request, version)), unreachable)

    async def call_raw(self, api_key: int, version: int, payload: bytes,
                       unreachable: ErrorCode = ErrorCode.COORDINATOR_NOT_AVAILABLE) -> Any:
        """As `call`, with the request body already encoded."""
        return await self._guarded(lambda: self._send(api_key, version, payload), unreachable)

    async def _guarded(self, send: Callable[[], Any], unreachable: ErrorCode) -> Any:
        async with self._lock:
            try:
                return await within(self.timeout_s, send())
            except asyncio.CancelledError:
                self.close()  # given up with its answer perhaps still to come: not the next request's
                raise
            except (TimeoutError, OSError, asyncio.IncompleteReadError, _Unknown, AuthenticationError) as exc:
                self.close()
                self._log_failure(exc)
                raise KafkaError(unreachable, "node %s: %r" % (self.address(), exc)) from None

    def _log_failure(self, exc: BaseException) -> None:
        """Security failures are configuration errors someone must see; a node that is down is not."""
        address = self.address()
        where = "%s:%d" % address if address is not None else "?"
        listener = self.security.listener if self.security is not None else None
        if isinstance(exc, AuthenticationError):
            log.error("connection to node %d (%s) failed authentication due to: %s" % (self.node, where, exc),
                      node=self.node, listener=listener, mechanism=self.security.mechanism if self.security else None)
        elif isinstance(exc, ssl.SSLError):
            verify = getattr(exc, "verify_message", None)
            reason = "certificate verify failed: %s" % verify if verify else (getattr(exc, "reason", None) or str(exc))
            log.error("connection to node %d (%s) failed: TLS handshake failed: %s" % (self.node, where, reason),
                      node=self.node, listener=listener)

    async def _send(self, api_key: int, version: int, body: bytes) -> Any:
        if self._streams is None:
            await self._connect()
        elif self._reauthenticate_at is not None and self.clock() >= self._reauthenticate_at:
            await self._authenticate(self._sasl_versions)
        return await self._round_trip(api_key, version, body)

    async def _connect(self) -> None:
        address = self.address()
        if address is None:
            raise _Unknown("the node's address is not known")
        host, port = address
        context = self.security.ssl_context if self.security is not None else None
        self._streams = await self.resolver.open_connection(
            host, port, self.timeout_s, ssl=context, server_hostname=host if context is not None else None)
        self._sasl_versions = self._reauthenticate_at = None
        if self.security is not None and self.security.uses_sasl:
            await self._authenticate(None)

    async def _authenticate(self, versions: tuple[int, int] | None) -> None:
        """The SASL exchange (`versions` given: a re-authentication of this connection)."""
        assert self.security is not None
        exchange = self.security.exchange(versions)
        request: tuple[int, int, Any] | None = exchange.start()
        while request is not None:
            key, version, message = request
            request = exchange.receive(await self._round_trip(key, version, M.encode(message, version)))
        self._sasl_versions = exchange.versions
        after = exchange.reauthenticate_after
        self._reauthenticate_at = None if after is None else self.clock() + after

    async def _round_trip(self, api_key: int, version: int, body: bytes) -> Any:
        assert self._streams is not None
        reader, writer = self._streams
        self._correlation_id += 1
        payload = frames.encode_request_header(api_key, version, self._correlation_id, self.client_id) + body
        writer.write(_SIZE.pack(len(payload)) + payload)
        await writer.drain()
        (size,) = _SIZE.unpack(await reader.readexactly(4))
        data = await reader.readexactly(size)
        (correlation_id,) = _SIZE.unpack_from(data)
        if correlation_id != self._correlation_id:
            raise _Unknown("response to request %d, %d expected" % (correlation_id, self._correlation_id))
        offset = 5 if frames.response_header_version(api_key, version) == 1 else 4
        return M.decode_response(api_key, version, data[offset:])

    def close(self) -> None:
        if self._streams is not None:
            self._streams[1].close()
            self._streams = None


class _Unknown(Exception):
    pass


class NodeClients:
    """One NodeClient per node, made on first use, all with the inter-broker listener's security."""

    def __init__(self, address_of: Callable[[int], tuple[str, int] | None], client_id: str,
                 security: InterBrokerSecurity | None = None) -> None:
        self.address_of = address_of
        self.client_id = client_id
        self.security = security
        self._clients: dict[int, NodeClient] = {}

    def __call__(self, node: int) -> NodeClient:
        client = self._clients.get(node)
        if client is None:
            client = self._clients[node] = NodeClient(lambda: self.address_of(node), self.client_id,
                                                      security=self.security, node=node)
        return client

    def close(self) -> None:
        for client in self._clients.values():
            client.close()
        self._clients.clear()
