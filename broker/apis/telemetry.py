"""GetTelemetrySubscriptions (key 71) and PushTelemetry (key 72): KIP-714 client metrics.

The client's identity (what subscriptions match on and what its metrics are labelled with) is
Kafka's: the client instance id, the client id of the request header, the software name and
version its ApiVersions request gave, its address and port.
"""

from __future__ import annotations

from broker.apis.context import RequestContext
from broker.apis.registry import api
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError


def client_identity(ctx: RequestContext) -> dict[str, str]:
    name, version = ctx.connection.client_software
    return {
        "client_id": ctx.client_id or "", "client_software_name": name, "client_software_version": version,
        "client_source_address": ctx.client_host, "client_source_port": str(ctx.client_port),
    }


@api(71)
async def handle_get_telemetry_subscriptions(ctx: RequestContext, request: M.GetTelemetrySubscriptionsRequest
                                             ) -> M.GetTelemetrySubscriptionsResponse:
    telemetry = ctx.broker.telemetry
    answer = telemetry.get_subscriptions(request.client_instance_id, client_identity(ctx))
    return M.GetTelemetrySubscriptionsResponse(
        throttle_time_ms=0, error_code=int(answer.error), client_instance_id=answer.instance_id,
        subscription_id=answer.subscription_id,
        accepted_compression_types=list(telemetry.accepted_compression_types) if answer.error == ErrorCode.NONE else [],
        push_interval_ms=answer.push_interval_ms,
        telemetry_max_bytes=telemetry.manager.telemetry_max_bytes if answer.error == ErrorCode.NONE else 0,
        delta_temporality=answer.error == ErrorCode.NONE, requested_metrics=answer.metrics,
    )


@api(72)
async def handle_push_telemetry(ctx: RequestContext, request: M.PushTelemetryRequest) -> M.PushTelemetryResponse:
    try:
        ctx.broker.telemetry.push(request.client_instance_id, client_identity(ctx), request.subscription_id,
                                  request.terminating, request.compression_type, bytes(request.metrics or b""))
    except KafkaError as exc:
        return M.PushTelemetryResponse(throttle_time_ms=0, error_code=int(exc.code))
    return M.PushTelemetryResponse(throttle_time_ms=0, error_code=0)
