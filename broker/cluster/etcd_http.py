"""`Etcd` over etcd's v3 JSON gateway (HTTP/1.1 on the client port, `/v3/...`), on asyncio streams.

No dependency beyond the standard library (see README.md beside this file for why not a gRPC
client). Requests go to one endpoint at a time; a connection that cannot be opened moves to the
next endpoint at once (nothing was sent), any other failure raises EtcdUnavailable and the next
call starts at the next endpoint. Idle keep-alive connections are pooled per endpoint; a pooled
connection found closed before any answer is retried once on a fresh one. A watch holds its own
connection and asks etcd to cancel it when its member loses the raft leader (`hasleader`), so a
watch on a partitioned member ends instead of going silent; when no byte arrives for
`watch_idle_timeout` the member is probed and the watch ends if it does not answer.
"""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from broker.cluster.etcd import (
    Compare,
    DeleteRange,
    EtcdCompacted,
    EtcdError,
    EtcdUnavailable,
    Event,
    EventType,
    KeyValue,
    LeaseNotFound,
    Put,
    RangeResult,
    TxnOp,
    TxnResult,
    WatchBatch,
    within,
)
from broker.cluster.resolve import Resolver

# gRPC status codes etcd answers with, and what a caller can do about them
_RETRIABLE_CODES = {1, 4, 8, 10, 14}  # CANCELLED, DEADLINE_EXCEEDED, RESOURCE_EXHAUSTED, ABORTED, UNAVAILABLE
_NOT_FOUND = 5
_OUT_OF_RANGE = 11
_MAX_HEADER_LINES = 100


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str | None) -> bytes:
    return base64.b64decode(text) if text else b""


def _kv(obj: dict[str, Any]) -> KeyValue:
    return KeyValue(
        key=_unb64(obj.get("key")), value=_unb64(obj.get("value")),
        create_revision=int(obj.get("create_revision", 0)), mod_revision=int(obj.get("mod_revision", 0)),
        version=int(obj.get("version", 0)), lease=int(obj.get("lease", 0)),
    )


def _range_body(key: bytes, range_end: bytes | None, limit: int = 0) -> dict[str, Any]:
    body: dict[str, Any] = {"key": _b64(key)}
    if range_end is not None:
        body["range_end"] = _b64(range_end)
    if limit:
        body["limit"] = limit
    return body


def _compare_body(c: Compare) -> dict[str, Any]:
    field = {"VERSION": "version", "CREATE": "create_revision", "MOD": "mod_revision", "VALUE": "value",
             "LEASE": "lease"}[c.target.value]
    operand = _b64(c.operand) if isinstance(c.operand, bytes) else c.operand
    return {"key": _b64(c.key), "target": c.target.value, "result": c.op.value, field: operand}


def _op_body(op: TxnOp) -> dict[str, Any]:
    if isinstance(op, Put):
        body: dict[str, Any] = {"key": _b64(op.key), "value": _b64(op.value)}
        if op.lease:
            body["lease"] = op.lease
        return {"request_put": body}
    if isinstance(op, DeleteRange):
        return {"request_delete_range": _range_body(op.key, op.range_end)}
    return {"request_range": _range_body(op.key, op.range_end, op.limit)}


def _error_of(status: int, payload: bytes, where: str) -> EtcdError:
    try:
        obj = json.loads(payload.split(b"\n", 1)[0])
        # unary answers say "code", errors inside a stream (watch, keep-alive) "grpc_code"
        code = int(obj.get("code", obj.get("grpc_code", 2)))
        message = str(obj.get("message") or obj.get("error") or "")
    except (ValueError, AttributeError):
        code, message = 2, payload[:200].decode("utf-8", "replace")
    text = "etcd at %s: %s (HTTP %d, code %d)" % (where, message, status, code)
    if code in _RETRIABLE_CODES or status in (502, 503, 504):
        return EtcdUnavailable(text)
    if code == _OUT_OF_RANGE and "compacted" in message:
        return EtcdCompacted(0, text)
    if code == _NOT_FOUND and "lease not found" in message:
        return LeaseNotFound(text)
    return EtcdError(text)


