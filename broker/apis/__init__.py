"""Request handlers, one module per API family, registered by API key in `registry.APIS`."""

from __future__ import annotations

from broker.apis.context import BrokerServices, ClientConnection, RequestContext
from broker.apis.registry import APIS, Api, Handler, Intercept, api
from protocol.errors import ErrorCode
from protocol.messages import RESPONSES, MessageBase


def error_response(api_key: int, request: MessageBase | None, code: ErrorCode, version: int = 0) -> MessageBase | None:
    """A response carrying `code` for a request that failed as a whole, or None if that version of
    the response has no top-level error code (the connection is then closed, as Kafka does)."""
    if api_key == 18:
        from broker.apis.api_versions import api_versions_body

        return api_versions_body(code)
    codec = RESPONSES[api_key]
    field = next((f for f in codec.spec.root.fields if f.attr == "error_code"), None)
    if field is None or version not in field.versions:
        return None
    response = codec.root_class()
    response.error_code = int(code)
    return response


def load_handlers() -> None:
    """Import every handler module so each registers its APIs."""
    from broker.apis import (  # noqa: F401
        acls,
        api_versions,
        cluster,
        config_resources,
        configs,
        consumer_group,
        controller,
        fetch,
        group,
        metadata,
        offsets,
        offsets_lookup,
        produce,
        quotas,
        sasl,
        share,
        share_admin,
        share_state,
        telemetry,
        topics,
        txn,
    )


__all__ = ["APIS", "Api", "BrokerServices", "ClientConnection", "Handler", "Intercept", "RequestContext", "api",
           "error_response", "load_handlers"]
