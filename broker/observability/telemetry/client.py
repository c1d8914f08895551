"""ClientTelemetry: the KIP-714 requests' entry point, joining the manager, the OTLP decoder and
the Prometheus collector of this package."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from broker.observability.telemetry.exporter import TelemetryCollector
from broker.observability.telemetry.manager import (
    ACCEPTED_COMPRESSION_TYPES,
    CACHE_EXPIRY_MS,
    ClientMetricsManager,
    GetAnswer,
    kafka_uuid_string,
)
from broker.observability.telemetry.otlp import OtlpError, decode_metrics_data
from protocol.compression import decompress
from protocol.errors import ErrorCode, KafkaError, ProtocolError


class ClientTelemetry:
    def __init__(self, subscriptions: Callable[[], Mapping[str, Mapping[str, str]]], clock_ms: Callable[[], int],
                 telemetry_max_bytes: int) -> None:
        self.manager = ClientMetricsManager(subscriptions, clock_ms, telemetry_max_bytes)
        self.collector = TelemetryCollector()
        self.clock_ms = clock_ms
        self.accepted_compression_types = ACCEPTED_COMPRESSION_TYPES

    def get_subscriptions(self, instance_id: uuid.UUID, client: dict[str, str]) -> GetAnswer:
        return self.manager.get_subscriptions(instance_id, client)

    def push(self, instance_id: uuid.UUID, client: dict[str, str], subscription_id: int, terminating: bool,
             compression: int, metrics: bytes) -> None:
        """PushTelemetry: checked as Kafka checks it, then decoded and recorded (KafkaError on failure)."""
        inst = self.manager.check_push(instance_id, client, subscription_id, terminating, compression, len(metrics))
        if not metrics:
            return
        try:
            payload = decompress(compression, metrics, self.manager.telemetry_max_bytes * 64) if compression else metrics
            decoded = decode_metrics_data(payload)
        except (ProtocolError, OtlpError) as exc:
            inst.last_error = ErrorCode.INVALID_RECORD
            raise KafkaError(ErrorCode.INVALID_RECORD, "Error exporting client metrics: %s" % exc) from None
        labels = {**inst.attributes, "client_instance_id": kafka_uuid_string(instance_id)}
        keep_ms = max(CACHE_EXPIRY_MS, 3 * inst.push_interval_ms)
        self.collector.record(labels, decoded.points, self.clock_ms(), keep_ms)
