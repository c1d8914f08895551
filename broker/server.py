"""The TCP server: size-prefixed frames in, responses out, in request order per connection.

Each connection is an asyncio.Protocol feeding a FrameSplitter; complete frames queue up and one
worker task per connection handles them one at a time, as Kafka does (a connection is muted
until its request is answered), so responses leave in request order. Bad input closes only the
offending connection.
"""

from __future__ import annotations

import asyncio
import collections
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from broker.apis import APIS, error_response
from protocol import frames
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.messages import decode_request, encode_parts

log = structlog.get_logger("broker.server")

_MAX_QUEUED = 32  # frames buffered per connection before reading is paused


@dataclass
class RequestContext:
    """What a handler knows about the request beyond its body."""

    broker: Any
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    client_port: int
    connection: Connection
    received: float = field(default_factory=time.monotonic)


class Connection(asyncio.Protocol):
    def __init__(self, server: KafkaServer) -> None:
        self.server = server
        self.splitter = frames.FrameSplitter(server.max_request_size)
        self.queue: collections.deque[bytes] = collections.deque()
        self.transport: asyncio.Transport | None = None
        self.worker: asyncio.Task[None] | None = None
        self.peer: tuple[str, int] = ("?", 0)
        self.last_active = time.monotonic()
        self.closing = False  # transport closed or closing: nothing more is sent
        self.draining = False  # shutting down: the current request completes, no new one starts
        self._reading_paused = False
        self._can_write: asyncio.Future[None] | None = None

    # asyncio.Protocol ----------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # uvloop's transport is not a subclass
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = (peer[0], peer[1])
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.last_active = time.monotonic()
        try:
            for frame in self.splitter.feed(data):
                self.queue.append(frame)
        except frames.FrameTooLarge as exc:
            log.warning("closing connection: request too large", peer=self.peer, size=exc.size, limit=exc.limit)
            self.close()
            return
        if self.queue and self.worker is None and not self.closing and not self.draining:
            self.worker = asyncio.get_running_loop().create_task(self._work())
        if len(self.queue) > _MAX_QUEUED and not self._reading_paused and self.transport:
            self._reading_paused = True
            self.transport.pause_reading()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        if self.worker is not None:
            self.worker.cancel()
        if self._can_write is not None and not self._can_write.done():
            self._can_write.set_result(None)

    def pause_writing(self) -> None:
        if self._can_write is None or self._can_write.done():
            self._can_write = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        if self._can_write is not None and not self._can_write.done():
            self._can_write.set_result(None)

    # request processing --------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.worker is not None

    async def _work(self) -> None:
        try:
            while self.queue and not self.closing and not self.draining:
                frame = self.queue.popleft()
                if self._reading_paused and len(self.queue) <= _MAX_QUEUED // 2 and self.transport:
                    self._reading_paused = False
                    self.transport.resume_reading()
                await self._handle(frame)
                if self._can_write is not None and not self._can_write.done():
                    await self._can_write
        finally:
            self.worker = None
            self.last_active = time.monotonic()

    async def _handle(self, frame: bytes) -> None:
        try:
            header = frames.decode_request_header(frame)
        except ProtocolError as exc:
            log.warning("closing connection: malformed request header", peer=self.peer, error=str(exc))
            self.close()
            return
        api = APIS.get(header.api_key)
        if api is None:
            log.warning("closing connection: unknown api key", peer=self.peer, api_key=header.api_key)
            self.close()
            return
        if not api.supports(header.api_version):
            if header.api_key == frames.API_VERSIONS_KEY:
                # answered with a v0 body so any client can read which versions we have
                self._send(error_response(header.api_key, None, ErrorCode.UNSUPPORTED_VERSION), header, 0, 0)
                return
            log.warning(
                "closing connection: unsupported version",
                peer=self.peer,
                api=api.name,
                version=header.api_version,
                supported="%d-%d" % (api.min_version, api.max_version),
            )
            self.close()
            return
        try:
            request = decode_request(header.api_key, header.api_version, memoryview(frame)[header.body_offset :])
        except ProtocolError as exc:
            log.warning(
                "closing connection: malformed request", peer=self.peer, api=api.name, version=header.api_version,
                error=str(exc),
            )
            self.close()
            return
        ctx = RequestContext(
            self.server.broker, header.api_key, header.api_version, header.correlation_id, header.client_id,
            self.peer[0], self.peer[1], self,
        )
        failure: ErrorCode | None = None
        try:
            response = await api.handler(ctx, request)
        except asyncio.CancelledError:
            raise
        except KafkaError as exc:
            failure = exc.code
        except Exception:
            log.exception("unexpected error handling request", api=api.name, version=header.api_version,
                          client_id=header.client_id)
            failure = ErrorCode.UNKNOWN_SERVER_ERROR
        if failure is not None:
            response = error_response(header.api_key, request, failure, header.api_version)
            if response is None:
                log.warning("closing connection: the failure of the request cannot be expressed in its response",
                            api=api.name, version=header.api_version, error=failure.name)
                self.close()
                return
        if response is None:  # the handler sends nothing back (Produce with acks=0)
            return
        try:
            self._send(response, header, header.api_version,
                       frames.response_header_version(header.api_key, header.api_version))
        except Exception:
            # a response we cannot encode is a broker bug: the client would wait for it forever
            log.exception("closing connection: cannot encode response", api=api.name, version=header.api_version,
                          client_id=header.client_id)
            self.close()
            return
        log.debug(
            "request", client_id=header.client_id, api=api.name, version=header.api_version,
            correlation_id=header.correlation_id, latency_ms=round((time.monotonic() - ctx.received) * 1000, 3),
        )

    def _send(self, response: Any, header: frames.RequestHeader, version: int, header_version: int) -> None:
        if self.transport is None or self.closing:
            return
        parts = encode_parts(response, version)
        head = frames.encode_response_header(header.correlation_id, header_version)
        size = len(head) + sum(len(p) for p in parts)
        self.transport.writelines([frames.size_prefix(size), head, *parts])
        self.server.broker.metrics.response_sent(header.api_key, size)

    def close(self) -> None:
        self.closing = True
        self.queue.clear()
        if self.transport is not None:
            self.transport.close()