def _describe(e: BaseException) -> str:
    if isinstance(e, ConnectionRefusedError):
        return "connection refused"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    if isinstance(e, asyncio.IncompleteReadError):
        return "connection closed mid-answer"
    return str(e) or type(e).__name__


class _Connection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str, index: int) -> None:
        self.reader, self.writer, self.host, self.index = reader, writer, host, index
        self.reused = False

    def send(self, path: str, body: bytes, headers: bytes = b"") -> None:
        self.writer.write(b"POST %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n%s"
                          b"Content-Length: %d\r\n\r\n" % (path.encode(), self.host.encode(), headers, len(body)) + body)

    async def read_head(self) -> tuple[int, dict[str, str]]:
        line = await self.reader.readline()
        if not line:
            raise ConnectionResetError("connection closed by etcd")
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1."):
            raise ConnectionResetError("not an HTTP answer: %r" % line[:80])
        status = int(parts[1])
        headers: dict[str, str] = {}
        for _ in range(_MAX_HEADER_LINES):
            line = await self.reader.readline()
            if line in (b"\r\n", b"\n", b""):
                return status, headers
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        raise ConnectionResetError("too many header lines")

    async def read_chunk(self) -> bytes | None:
        """The next chunk of a chunked body; None at its end (trailers consumed)."""
        size_line = await self.reader.readline()
        if not size_line:
            raise ConnectionResetError("connection closed inside a chunked body")
        size = int(size_line.split(b";", 1)[0].strip() or b"0", 16)
        if size == 0:
            while (await self.reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return None
        data = await self.reader.readexactly(size + 2)
        return data[:-2]

    async def read_body(self, headers: dict[str, str]) -> bytes:
        if "content-length" in headers:
            return await self.reader.readexactly(int(headers["content-length"]))
        if headers.get("transfer-encoding", "").lower() == "chunked":
            parts = []
            while (chunk := await self.read_chunk()) is not None:
                parts.append(chunk)
            return b"".join(parts)
        return await self.reader.read()

    def close(self) -> None:
        self.writer.close()


class HttpEtcd:
    """An etcd client over one or more `http://host:port` endpoints of the same etcd cluster."""

    def __init__(self, endpoints: Sequence[str], *, timeout: float = 5.0, connect_timeout: float = 1.0,
                 watch_idle_timeout: float = 5.0) -> None:
        if not endpoints:
            raise ValueError("no etcd endpoint given")
        self._urls = [e.strip().rstrip("/") for e in endpoints]
        self._addresses: list[tuple[str, int]] = []
        for url in self._urls:
            parts = urlsplit(url if "://" in url else "http://" + url)
            if parts.scheme != "http" or not parts.hostname:
                raise ValueError("etcd endpoint %r: expected http://host:port" % url)
            self._addresses.append((parts.hostname, parts.port or 2379))
        self.endpoint_description = ",".join(self._urls)
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.watch_idle_timeout = watch_idle_timeout
        self._current = 0
        self._idle: dict[int, list[_Connection]] = {i: [] for i in range(len(self._urls))}
        self._watch_connections: set[_Connection] = set()
        self.resolver = Resolver()

    # transport --------------------------------------------------------------------------------
    async def _open(self, index: int) -> _Connection:
        host, port = self._addresses[index]
        reader, writer = await within(self.connect_timeout,
                                      self.resolver.open_connection(host, port, self.connect_timeout))
        return _Connection(reader, writer, "%s:%d" % (host, port), index)

    def _failed(self, index: int) -> None:
        if self._current == index:
            self._current = (index + 1) % len(self._urls)
        for conn in self._idle[index]:
            conn.close()
        self._idle[index].clear()

    async def _call(self, path: str, body: dict[str, Any], timeout: float | None = None) -> dict[str, Any]:
        data = json.dumps(body, separators=(",", ":")).encode()
        reasons = []
        for _ in range(len(self._urls)):
            index = self._current
            url = self._urls[index]
            idle = self._idle[index]
            conn = idle.pop() if idle else None
            if conn is None:
                try:
                    conn = await self._open(index)
                except (TimeoutError, OSError) as e:
                    reasons.append("%s: %s" % (url, _describe(e)))
                    self._failed(index)
                    continue  # nothing was sent: the next endpoint may take it
            try:
                status, payload = await within(timeout or self.timeout, self._roundtrip(conn, path, data))
            except _StaleConnection:
                conn.close()
                try:
                    conn = await self._open(index)
                    status, payload = await within(timeout or self.timeout, self._roundtrip(conn, path, data))
                except (TimeoutError, OSError, asyncio.IncompleteReadError, _StaleConnection) as e:
                    conn.close()
                    self._failed(index)
                    raise EtcdUnavailable("etcd at %s did not answer %s: %s" % (url, path, _describe(e))) from e
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
                conn.close()
                self._failed(index)
                raise EtcdUnavailable("etcd at %s did not answer %s: %s" % (url, path, _describe(e))) from e
            if status != 200:
                error = _error_of(status, payload, url)
                if isinstance(error, EtcdUnavailable):
                    self._failed(index)
                raise error
            result: dict[str, Any] = json.loads(payload.split(b"\n", 1)[0])
            return result
        raise EtcdUnavailable("etcd is unreachable (%s)" % "; ".join(reasons))

    async def _roundtrip(self, conn: _Connection, path: str, data: bytes) -> tuple[int, bytes]:
        conn.send(path, data)
        try:
            status, headers = await conn.read_head()
        except (ConnectionResetError, BrokenPipeError, asyncio.IncompleteReadError) as e:
            if conn.reused:  # closed while idle in the pool: the request was not taken
                raise _StaleConnection(str(e)) from e
            raise
        payload = await conn.read_body(headers)
        if headers.get("connection", "").lower() == "close":
            conn.close()
        else:
            conn.reused = True
            self._idle[conn.index].append(conn)
        return status, payload

    # Etcd -------------------------------------------------------------------------------------
    async def check(self) -> None:
        await self._call("/v3/maintenance/status", {})

    async def get(self, key: bytes) -> KeyValue | None:
        result = await self.range(key)
        return result.kvs[0] if result.kvs else None

    async def range(self, key: bytes, range_end: bytes | None = None, *, limit: int = 0, revision: int = 0,
                    descending: bool = False) -> RangeResult:
        body = _range_body(key, range_end, limit)
        if revision:
            body["revision"] = revision
        if descending:
            body["sort_order"] = "DESCEND"
            body["sort_target"] = "KEY"
        result = await self._call("/v3/kv/range", body)
        return RangeResult([_kv(kv) for kv in result.get("kvs", [])], int(result["header"]["revision"]),
                           bool(result.get("more", False)))

    async def put(self, key: bytes, value: bytes, lease: int = 0) -> int:
        result = await self._call("/v3/kv/put", _op_body(Put(key, value, lease))["request_put"])
        return int(result["header"]["revision"])

    async def delete_range(self, key: bytes, range_end: bytes | None = None) -> int:
        result = await self._call("/v3/kv/deleterange", _range_body(key, range_end))
        return int(result.get("deleted", 0))

    async def txn(self, compares: Sequence[Compare], success: Sequence[TxnOp],
                  failure: Sequence[TxnOp] = ()) -> TxnResult:
        result = await self._call("/v3/kv/txn", {
            "compare": [_compare_body(c) for c in compares],
            "success": [_op_body(op) for op in success],
            "failure": [_op_body(op) for op in failure],
        })
        responses: list[list[KeyValue] | int | None] = []
        for response in result.get("responses", []):
            if "response_range" in response:
                responses.append([_kv(kv) for kv in response["response_range"].get("kvs", [])])
            elif "response_delete_range" in response:
                responses.append(int(response["response_delete_range"].get("deleted", 0)))
            else:
                responses.append(None)
        return TxnResult(bool(result.get("succeeded", False)), int(result["header"]["revision"]), responses)

    async def grant_lease(self, ttl_seconds: int) -> int:
        result = await self._call("/v3/lease/grant", {"TTL": ttl_seconds})
        if result.get("error"):
            raise EtcdError("etcd refused a lease: %s" % result["error"])
        return int(result["ID"])

    async def keep_alive(self, lease_id: int, timeout: float | None = None) -> int:
        # one request on the keep-alive stream; the answer's TTL is 0 (absent) once the lease is gone
        result = await self._call("/v3/lease/keepalive", {"ID": lease_id}, timeout)
        if "error" in result:
            raise _error_of(500, json.dumps(result["error"]).encode(), self._urls[self._current])
        ttl = int(result.get("result", {}).get("TTL", 0))
        if ttl <= 0:
            raise LeaseNotFound("lease %x expired" % lease_id)
        return ttl

    async def revoke_lease(self, lease_id: int) -> None:
        try:
            await self._call("/v3/lease/revoke", {"ID": lease_id})
        except LeaseNotFound:
            pass

    async def compact(self, revision: int) -> None:
        try:
            await self._call("/v3/kv/compaction", {"revision": revision})
        except EtcdCompacted:
            pass  # already compacted at or past it

    async def watch(self, key: bytes, range_end: bytes | None = None, start_revision: int = 0) -> AsyncIterator[WatchBatch]:
        index = self._current
        url = self._urls[index]
        create: dict[str, Any] = _range_body(key, range_end)
        if start_revision:
            create["start_revision"] = start_revision
        data = json.dumps({"create_request": create}).encode()
        try:
            conn = await self._open(index)
        except (TimeoutError, OSError) as e:
            self._failed(index)
            raise EtcdUnavailable("etcd at %s is unreachable for a watch: %s" % (url, _describe(e))) from e
        self._watch_connections.add(conn)
        try:
            conn.send("/v3/watch", data, b"Grpc-Metadata-hasleader: true\r\n")
            try:
                status, headers = await within(self.timeout, conn.read_head())
                if status != 200:
                    raise _error_of(status, await conn.read_body(headers), url)
                pending = b""
                while True:
                    chunk = await self._read_watch_chunk(conn, index)
                    if chunk is None:
                        if pending.strip():  # a last message without its newline: the gateway's error
                            yield self._watch_message(json.loads(pending), url)
                        raise EtcdUnavailable("etcd at %s ended the watch" % url)
                    pending += chunk
                    while b"\n" in pending:
                        line, pending = pending.split(b"\n", 1)
                        if line.strip():
                            yield self._watch_message(json.loads(line), url)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, ValueError) as e:
                self._failed(index)
                raise EtcdUnavailable("etcd at %s: watch broken: %s" % (url, _describe(e))) from e
        finally:
            self._watch_connections.discard(conn)
            conn.close()

    async def _read_watch_chunk(self, conn: _Connection, index: int) -> bytes | None:
        while True:
            try:
                return await within(self.watch_idle_timeout, conn.read_chunk())
            except TimeoutError:
                # quiet: a healthy member answers a status request (asked on another connection)
                probe = await self._open(index)
                try:
                    probe.send("/v3/maintenance/status", b"{}")
                    status, headers = await within(self.timeout, probe.read_head())
                    await within(self.timeout, probe.read_body(headers))
                finally:
                    probe.close()
                if status != 200:
                    raise EtcdUnavailable("etcd at %s does not answer (HTTP %d)" % (self._urls[index], status)) from None

    @staticmethod
    def _watch_message(message: dict[str, Any], url: str) -> WatchBatch:
        if "error" in message:
            raise _error_of(500, json.dumps(message["error"]).encode(), url)
        result = message.get("result", {})
        compact_revision = int(result.get("compact_revision", 0))
        if compact_revision:
            raise EtcdCompacted(compact_revision)
        if result.get("canceled"):
            raise EtcdUnavailable("etcd at %s cancelled the watch: %s" % (url, result.get("cancel_reason", "")))
        revision = int(result.get("header", {}).get("revision", 0))
        events = [Event(EventType(e.get("type", "PUT")), _kv(e.get("kv", {}))) for e in result.get("events", [])]
        return WatchBatch(events, revision)  # no events: the watch was created, or a progress notice

    async def close(self) -> None:
        self.resolver.close()
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
            conns.clear()
        for conn in list(self._watch_connections):
            conn.close()


class _StaleConnection(Exception):
    pass
