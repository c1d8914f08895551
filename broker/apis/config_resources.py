"""ListConfigResources (key 74) and the CLIENT_METRICS config resources (type 16, KIP-714).

ListConfigResources lists, per resource type asked (v0: client metrics only; v1: topics, brokers,
broker loggers, client metrics and groups, all of them when the list is empty), the resources
that exist, in KafkaApis' order: groups, client metrics, broker loggers, brokers, topics. A type
the version does not know makes the whole request UNSUPPORTED_VERSION.

A client metrics subscription exists while it has configs; DescribeConfigs shows what is set
(source CLIENT_METRICS_CONFIG), Alter/IncrementalAlterConfigs validate the whole new set as
ClientMetricsConfigs does and store it in the metadata log.
"""

from __future__ import annotations

from collections.abc import Mapping

from broker.apis.context import BrokerServices, RequestContext
from broker.apis.registry import api
from broker.metadata import RESOURCE_BROKER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP, RESOURCE_TOPIC
from broker.observability.telemetry.manager import MATCH, METRICS, validate_subscription
from broker.security.authz import Op, authorize_cluster
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

RESOURCE_BROKER_LOGGER = 8
CLIENT_METRICS_CONFIG = 7  # DescribeConfigsResponse.ConfigSource
V1_TYPES = (RESOURCE_TOPIC, RESOURCE_BROKER, RESOURCE_BROKER_LOGGER, RESOURCE_CLIENT_METRICS, RESOURCE_GROUP)

D = M.DescribeConfigsResponse
LC = M.ListConfigResourcesResponse


def describe_client_metrics(broker: BrokerServices, name: str, keys: list[str] | None) -> D.DescribeConfigsResult:
    if not name:
        raise KafkaError(ErrorCode.INVALID_REQUEST, "Client metrics subscription name must not be empty")
    configs = broker.metadata.image.resource_configs[RESOURCE_CLIENT_METRICS].get(name, {})
    return D.DescribeConfigsResult(configs=[
        D.DescribeConfigsResourceResult(name=k, value=v, read_only=False, config_source=CLIENT_METRICS_CONFIG,
                                        is_sensitive=False, synonyms=[], config_type=7 if k in (METRICS, MATCH) else 3)
        for k, v in sorted(configs.items()) if not keys or k in keys
    ])


def client_metrics_list_type(name: str) -> bool:
    return name in (METRICS, MATCH)


def current_client_metrics(broker: BrokerServices, name: str) -> dict[str, str]:
    return dict(broker.metadata.image.resource_configs[RESOURCE_CLIENT_METRICS].get(name, {}))


def alter_client_metrics(broker: BrokerServices, name: str, new_configs: Mapping[str, str], changes: dict[str, str | None],
                         validate_only: bool) -> None:
    validate_subscription(name, new_configs)
    if not validate_only and changes:
        broker.metadata.set_configs(RESOURCE_CLIENT_METRICS, name, changes)


@api(74)
async def handle_list_config_resources(ctx: RequestContext, request: M.ListConfigResourcesRequest
                                       ) -> M.ListConfigResourcesResponse:
    broker = ctx.broker
    if not authorize_cluster(ctx, Op.DESCRIBE_CONFIGS):
        return LC(throttle_time_ms=0, error_code=int(ErrorCode.CLUSTER_AUTHORIZATION_FAILED), config_resources=[])
    supported = V1_TYPES if ctx.api_version >= 1 else (RESOURCE_CLIENT_METRICS,)
    asked = list(request.resource_types) if ctx.api_version >= 1 and request.resource_types else list(supported)
    if any(t not in supported for t in asked):
        return LC(throttle_time_ms=0, error_code=int(ErrorCode.UNSUPPORTED_VERSION), config_resources=[])
    image = broker.metadata.image
    found: list[tuple[int, str]] = []
    if RESOURCE_GROUP in asked:
        found += [(RESOURCE_GROUP, g) for g in image.resource_configs[RESOURCE_GROUP]]
    if RESOURCE_CLIENT_METRICS in asked:
        found += [(RESOURCE_CLIENT_METRICS, s) for s in image.resource_configs[RESOURCE_CLIENT_METRICS]]
    for rtype in (RESOURCE_BROKER_LOGGER, RESOURCE_BROKER):
        if rtype in asked:
            found.append((rtype, str(broker.node_id)))
    if RESOURCE_TOPIC in asked:
        found += [(RESOURCE_TOPIC, t) for t in broker.metadata.topics]
    return LC(throttle_time_ms=0, error_code=0,
              config_resources=[LC.ConfigResource(resource_name=n, resource_type=t) for t, n in found])
