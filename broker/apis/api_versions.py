"""ApiVersions (key 18): advertises exactly the registered handlers and their versions."""

from __future__ import annotations

from typing import Any

from broker.apis.registry import APIS, api
from protocol.errors import ErrorCode
from protocol.messages import ApiVersionsResponse


def api_versions_body(code: ErrorCode = ErrorCode.NONE) -> Any:
    keys = [
        ApiVersionsResponse.ApiVersion(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(APIS.values(), key=lambda a: a.key)
    ]
    return ApiVersionsResponse(error_code=int(code), api_keys=keys, throttle_time_ms=0)


@api(18)
async def handle_api_versions(ctx: Any, request: Any) -> Any:
    return api_versions_body()
