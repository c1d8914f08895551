"""The handler registry: one entry per API key, the single source of ApiVersions.

A handler is `async def handler(ctx, request) -> response | None` (None: no response, as for
Produce with acks=0), `ctx` a RequestContext and the request and response typed with the
message classes (protocol/messages.pyi tells their fields). Its versions are the schema's valid
versions unless narrowed here, so ApiVersions can never advertise an API without a handler or a
version without a codec.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from protocol.messages import REQUESTS

Handler = Callable[[Any, Any], Awaitable[Any]]


@dataclass(slots=True)
class RequestContext:
    """What a handler knows about the request beyond its body."""

    broker: Any  # broker.app.Broker (a layer above the handlers)
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    client_host: str
    client_port: int
    connection: Any  # broker.network.server.Connection
    received: float = field(default_factory=time.monotonic)

    def release_on_next_request(self, release: Callable[[], None]) -> None:
        """The handler holds its response back (a long-polled heartbeat): `release` is called,
        once, when the connection has another request waiting behind it, closes, or the broker
        stops, so that nothing waits behind a held response."""
        self.connection.hold(release)


@dataclass(frozen=True)
class Api:
    key: int
    name: str
    min_version: int
    max_version: int
    handler: Handler

    def supports(self, version: int) -> bool:
        return self.min_version <= version <= self.max_version


APIS: dict[int, Api] = {}


def api(key: int, min_version: int | None = None, max_version: int | None = None) -> Callable[[Handler], Handler]:
    """Register a handler for `key`; the version range defaults to the schema's valid versions."""
    codec = REQUESTS[key]
    lo = codec.spec.valid_versions.lo if min_version is None else min_version
    hi = codec.spec.valid_versions.hi if max_version is None else max_version
    if lo not in codec.spec.valid_versions or hi not in codec.spec.valid_versions:
        raise ValueError("versions %d-%d of api %d are not all defined" % (lo, hi, key))

    def register(fn: Handler) -> Handler:
        if key in APIS:
            raise ValueError("api %d registered twice" % key)
        APIS[key] = Api(key, codec.spec.name.removesuffix("Request"), lo, hi, fn)
        return fn

    return register
