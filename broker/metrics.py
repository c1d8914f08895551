"""Prometheus metrics: requests and bytes per API, served on `metrics.port` when set."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server

from protocol.messages import REQUESTS


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("kafka_requests", "Requests answered, per API", ["api"], registry=self.registry)
        self.bytes_out = Counter("kafka_response_bytes", "Response bytes sent, per API", ["api"], registry=self.registry)
        self.bytes_in = Counter("kafka_produce_bytes", "Record bytes appended by Produce", registry=self.registry)
        self.connections = Gauge("kafka_connections", "Open client connections", registry=self.registry)
        # label children resolved once: a labels() lookup per request would cost more than the count
        self._per_api = {
            key: (self.requests.labels(c.spec.name.removesuffix("Request")), self.bytes_out.labels(c.spec.name.removesuffix("Request")))
            for key, c in REQUESTS.items()
        }

    def response_sent(self, api_key: int, size: int) -> None:
        pair = self._per_api.get(api_key)
        if pair is not None:
            pair[0].inc()
            pair[1].inc(size)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        start_http_server(port, addr=host, registry=self.registry)
