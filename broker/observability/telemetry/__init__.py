"""Client telemetry (KIP-714): subscriptions served to clients, pushed metrics decoded and exposed.

`ClientTelemetry` joins the three parts: `manager` (subscriptions and client instances, Kafka's
ClientMetricsManager), `otlp` (the pushed OTLP payload) and `exporter` (the Prometheus collector
behind /metrics). The API handlers (broker.apis.telemetry) only adapt requests to it.

Importing the package imports none of them: `ClientTelemetry` (telemetry/client.py) is imported
when first named, as a broker makes it at the first telemetry request, and the handlers of the
CLIENT_METRICS config resources import only `manager`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.observability.telemetry.client import ClientTelemetry
    from broker.observability.telemetry.manager import GetAnswer

__all__ = ["ClientTelemetry", "GetAnswer"]


def __getattr__(name: str) -> Any:
    if name == "ClientTelemetry":
        from broker.observability.telemetry.client import ClientTelemetry

        return ClientTelemetry
    if name == "GetAnswer":
        from broker.observability.telemetry.manager import GetAnswer

        return GetAnswer
    raise AttributeError(name)
