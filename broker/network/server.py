"""The TCP server: size-prefixed frames in, responses out, in request order per connection.

Each connection is an asyncio.BufferedProtocol whose socket reads go straight into its
FrameSplitter's buffers (a request is not copied on its way in); complete frames queue up and one
worker task per connection handles them one at a time, as Kafka does (a connection is muted
until its request is answered), so responses leave in request order. Bad input closes only the
offending connection.

Responses leave through the transport, except the log data of Fetch responses (FileSlice parts,
which the codec passes through): a large slice goes from the page cache to the socket with
os.sendfile once the transport has nothing buffered, so it is never copied into the process;
a small one is read and written like the other bytes, which is cheaper than the extra syscalls.
A response is written completely before the worker takes the next request.

A handler may hold its response back (a group member's heartbeat, until there is news for it):
it registers a release with `RequestContext.release_on_next_request`, which runs as soon as
another request arrives behind it, so that nothing queued on the connection waits for the hold.
"""

from __future__ import annotations

import asyncio
import collections
import ctypes
import ctypes.util
import ipaddress
import logging
import os
import struct
import sys
import time
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any

from broker.apis import APIS, Api, BrokerServices, Intercept, RequestContext, error_response
from broker.apis.registry import CONTROLLER_APIS
from broker.log.handles import OPEN_FILES, descriptor_limit
from broker.log.segment import FileSlice
from broker.observability.logger import get_logger
from broker.observability.metrics import ApiStats
from broker.security.connection import TlsAcceptor, new_authenticator, tls_principal
from broker.security.listeners import Listener
from broker.security.principal import ANONYMOUS
from broker.security.quotas import ClientQuotas
from broker.security.sasl.outcome import Action, Outcome
from protocol import frames
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.messages import DECODE_ERRORS, RESPONSES, encode_frame, encoder_of, request_decoder

if TYPE_CHECKING:
    from broker.security.sasl.authenticator import SaslAuthenticator

log = get_logger("broker.network.server")

# Reading pauses while a connection has more than this queued (frames or bytes): reading ahead
# of a busy worker gains nothing, and the receive buffers of frames that were handled go back to
# the pool instead of new memory being taken for ever more queued frames.
_MAX_QUEUED = 32
_MAX_QUEUED_BYTES = 2 * 1024 * 1024
# FileSlices from this size on go out with os.sendfile; smaller ones are read and written with the
# other bytes (pread + one writev beat dup/sendfile/close for them). Over loopback a copy costs the
# broker less CPU even for 1 MB slices (about 3.0 against 2.4 GB per CPU-second on the 2-core
# bench VM; a share group's 1 KB records 0.54 against 0.70 us of broker CPU each): the gain of
# sendfile is on real network interfaces, so a loopback peer gets copies (Server.
# sendfile_on_loopback). sys.maxsize turns it off.
SENDFILE_MIN_BYTES = 64 * 1024
IDLE_POOL_BYTES = 4 * 1024 * 1024  # receive buffers kept for reuse once traffic calms down


def _load_malloc_trim() -> Callable[[int], int] | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim  # type: ignore[no-any-return]
    except (OSError, AttributeError):
        return None  # not glibc


_MALLOC_TRIM = _load_malloc_trim()


