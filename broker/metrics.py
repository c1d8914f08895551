"""Prometheus metrics: requests and bytes per API, served on `metrics.port` when set (broker/http_endpoint.py).

The per-request counts are plain numbers that the event loop bumps without a lock (a
prometheus_client Counter takes one on every `inc`); a collector reads them when /metrics is
scraped, on the event loop too. Other parts add collectors of their own to `registry`.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Gauge
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from protocol.messages import REQUESTS


class Count:
    """A monotonic count updated from the event loop thread only (`inc` as a Counter's)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.api_names = {key: c.spec.name.removesuffix("Request") for key, c in REQUESTS.items()}
        self.requests = dict.fromkeys(self.api_names, 0)  # responses sent, per API key
        self.bytes_out = dict.fromkeys(self.api_names, 0)  # their bytes, per API key
        self.bytes_in = Count()  # record bytes appended by Produce
        self.sendfile_bytes = Count()  # response bytes sent with os.sendfile (never copied into the process)
        self.sendfile_waits = Count()  # times a sendfile found the socket buffer full
        self.connections = Gauge("kafka_connections", "Open client connections", registry=self.registry)
        self.registry.register(_Collector(self))

    def response_sent(self, api_key: int, size: int) -> None:
        requests = self.requests
        if api_key in requests:
            requests[api_key] += 1
            self.bytes_out[api_key] += size


class _Collector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        requests = CounterMetricFamily("kafka_requests", "Requests answered, per API", labels=["api"])
        bytes_out = CounterMetricFamily("kafka_response_bytes", "Response bytes sent, per API", labels=["api"])
        for key, name in m.api_names.items():
            requests.add_metric([name], m.requests[key])
            bytes_out.add_metric([name], m.bytes_out[key])
        yield requests
        yield bytes_out
        yield CounterMetricFamily("kafka_produce_bytes", "Record bytes appended by Produce", value=m.bytes_in.value)
        yield CounterMetricFamily(
            "kafka_sendfile_bytes", "Fetch response bytes sent with sendfile", value=m.sendfile_bytes.value
        )
        yield CounterMetricFamily(
            "kafka_sendfile_waits", "Times a sendfile waited for room in the socket buffer",
            value=m.sendfile_waits.value,
        )