class KafkaServer:
    """Listening sockets plus the set of live connections."""

    def __init__(self, broker: Any, max_request_size: int, idle_ms: int) -> None:
        self.broker = broker
        self.max_request_size = max_request_size
        self.idle_s = idle_ms / 1000.0
        self.connections: set[Connection] = set()
        self.servers: list[asyncio.base_events.Server] = []
        self._reaper: asyncio.Task[None] | None = None

    async def listen(self, host: str, port: int) -> int:
        loop = asyncio.get_running_loop()
        server = await loop.create_server(lambda: Connection(self), host or None, port, reuse_address=True, backlog=1024)
        self.servers.append(server)
        if self._reaper is None:
            self._reaper = loop.create_task(self._close_idle())
        return int(server.sockets[0].getsockname()[1])

    async def _close_idle(self) -> None:
        interval = max(0.05, min(self.idle_s / 4, 10.0))
        while True:
            await asyncio.sleep(interval)
            deadline = time.monotonic() - self.idle_s
            for conn in list(self.connections):
                if not conn.busy and conn.last_active < deadline:
                    log.info("closing idle connection", peer=conn.peer, idle_ms=int(self.idle_s * 1000))
                    conn.close()

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close every connection."""
        for server in self.servers:
            server.close()
        if self._reaper is not None:
            self._reaper.cancel()
        for conn in list(self.connections):
            conn.draining = True
        in_flight = [c.worker for c in self.connections if c.worker is not None]
        if in_flight:
            await asyncio.wait(in_flight, timeout=grace)
        for conn in list(self.connections):
            conn.close()
        for server in self.servers:
            await server.wait_closed()