def is_loopback(host: str) -> bool:
    """Whether a peer's address is this machine's loopback (127.0.0.0/8, ::1, or IPv4-mapped)."""
    try:
        address = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False  # a Unix socket or a name: not an IP peer
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def release_free_memory() -> None:
    """Give freed heap memory back to the system (glibc keeps freed 64 KB buffers in its heap,
    so a broker would stay at its peak size once many connections have gone quiet)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)


def _debug_enabled() -> bool:
    """Whether the per-request debug line is logged (its fields cost more than the request's metrics)."""
    is_enabled_for = getattr(log, "is_enabled_for", None)
    return bool(is_enabled_for(logging.DEBUG)) if is_enabled_for is not None else True


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


_HEADER_FIXED = struct.Struct(">hhi")  # api key, api version, correlation id
_HEAD_V0 = struct.Struct(">i")  # response header v0: the correlation id
_HEAD_V1 = struct.Struct(">iB")  # v1: the correlation id and an empty tag buffer


class _Route:
    """What serving one API version takes, looked up once per request: the handler, the request
    decoder, the response encoder, the header versions and the API's metrics. Made at the first
    request of the version (from APIS, filled at import; fault injection goes through the
    server's intercepts, consulted per request)."""

    __slots__ = ("api", "handler", "decode", "encode", "header_version", "tagged_head", "stats")

    def __init__(self, api: Api, version: int, stats: ApiStats) -> None:
        self.api = api
        self.handler = api.handler
        self.decode = request_decoder(api.key, version)
        self.encode = encoder_of(RESPONSES[api.key].root_class, version)
        self.header_version = frames.request_header_version(api.key, version)
        self.tagged_head = frames.response_header_version(api.key, version) >= 1
        self.stats = stats


class _Resumed:
    """Awaitable continuing a coroutine that was started outside any task (Connection._serve_now)
    and is suspended on `waiting_on`: inside a task it goes on as if it had been the task's own,
    waits, results and cancellation passed along as `await` passes them."""

    __slots__ = ("coro", "waiting_on")

    def __init__(self, coro: Coroutine[Any, Any, None], waiting_on: Any) -> None:
        self.coro = coro
        self.waiting_on = waiting_on

    def __await__(self) -> Generator[Any, None, None]:
        coro, waiting_on = self.coro, self.waiting_on
        self.coro = self.waiting_on = None  # type: ignore[assignment]
        while True:
            try:
                yield waiting_on
            except BaseException as exc:  # the task was cancelled, or what it waited for failed
                try:
                    waiting_on = coro.throw(exc)
                except StopIteration:
                    return
                continue
            try:
                waiting_on = coro.send(None)
            except StopIteration:
                return


class Connection(asyncio.BufferedProtocol):
    def __init__(self, server: KafkaServer, listener: Listener | None = None, node: int | None = None) -> None:
        self.server = server
        self.listener = listener  # the listener the client came in on (None: a bare test server)
        self.node = node  # the simulated node the client connected to (None: this broker's own)
        self.principal = ANONYMOUS  # who the client is: set by TLS (client certificate) or SASL
        self.client_software = ("unknown", "unknown")  # name and version from ApiVersions v3+ (Kafka's ClientInformation)
        self.sasl: SaslAuthenticator | None = None  # SASL listeners: sees every frame before the request path
        self.throttled_until = 0.0  # a client quota's throttle: no request is taken before (monotonic seconds)
        self.splitter = frames.FrameSplitter(server.max_request_size, server.buffers)
        self.queue: collections.deque[memoryview] = collections.deque()
        self.queued_bytes = 0
        self.transport: asyncio.Transport | None = None
        self.worker: asyncio.Task[None] | None = None  # handles the queued requests, when one had to wait
        self.loop: asyncio.AbstractEventLoop  # set by connection_made, before any read
        self.peer: tuple[str, int] = ("?", 0)
        self.last_active = time.monotonic()
        self.closing = False  # transport closed or closing: nothing more is sent
        self.draining = False  # shutting down: the current request completes, no new one starts
        self._reading_paused = False
        self._can_write: asyncio.Future[None] | None = None
        self.socket_fd = -1  # the socket for os.sendfile; -1: every response goes through the transport
        self._release_held: Callable[[], None] | None = None  # see RequestContext.release_on_next_request
        self.on_close: list[Callable[[], None]] = []  # told once when the connection is gone (share sessions)
        self.share_watched = False  # its share sessions end with it (on_close)

    # asyncio.BufferedProtocol --------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.loop = asyncio.get_running_loop()
        self.transport = transport  # type: ignore[assignment]  # uvloop's transport is not a subclass
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = (peer[0], peer[1])
        sock = transport.get_extra_info("socket")
        listener = self.listener
        if listener is not None and listener.uses_tls:
            self.principal = tls_principal(transport, listener)  # the handshake is done: the peer is known
        elif sock is not None and hasattr(os, "sendfile") and (
                self.server.sendfile_on_loopback or not is_loopback(self.peer[0])):
            self.socket_fd = sock.fileno()
        if listener is not None and listener.sasl is not None:
            self.sasl = new_authenticator(listener, self.server.broker)
            self.splitter.max_size = listener.sasl.max_receive_size  # sasl.server.max.receive.size
        self.server.connections.add(self)
        if len(self.server.connections) >= self.server.connections_warn_at:
            self.server.warn_descriptors()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.splitter.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        self.last_active = time.monotonic()
        queue = self.queue
        try:
            self.queued_bytes += self.splitter.frames_into(nbytes, queue)
        except frames.FrameTooLarge as exc:
            # a TLS record header read as a size (a TLS client on a plaintext port) gets a hint
            hint = {"tls_on_plaintext_port": True} if exc.size >> 16 == 0x1603 else {}
            log.warning("closing connection: request too large", peer=self.peer, size=exc.size, limit=exc.limit, **hint)
            self.close()
            return
        if not queue:
            return
        if self._release_held is not None:
            self.release_held()
        if self.worker is None and not self.closing and not self.draining:
            if len(queue) == 1 and not self.throttled_until and (self._can_write is None or self._can_write.done()):
                self._serve_now()
            else:
                self.worker = self.loop.create_task(self._work())
        if (
            (len(queue) > _MAX_QUEUED or self.queued_bytes > _MAX_QUEUED_BYTES)
            and not self._reading_paused and self.transport
        ):
            self._reading_paused = True
            self.transport.pause_reading()

    def _serve_now(self) -> None:
        """Handle the one queued request in this callback, without a task: most handlers never
        wait (their answer is in memory, or written to the log's file before they return), and a
        task per request costs more than such a request itself. One that does wait continues in
        a task (the connection's worker), as every request did before; so does what queues up
        behind it."""
        frame = self.queue.popleft()
        self.queued_bytes -= len(frame)
        handling = self._handle(frame)
        try:
            waiting_on = handling.send(None)
        except StopIteration:
            self.last_active = time.monotonic()
            if self._can_write is not None and not self._can_write.done():
                # the client reads slowly: the worker waits for it before the next request, and
                # the response counts as in flight (a shutdown lets it drain)
                self.worker = self.loop.create_task(self._work())
            return
        except (Exception, asyncio.CancelledError):  # _handle answers failures itself: a bug
            log.exception("closing connection: request handling failed", peer=self.peer)
            self.close()
            return
        self.worker = self.loop.create_task(self._finish(handling, waiting_on))

    async def _finish(self, handling: Coroutine[Any, Any, None], waiting_on: Any) -> None:
        """The worker of a connection whose request, started by `_serve_now`, waits: it finishes
        it, then takes the requests queued meanwhile."""
        try:
            await _Resumed(handling, waiting_on)
        except BaseException:
            self.worker = None
            raise
        await self._work()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.connections.discard(self)
        self.splitter.release()
        self.release_held()
        callbacks, self.on_close = self.on_close, []
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("connection close callback failed", peer=self.peer)
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
    def hold(self, release: Callable[[], None]) -> None:
        self._release_held = release
        if self.queue or self.closing or self.draining:
            self.release_held()

    def release_held(self) -> None:
        release, self._release_held = self._release_held, None
        if release is not None:
            release()

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.worker is not None

    async def _work(self) -> None:
        try:
            while True:
                if self._can_write is not None and not self._can_write.done():
                    await self._can_write  # the client reads slowly: no new request until it caught up
                if self.throttled_until:
                    await self._throttled()
                if not self.queue or self.closing or self.draining:
                    break
                frame = self.queue.popleft()
                self.queued_bytes -= len(frame)
                if (
                    self._reading_paused and len(self.queue) <= _MAX_QUEUED // 2
                    and self.queued_bytes <= _MAX_QUEUED_BYTES // 2 and self.transport
                ):
                    self._reading_paused = False
                    self.transport.resume_reading()
                await self._handle(frame)
        finally:
            self.worker = None
            self.last_active = time.monotonic()

    async def _throttled(self) -> None:
        """A quota was exceeded: the connection takes no request until its throttle time has
        passed (KIP-219: the response went out first, carrying throttle_time_ms)."""
        delay = self.throttled_until - time.monotonic()
        self.throttled_until = 0.0
        if delay > 0:
            await asyncio.sleep(delay)

    async def _handle(self, frame: memoryview) -> None:
        if self.sasl is not None:
            outcome = self.sasl.on_frame(frame)
            if outcome.action is not Action.PASS:
                await self._sasl_turn(outcome)
                return
        api_key: int
        api_version: int
        correlation_id: int
        try:
            api_key, api_version, correlation_id = _HEADER_FIXED.unpack_from(frame)
        except struct.error:
            log.warning("closing connection: malformed request header", peer=self.peer, error="short frame")
            self.close()
            return
        route = self.server.routes.get((api_key, api_version)) or self._unrouted(api_key, api_version, correlation_id)
        if route is None:
            return
        try:
            client_id, body = frames.decode_header_rest(frame, route.header_version)
        except ProtocolError as exc:
            log.warning("closing connection: malformed request header", peer=self.peer, error=str(exc))
            self.close()
            return
        try:
            request = route.decode(frame, frame, body)[0]
        except DECODE_ERRORS as exc:
            log.warning(
                "closing connection: malformed request", peer=self.peer, api=route.api.name, version=api_version,
                error=str(exc),
            )
            self.close()
            return
        server = self.server
        ctx = RequestContext(server.broker, api_key, api_version, correlation_id, client_id, self.peer[0],
                             self.peer[1], self)
        failure: ErrorCode | None = None
        handler = route.handler
        quotas = server.quotas
        if quotas is not None and quotas.active:
            handler = quotas.metered(handler)  # request_percentage: the handler's CPU time is counted
        try:
            intercept = server.intercepts.get(api_key)
            if intercept is None:
                response = await handler(ctx, request)
            else:
                response = await intercept(ctx, request, handler)
        except asyncio.CancelledError:
            raise
        except KafkaError as exc:
            failure = exc.code
        except Exception:
            log.exception("unexpected error handling request", api=route.api.name, version=api_version,
                          client_id=client_id)
            failure = ErrorCode.UNKNOWN_SERVER_ERROR
        finally:
            self._release_held = None
        if failure is not None:
            response = error_response(api_key, request, failure, api_version)
            if response is None:
                log.warning("closing connection: the failure of the request cannot be expressed in its response",
                            api=route.api.name, version=api_version, error=failure.name)
                self.close()
                return
        if response is None:  # the handler sends nothing back (Produce with acks=0)
            return
        if self.transport is None or self.closing:
            return
        try:
            parts = route.encode(response, _HEAD_V1.pack(correlation_id, 0) if route.tagged_head
                                 else _HEAD_V0.pack(correlation_id))
        except Exception:
            # a response we cannot encode is a broker bug: the client would wait for it forever
            log.exception("closing connection: cannot encode response", api=route.api.name, version=api_version,
                          client_id=client_id)
            self.close()
            return
        stats = route.stats
        if len(parts) == 1:  # the usual response: one buffer, size and header included
            frame_bytes = parts[0]
            stats.count(len(frame_bytes) - 4)  # counted before it can arrive, its latency once written
            self.transport.write(frame_bytes)
        else:
            rest = self._write_parts(parts, stats)
            if rest is not None:
                await self._write_with_slices(rest)
        stats.latency.observe(time.monotonic() - ctx.received)
        if server.debug:
            log.debug(
                "request", client_id=client_id, api=route.api.name, version=api_version,
                correlation_id=correlation_id, latency_ms=round((time.monotonic() - ctx.received) * 1000, 3),
            )

    def _unrouted(self, api_key: int, api_version: int, correlation_id: int) -> _Route | None:
        """The route of a request seen for the first time, or None once the request is dealt with
        (an unknown API or an unsupported version: the connection closes; ApiVersions is answered)."""
        api = APIS.get(api_key) or (CONTROLLER_APIS.get(api_key) if self.server.controller_apis else None)
        if api is None:
            log.warning("closing connection: unknown api key", peer=self.peer, api_key=api_key)
            self.close()
            return None
        if not api.supports(api_version):
            if api_key == frames.API_VERSIONS_KEY:
                # answered with a v0 body so any client can read which versions we have
                self._send(error_response(api_key, None, ErrorCode.UNSUPPORTED_VERSION), correlation_id, api_key,
                           0, 0)
                return None
            log.warning(
                "closing connection: unsupported version",
                peer=self.peer,
                api=api.name,
                version=api_version,
                supported="%d-%d" % (api.min_version, api.max_version),
            )
            self.close()
            return None
        return self.server.route(api, api_version)

    async def _sasl_turn(self, outcome: Outcome) -> None:
        """Carry out what the SASL authenticator decided for a frame (broker/security/sasl)."""
        sasl = self.sasl
        assert sasl is not None
        header = outcome.header
        if outcome.action is Action.RESPOND and header is not None:
            self._send(outcome.response, header.correlation_id, header.api_key, header.api_version,
                       frames.response_header_version(header.api_key, header.api_version))
        elif outcome.action is Action.RAW and outcome.raw is not None and self.transport is not None:
            self.transport.write(outcome.raw)
        elif outcome.action is Action.FAIL:
            log.warning("closing connection: authentication failed", peer=self.peer,
                        listener=self.listener.name if self.listener else None, mechanism=sasl.mechanism,
                        reason=outcome.reason)
            await asyncio.sleep(sasl.settings.failed_delay_ms / 1000.0)  # connection.failed.authentication.delay.ms
            response = outcome.response
            if outcome.error is not None and header is not None:
                response = error_response(header.api_key, outcome.request, outcome.error, header.api_version)
            if response is not None and header is not None:
                self._send(response, header.correlation_id, header.api_key, header.api_version,
                           frames.response_header_version(header.api_key, header.api_version))
            self.close()
            return
        else:
            log.warning("closing connection: SASL protocol violation", peer=self.peer, reason=outcome.reason)
            self.close()
            return
        if sasl.authenticated:
            self.principal = sasl.principal
            self.splitter.max_size = self.server.max_request_size

    def _send(self, response: Any, correlation_id: int, api_key: int, version: int, header_version: int) -> None:
        """Encode and write a response off the request path (SASL turns, refused versions)."""
        if self.transport is None or self.closing:
            return
        head = _HEAD_V1.pack(correlation_id, 0) if header_version >= 1 else _HEAD_V0.pack(correlation_id)
        parts = encode_frame(response, version, head)
        stats = self.server.broker.metrics.apis.get(api_key)
        if stats is not None:
            stats.count(sum(len(p) for p in parts) - 4)
        self.transport.writelines(parts)

    def _write_parts(self, parts: list[Any], stats: ApiStats) -> list[Any] | None:
        """Write a response whose records were passed through by the encoder (counting it in
        `stats` first): small FileSlices are read in place and, if large ones remain, the parts
        are returned for `_write_with_slices`."""
        assert self.transport is not None
        size = -4  # the size prefix counts what follows it
        large = False
        threshold = self.server.sendfile_min_bytes if self.socket_fd >= 0 else sys.maxsize
        for i, part in enumerate(parts):
            n = len(part)
            size += n
            if part.__class__ is FileSlice:
                if n >= threshold:
                    large = True
                else:
                    try:
                        parts[i] = part.read()
                    except (OSError, KafkaError) as exc:
                        log.error("closing connection: cannot read the records to send", peer=self.peer,
                                  error=str(exc))
                        self.close()
                        return None
        stats.count(size)
        if large:
            return parts
        self.transport.writelines(parts)
        return None

    # log data: sendfile ----------------------------------------------------------------------
    async def _write_with_slices(self, parts: list[Any]) -> None:
        """Write `parts` in order: bytes through the transport, FileSlices with os.sendfile."""
        transport = self.transport
        assert transport is not None
        run: list[Any] = []
        out_fd = -1  # our own duplicate of the socket: valid even if the transport closes meanwhile
        try:
            for part in parts:
                if part.__class__ is not FileSlice:
                    run.append(part)
                    continue
                if run:
                    transport.writelines(run)
                    run = []
                if transport.get_write_buffer_size():
                    await self._drain()  # sendfile must not overtake bytes still in the transport
                if self.closing or transport.is_closing():
                    return
                if out_fd < 0:
                    out_fd = os.dup(self.socket_fd)
                if not await self._sendfile(out_fd, part):
                    return
            if run and not (self.closing or transport.is_closing()):
                transport.writelines(run)
        except (OSError, KafkaError, ValueError) as exc:
            # the client went away, or the segment could not be read: the frame is cut short
            if not self.closing:
                if isinstance(exc, ConnectionError):
                    log.debug("connection lost while sending a fetch response", peer=self.peer, error=str(exc))
                else:
                    log.warning("closing connection: response not written", peer=self.peer, error=str(exc))
                self.close()
        finally:
            if out_fd >= 0:
                os.close(out_fd)

    async def _sendfile(self, out_fd: int, piece: FileSlice) -> bool:
        """Send the whole slice; False if the connection closed first."""
        in_fd = piece.fileno()
        offset, remaining = piece.position, piece.length
        metrics = self.server.broker.metrics
        while remaining:
            try:
                sent = os.sendfile(out_fd, in_fd, offset, remaining)
            except BlockingIOError:  # the socket buffer is full
                metrics.sendfile_waits.inc()
                await self._writable(out_fd)
                if self.closing or self.transport is None or self.transport.is_closing():
                    return False
                continue
            if sent == 0:
                raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, "segment ends before the slice at %d" % offset)
            offset += sent
            remaining -= sent
            metrics.sendfile_bytes.inc(sent)
        return True

    async def _writable(self, fd: int) -> None:
        """Until the socket takes more bytes (watched through our duplicate of it: the loop refuses
        to watch a descriptor its transport owns)."""
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        loop.add_writer(fd, _resolve, ready)
        try:
            await ready
        finally:
            loop.remove_writer(fd)

    async def _drain(self) -> None:
        """Until the transport has written everything it buffered: with a high-water mark of 0 it
        calls pause_writing now and resume_writing once its buffer is empty."""
        transport = self.transport
        assert transport is not None
        low, high = transport.get_write_buffer_limits()
        transport.set_write_buffer_limits(high=0, low=0)
        try:
            while transport.get_write_buffer_size() and not self.closing:
                if self._can_write is None or self._can_write.done():
                    self._can_write = asyncio.get_running_loop().create_future()
                await self._can_write
        finally:
            if not transport.is_closing():
                transport.set_write_buffer_limits(high=high, low=low)

    def close(self) -> None:
        self.closing = True
        self.queue.clear()
        self.queued_bytes = 0
        if self.transport is not None:
            self.transport.close()


