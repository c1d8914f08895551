"""The handler registry: one entry per API key, the single source of ApiVersions.

A handler is `async def handler(ctx, request) -> response | None` (None: no response, as for
Produce with acks=0), `ctx` a RequestContext and the request and response typed with the
message classes (protocol/messages.pyi tells their fields). Its versions are the schema's valid
versions unless narrowed here, so ApiVersions can never advertise an API without a handler or a
version without a codec.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from broker.apis.context import RequestContext
from protocol.messages import REQUESTS, MessageBase

# What the server calls: the registry holds handlers of every API, so their request is Any here;
# each handler's own signature names its message classes (and tests/integration/
# test_handler_types.py checks they are the API's).
Handler = Callable[[RequestContext, Any], Coroutine[Any, Any, MessageBase | None]]
H = TypeVar("H", bound=Handler)
# What runs instead of a handler when one is set for its API key (broker.testing's fault
# injection, a simulated cluster's routing): it may call the handler, or answer itself.
Intercept = Callable[[RequestContext, Any, Handler], Coroutine[Any, Any, MessageBase | None]]


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
# Kafka's controller-listener APIs (Envelope, BrokerRegistration, BrokerHeartbeat, ...): served only
# in cluster mode (`KafkaServer.controller_apis`), never listed by ApiVersions
CONTROLLER_APIS: dict[int, Api] = {}


def api(key: int, min_version: int | None = None, max_version: int | None = None,
        controller: bool = False) -> Callable[[H], H]:
    """Register a handler for `key`; the version range defaults to the schema's valid versions.
    The handler is returned as it is, its type with it. `controller`: one of Kafka's controller
    APIs (CONTROLLER_APIS)."""
    codec = REQUESTS[key]
    lo = codec.spec.valid_versions.lo if min_version is None else min_version
    hi = codec.spec.valid_versions.hi if max_version is None else max_version
    if lo not in codec.spec.valid_versions or hi not in codec.spec.valid_versions:
        raise ValueError("versions %d-%d of api %d are not all defined" % (lo, hi, key))

    def register(fn: H) -> H:
        table = CONTROLLER_APIS if controller else APIS
        if key in APIS or key in CONTROLLER_APIS:
            raise ValueError("api %d registered twice" % key)
        table[key] = Api(key, codec.spec.name.removesuffix("Request"), lo, hi, fn)
        return fn

    return register


__all__ = ["APIS", "Api", "Handler", "Intercept", "RequestContext", "api"]
