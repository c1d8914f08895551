"""Request handlers, one module per API family, registered by API key in `registry.APIS`."""

from __future__ import annotations

from typing import Any

from broker.apis.registry import APIS, Api, api
from protocol.errors import ErrorCode
from protocol.messages import RESPONSES


def error_response(api_key: int, request: Any, code: ErrorCode, version: int = 0) -> Any:
    """A response carrying `code` for a request that failed as a whole, or None if the response
    has no top-level error code (the connection is then closed, as Kafka does for such failures)."""
    if api_key == 18:
        from broker.apis.api_versions import api_versions_body

        return api_versions_body(code)
    cls: Any = RESPONSES[api_key].root_class
    response = cls()
    if "error_code" not in cls.FIELDS:
        return None
    response.error_code = int(code)
    return response


def load_handlers() -> None:
    """Import every handler module so each registers its APIs."""
    from broker.apis import (  # noqa: F401
        api_versions,
        cluster,
        configs,
        fetch,
        group,
        metadata,
        offsets,
        offsets_lookup,
        produce,
        topics,
    )


__all__ = ["APIS", "Api", "api", "error_response", "load_handlers"]