class KafkaServer:
    """Listening sockets plus the set of live connections."""

    def __init__(self, broker: BrokerServices, max_request_size: int, idle_ms: int) -> None:
        self.broker = broker
        self.max_request_size = max_request_size
        self.idle_s = idle_ms / 1000.0
        self.connections: set[Connection] = set()
        self.buffers = frames.BufferPool()  # receive buffers, shared by the connections
        self.servers: list[Any] = []  # asyncio Servers, TlsAcceptors: close() and wait_closed()
        self.node_servers: dict[int | None, list[Any]] = {}  # the same, by simulated node (None: this one)
        self.sendfile_min_bytes = SENDFILE_MIN_BYTES  # a FileSlice at least this long is sent with os.sendfile
        self.sendfile_on_loopback = False  # to a loopback peer too (tests of the sendfile path)
        self.debug = _debug_enabled()  # read once: the logging configuration is set before the server starts
        # API key -> what runs instead of its handler (broker.testing's fault injection); empty normally
        self.intercepts: dict[int, Intercept] = {}
        self.quotas: ClientQuotas | None = None  # set once the metadata is loaded
        self.routes: dict[tuple[int, int], _Route] = {}  # (API key, version) -> its route, as requests come
        self.controller_apis = False  # cluster mode: the controller's APIs are served too (not listed)
        self._reaper: asyncio.Task[None] | None = None
        # Connections and log files share the process's descriptors: past the limit a new
        # connection is closed at once (uvloop) or accepting pauses (asyncio), without a word.
        self.connections_warn_at = max(64, descriptor_limit() - OPEN_FILES.capacity - 64)
        self._warned_at = -1e9

    def route(self, api: Api, version: int) -> _Route:
        """The route of a supported API version (made on its first request)."""
        route = self.routes.get((api.key, version))
        if route is None:
            route = self.routes[(api.key, version)] = _Route(api, version, self.broker.metrics.apis[api.key])
        return route

    def warn_descriptors(self) -> None:
        """Say clearly (at most once a minute) that the descriptor limit is near."""
        now = time.monotonic()
        if now - self._warned_at >= 60:
            self._warned_at = now
            log.warning("near the descriptor limit: new connections may be refused", connections=len(self.connections),
                        open_log_files=len(OPEN_FILES), descriptor_limit=descriptor_limit(),
                        hint="raise ulimit -n, or lower log.open.files.max")

    async def listen(self, host: str, port: int, listener: Listener | None = None, node: int | None = None) -> int:
        """Accept connections on host:port; `node`: as that node of a simulated cluster."""
        loop = asyncio.get_running_loop()
        self.connections_warn_at = max(64, descriptor_limit() - OPEN_FILES.capacity - 64)  # configured by now
        if self._reaper is None:
            self._reaper = loop.create_task(self._close_idle())
        if listener is not None and listener.uses_tls:
            acceptor = TlsAcceptor(lambda: Connection(self, listener, node), listener, host, port)
            self.servers.append(acceptor)
            self.node_servers.setdefault(node, []).append(acceptor)
            return acceptor.start()
        server = await loop.create_server(lambda: Connection(self, listener, node), host or None, port,
                                          reuse_address=True, backlog=1024)
        self.servers.append(server)
        self.node_servers.setdefault(node, []).append(server)
        return int(server.sockets[0].getsockname()[1])

    def close_node(self, node: int | None) -> None:
        """A simulated node goes down: its ports close and its clients are cut off."""
        for server in self.node_servers.pop(node, []):
            server.close()
            self.servers.remove(server)
        for conn in list(self.connections):
            if conn.node == node:
                conn.close()

    async def _close_idle(self) -> None:
        """Close connections idle for connections.max.idle.ms; a connection quiet since the last
        look gives its receive buffer back (an idle connection holds none: about 64 KB each
        otherwise), and the pool keeps only IDLE_POOL_BYTES of what nobody uses any more."""
        interval = max(0.05, min(self.idle_s / 4, 10.0))
        while True:
            await asyncio.sleep(interval)
            self.sweep(time.monotonic(), interval)

    def sweep(self, now: float, interval: float) -> None:
        deadline, quiet = now - self.idle_s, now - interval
        for conn in list(self.connections):
            if conn.busy:
                continue
            if conn.last_active < deadline:
                log.info("closing idle connection", peer=conn.peer, idle_ms=int(self.idle_s * 1000))
                conn.close()
            elif conn.last_active < quiet and not conn.splitter.buffered:
                conn.splitter.release()
        if self.buffers.trim(IDLE_POOL_BYTES):
            release_free_memory()

    def abort(self) -> None:
        """Stop at once, as a killed process does: nothing more is accepted, read or answered."""
        for server in self.servers:
            server.close()
        for conn in list(self.connections):
            conn.close()
            if conn.transport is not None:
                conn.transport.abort()  # what is still buffered is never sent

    async def stop(self, grace: float = 10.0) -> None:
        """Stop accepting, let in-flight requests finish (bounded), then close every connection."""
        for server in self.servers:
            server.close()
        if self._reaper is not None:
            self._reaper.cancel()
        for conn in list(self.connections):
            conn.draining = True
            conn.release_held()
        in_flight = [c.worker for c in self.connections if c.worker is not None]
        if in_flight:
            await asyncio.wait(in_flight, timeout=grace)
        for conn in list(self.connections):
            conn.close()
        for server in self.servers:
            await server.wait_closed()
