"""The broker's HTTP endpoint on `metrics.port`: Prometheus metrics and the fault-injection door.

    GET    /metrics   Prometheus text format
    GET    /faults    the armed faults and the counts of those injected (JSON)
    POST   /faults    arm a fault or change the simulated cluster: a JSON object (or a list of
                      them) as Faults.apply takes
    DELETE /faults    disarm every fault

It runs on the broker's event loop (a scrape reads the broker's state where it lives, without
locks) and answers one request per connection. Bounded: a request line and headers up to 64 KiB,
a body up to 1 MiB, 10 s to send them.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from broker.observability.logger import get_logger

log = get_logger("broker.http")

MAX_HEAD = 64 * 1024
MAX_BODY = 1024 * 1024
READ_TIMEOUT_S = 10.0
REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
           413: "Payload Too Large", 500: "Internal Server Error"}


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class HttpEndpoint:
    def __init__(self, broker: Any) -> None:
        self.broker = broker
        self._server: asyncio.base_events.Server | None = None
        self.port = 0

    async def start(self, host: str, port: int) -> int:
        self._server = await asyncio.start_server(self._serve, host or None, port, reuse_address=True)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                method, path, body = await asyncio.wait_for(_read_request(reader), READ_TIMEOUT_S)
                status, content_type, payload = await self._answer(method, path, body)
            except HttpError as exc:
                status, content_type, payload = exc.status, "application/json", _json({"error": str(exc)})
            writer.write(b"HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % (
                status, REASONS.get(status, "").encode(), content_type.encode(), len(payload)))
            writer.write(payload)
            await writer.drain()
        except (TimeoutError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away or was too slow: nothing to answer
        finally:
            writer.close()

    async def _answer(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        try:
            return await self._route(method, path, body)
        except HttpError:
            raise
        except Exception as exc:  # a broker bug: answered and logged, the endpoint stays up
            log.exception("http request failed", method=method, path=path)
            return 500, "application/json", _json({"error": repr(exc)})

    async def _route(self, method: str, path: str, body: bytes) -> tuple[int, str, bytes]:
        path = path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/metrics":
            if method != "GET":
                raise HttpError(405, "GET /metrics")
            return 200, CONTENT_TYPE_LATEST, generate_latest(self.broker.metrics.registry)
        if path == "/faults":
            return await self._faults(method, body)
        raise HttpError(404, "no such path: %s (there are /metrics and /faults)" % path)

    async def _faults(self, method: str, body: bytes) -> tuple[int, str, bytes]:
        faults = self.broker.faults
        if method == "GET":
            injected = [{"api": api, "action": action, "error": error, "count": n}
                        for (api, action, error), n in sorted(faults.injected.items())]
            return 200, "application/json", _json({"armed": faults.armed, "injected": injected})
        if method == "DELETE":
            count = len(faults.armed)
            faults.clear()
            return 200, "application/json", _json({"cleared": count})
        if method != "POST":
            raise HttpError(405, "GET, POST or DELETE /faults")
        try:
            spec = json.loads(body or b"null")
        except ValueError as exc:
            raise HttpError(400, "the body is not JSON: %s" % exc) from None
        specs = spec if isinstance(spec, list) else [spec]
        if not specs or not all(isinstance(s, dict) for s in specs):
            raise HttpError(400, 'expected a JSON object such as {"api": "Produce", "error": "NOT_LEADER_OR_FOLLOWER"}')
        armed = []
        for s in specs:
            try:
                armed.append(await faults.apply(s))
            except (ValueError, TypeError, KeyError) as exc:
                raise HttpError(400, str(exc)) from None
        return 201, "application/json", _json({"armed": armed if isinstance(spec, list) else armed[0]})


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    if len(head) > MAX_HEAD:
        raise HttpError(413, "request head too large")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split()
    if len(parts) != 3:
        raise HttpError(400, "malformed request line")
    length = 0
    for line in lines[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            try:
                length = int(value.strip())
            except ValueError:
                raise HttpError(400, "malformed Content-Length") from None
    if length < 0 or length > MAX_BODY:
        raise HttpError(413, "body too large")
    body = await reader.readexactly(length) if length else b""
    return parts[0].upper(), parts[1], body


def _json(value: Any) -> bytes:
    return json.dumps(value).encode() + b"\n"
