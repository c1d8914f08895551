"""Pushed client metrics on the broker's /metrics: Kafka needs a ClientTelemetryReceiver plugin for
this step; here it is built in.

Each pushed point becomes a Prometheus sample named after the OTLP metric (`.` and other characters
Prometheus does not allow become `_`), labelled with the client's identity (client_instance_id,
client_id, client_software_name, client_software_version, client_source_address,
client_source_port) and the point's own attributes. Gauges keep their last value; sums pushed as
deltas (the temporality the broker asks for) are added up, cumulative ones replace. A client's
series go when it says it is terminating or stops pushing for three push intervals (at least a
minute), and the collector holds a bounded number of series.

Updates come from the event loop, scrapes from the HTTP server's thread: one lock guards the table.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from broker.observability.metrics import counter, gauge
from broker.observability.telemetry.otlp import DELTA, SUM, Point

if TYPE_CHECKING:
    from prometheus_client.core import Metric

CLIENT_LABELS = ("client_instance_id", "client_id", "client_software_name", "client_software_version",
                 "client_source_address", "client_source_port")
MAX_SERIES = 50_000
_NOT_ALLOWED = re.compile(r"[^a-zA-Z0-9_:]")


def prometheus_name(name: str) -> str:
    text = _NOT_ALLOWED.sub("_", name)
    return "_" + text if text[:1].isdigit() else text


SeriesKey = tuple[str, tuple[tuple[str, str], ...]]  # (metric name, point attributes)


@dataclass
class ClientSeries:
    labels: dict[str, str]
    expires_ms: int
    values: dict[SeriesKey, tuple[str, bool, float]] = field(default_factory=dict)  # -> (kind, monotonic, value)


class TelemetryCollector:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._clients: dict[str, ClientSeries] = {}
        self.points_received = 0

    def record(self, client: dict[str, str], points: list[Point], now_ms: int, keep_ms: int) -> None:
        instance = client.get("client_instance_id", "")
        with self._lock:
            self._expire(now_ms)
            series = self._clients.get(instance)
            if series is None:
                series = self._clients[instance] = ClientSeries({k: client.get(k, "") for k in CLIENT_LABELS}, 0)
            series.expires_ms = now_ms + keep_ms
            budget = MAX_SERIES - sum(len(s.values) for s in self._clients.values())
            for p in points:
                key = (p.name, p.attributes)
                old = series.values.get(key)
                if old is None:
                    if budget <= 0:
                        continue
                    budget -= 1
                value = p.value
                if p.kind == SUM and p.temporality == DELTA and old is not None:
                    value += old[2]
                series.values[key] = (p.kind, p.kind == SUM and p.monotonic, value)
            self.points_received += len(points)

    def forget(self, instance: str) -> None:
        with self._lock:
            self._clients.pop(instance, None)

    def _expire(self, now_ms: int) -> None:
        for key in [k for k, s in self._clients.items() if s.expires_ms < now_ms]:
            del self._clients[key]

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            rows = [(s.labels, dict(s.values)) for s in self._clients.values()]
        # one family per metric name: its labels are the client's plus every attribute it was pushed with
        samples: dict[str, list[tuple[dict[str, str], bool, float]]] = {}
        for labels, values in rows:
            for (name, attributes), (_, monotonic, value) in sorted(values.items()):
                point_labels = dict(labels)
                for k, v in attributes:
                    point_labels.setdefault(prometheus_name(k), v)
                samples.setdefault(name, []).append((point_labels, monotonic, value))
        for name, points in sorted(samples.items()):
            label_names = list(CLIENT_LABELS) + sorted({k for lb, _, _ in points for k in lb} - set(CLIENT_LABELS))
            doc = "Client metric %s pushed with KIP-714 telemetry" % name
            family: Metric
            if all(monotonic for _, monotonic, _ in points):
                family = counter(prometheus_name(name), doc, labels=label_names)
            else:
                family = gauge(prometheus_name(name), doc, labels=label_names)
            for lb, _, value in points:
                family.add_metric([lb.get(k, "") for k in label_names], value)  # type: ignore[attr-defined]
            yield family
