"""ApiVersions (key 18): the registered handlers and their versions, and the feature levels.

v3+ also carries the features (broker.metadata.features): the ranges this broker supports and the levels
the cluster has finalized, with the offset of the last metadata record as the epoch.
"""

from __future__ import annotations

from broker.apis.context import RequestContext
from broker.apis.registry import APIS, api
from broker.metadata import features
from protocol import messages as M
from protocol.errors import ErrorCode

R = M.ApiVersionsResponse


def api_versions_body(code: ErrorCode = ErrorCode.NONE) -> M.ApiVersionsResponse:
    keys = [
        R.ApiVersion(api_key=a.key, min_version=a.min_version, max_version=a.max_version)
        for a in sorted(APIS.values(), key=lambda a: a.key)
    ]
    return R(error_code=int(code), api_keys=keys, throttle_time_ms=0)


@api(18)
async def handle_api_versions(ctx: RequestContext, request: M.ApiVersionsRequest) -> M.ApiVersionsResponse:
    response = api_versions_body()
    if ctx.api_version >= 3:
        ctx.connection.client_software = (request.client_software_name, request.client_software_version)
        metadata = ctx.broker.metadata
        response.supported_features = [
            R.SupportedFeatureKey(name=name, min_version=lo, max_version=hi)
            for name, lo, hi in features.supported_features(ctx.api_version)
        ]
        response.finalized_features = [
            R.FinalizedFeatureKey(name=name, max_version_level=level, min_version_level=level)
            for name, level in features.finalized_features(metadata.image.features).items()
        ]
        response.finalized_features_epoch = metadata.finalized_features_epoch
    return response
