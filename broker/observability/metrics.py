"""Prometheus metrics: requests and bytes per API, served on `metrics.port` when set (broker/network/http.py).

The per-request counts are plain numbers that the event loop bumps without a lock (a
prometheus_client Counter takes one on every `inc`); a collector reads them when /metrics is
scraped, on the event loop too. Other parts add collectors of their own to `registry`.

prometheus_client is imported when metrics are first collected (a scrape, or a test reading
them), never by a broker that nobody scrapes: collectors make their metric families with
`counter`, `gauge` and `histogram` below, and `Registry` is any collector's registry.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Protocol

from broker.log.handles import OPEN_FILES
from protocol.messages import API_NAMES

if TYPE_CHECKING:
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric


class Collector(Protocol):
    """What prometheus_client's exposition reads: metric families, made when collected."""

    def collect(self) -> Iterable[Metric]: ...


class Registry:
    """The broker's collectors (prometheus_client's CollectorRegistry without its import, and
    without the name checks it would make at each registration): /metrics passes it to
    prometheus_client's `generate_latest`, which calls `collect()`."""

    def __init__(self) -> None:
        self._collectors: list[Collector] = []
        self._lock = threading.Lock()  # registered from the broker's thread, collected from another's

    def register(self, collector: Collector) -> None:
        with self._lock:
            if collector in self._collectors:
                raise ValueError("collector already registered: %r" % (collector,))
            self._collectors.append(collector)

    def unregister(self, collector: Collector) -> None:
        with self._lock:
            self._collectors.remove(collector)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            collectors = list(self._collectors)
        for collector in collectors:
            yield from collector.collect()


def counter(name: str, doc: str, labels: list[str] | None = None, value: float | None = None
            ) -> CounterMetricFamily:
    from prometheus_client.core import CounterMetricFamily

    return CounterMetricFamily(name, doc, value=value, labels=labels)


def gauge(name: str, doc: str, labels: list[str] | None = None, value: float | None = None) -> GaugeMetricFamily:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, doc, value=value, labels=labels)


def histogram(name: str, doc: str, labels: list[str] | None = None) -> HistogramMetricFamily:
    from prometheus_client.core import HistogramMetricFamily

    return HistogramMetricFamily(name, doc, labels=labels)


class Count:
    """A monotonic count updated from the event loop thread only (`inc` as a Counter's)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


# request latency buckets, in seconds (Prometheus' unit): 100 µs to 10 s
LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
                   5.0, 10.0)
# log flush (fsync) buckets: 100 µs to 5 s
FLUSH_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0)


class Histogram:
    """Observations per bucket, without the lock a prometheus_client Histogram takes per
    observation: updated by one thread (or under the caller's lock), read when scraped."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last one: above every bound (+Inf)
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def add_to(self, family: HistogramMetricFamily, labels: list[str]) -> None:
        from prometheus_client.utils import floatToGoString

        cumulative, buckets = 0, []
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            cumulative += count
            buckets.append((floatToGoString(bound), cumulative))
        family.add_metric(labels, buckets, self.total)


class ApiStats:
    """One API's responses, their bytes and latencies: what the server bumps per request (it
    keeps a reference per API version, so that counting costs no lookup)."""

    __slots__ = ("requests", "bytes_out", "latency")

    def __init__(self) -> None:
        self.requests = 0
        self.bytes_out = 0
        self.latency = Histogram(LATENCY_BUCKETS)  # request to response

    def count(self, size: int) -> None:
        """A response of `size` bytes, counted before it is sent (its latency once it is out)."""
        self.requests += 1
        self.bytes_out += size


class Metrics:
    def __init__(self) -> None:
        self.registry = Registry()
        self.api_names = dict(API_NAMES)
        self.apis = {key: ApiStats() for key in self.api_names}
        self.bytes_in = Count()  # record bytes appended by Produce
        self.sendfile_bytes = Count()  # response bytes sent with os.sendfile (never copied into the process)
        self.sendfile_waits = Count()  # times a sendfile found the socket buffer full
        self.log_flush = Histogram(FLUSH_BUCKETS)  # fsyncs of partition logs (worker threads: under _flush_lock)
        self._flush_lock = threading.Lock()
        self.registry.register(_Collector(self))


    def log_flushed(self, seconds: float) -> None:
        with self._flush_lock:
            self.log_flush.observe(seconds)


class _Collector:
    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        m = self.metrics
        requests = counter("kafka_requests", "Requests answered, per API", labels=["api"])
        bytes_out = counter("kafka_response_bytes", "Response bytes sent, per API", labels=["api"])
        for key, name in m.api_names.items():
            requests.add_metric([name], m.apis[key].requests)
            bytes_out.add_metric([name], m.apis[key].bytes_out)
        yield requests
        yield bytes_out
        yield counter("kafka_produce_bytes", "Record bytes appended by Produce", value=m.bytes_in.value)
        yield counter("kafka_sendfile_bytes", "Fetch response bytes sent with sendfile", value=m.sendfile_bytes.value)
        yield counter(
            "kafka_sendfile_waits", "Times a sendfile waited for room in the socket buffer",
            value=m.sendfile_waits.value,
        )
        latency = histogram("kafka_request_latency_seconds", "Time from a request's arrival to its response, per API",
                            labels=["api"])
        for key, name in m.api_names.items():
            if m.apis[key].requests:
                m.apis[key].latency.add_to(latency, [name])
        yield latency
        flush = histogram("kafka_log_flush_seconds", "Time of partition log flushes (fsync)")
        with m._flush_lock:
            m.log_flush.add_to(flush, [])
        yield flush
        yield gauge("kafka_log_open_files", "Segment and index files held open", value=len(OPEN_FILES))
        yield counter(
            "kafka_log_file_opens", "Segment and index files opened (reopens included)", value=OPEN_FILES.opened
        )
