"""APIs a Kafka broker forwards to its controller; this single node is its own controller.

UpdateFeatures (key 57) changes finalized feature levels (broker.features), all or nothing as
Kafka's FeatureControlManager: the first failing update is the top-level error and nothing
changes. v0-1 list a result per feature on success; v2 has only the top-level error.
"""

from __future__ import annotations

from typing import Any

from broker import features
from broker.apis.registry import api
from protocol.errors import KafkaError
from protocol.messages import UpdateFeaturesResponse

UF = UpdateFeaturesResponse


@api(57)
async def handle_update_features(ctx: Any, request: Any) -> Any:
    updates = []
    for u in request.feature_updates:
        if ctx.api_version == 0:
            upgrade_type = features.SAFE_DOWNGRADE if u.allow_downgrade else features.UPGRADE
        else:
            upgrade_type = u.upgrade_type
        updates.append((u.feature, u.max_version_level, upgrade_type))
    validate_only = ctx.api_version >= 1 and request.validate_only
    try:
        ctx.broker.metadata.update_features(updates, validate_only, ctx.broker.config.static_min_insync_replicas)
    except KafkaError as exc:
        return UF(throttle_time_ms=0, error_code=int(exc.code), error_message=exc.message, results=[])
    if not validate_only:
        ctx.broker.apply_dynamic_configs()  # enabling ELR may have moved min.insync.replicas
    results = [UF.UpdatableFeatureResult(feature=name, error_code=0, error_message=None) for name, _, _ in updates]
    return UF(throttle_time_ms=0, error_code=0, error_message=None, results=results)
