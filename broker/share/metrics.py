"""Share group metrics for /metrics (a collector the broker registers in broker/observability/metrics.py's registry).

Read when /metrics is scraped, on the event loop like everything they read:

- (share groups by state are kafka_groups{protocol="share"}, members kafka_consumergroup_members:
  broker/observability/state_metrics.py)
- kafka_share_sessions: open share sessions;
- kafka_share_records_*_total: records acquired, redelivered (acquired again), acknowledged
  (ACCEPT), released, rejected, whose acquisition lock expired, archived, written to a dead-letter
  topic, and archived without reaching it;
- per loaded share-partition (group, topic, partition): kafka_share_in_flight_records (between the
  start offset and the last offset acquired), kafka_share_start_offset and kafka_share_lag (log end
  - start offset - records already delivered above the start offset, as DescribeShareGroupOffsets).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from broker.observability.metrics import counter, gauge
from broker.share.manager import SharePartitionManager

if TYPE_CHECKING:
    from prometheus_client.core import Metric

_COUNTERS = [
    ("acquired", "Records handed out to share group members"),
    ("redelivered", "Records handed out again (after a release, a lock expiry or a restart)"),
    ("acknowledged", "Records acknowledged with ACCEPT"),
    ("released", "Records released by their member"),
    ("rejected", "Records rejected by their member"),
    ("lock_expired", "Records whose acquisition lock expired"),
    ("archived", "Records archived: rejected or out of deliveries"),
    ("dead_lettered", "Records written to a share group's dead-letter topic"),
    ("dead_letter_failed", "Records archived without reaching their dead-letter topic"),
]


class ShareMetricsCollector:
    def __init__(self, manager: SharePartitionManager, topic_name: Callable[[uuid.UUID], str | None]) -> None:
        self.manager = manager
        self.topic_name = topic_name

    def collect(self) -> Iterator[Metric]:
        yield gauge("kafka_share_sessions", "Open share sessions", value=len(self.manager.sessions))
        m = self.manager.metrics
        for name, doc in _COUNTERS:
            yield counter("kafka_share_records_" + name, doc, value=getattr(m, name))
        labels = ["group", "topic", "partition"]
        in_flight = gauge("kafka_share_in_flight_records", "Records in flight per share-partition", labels=labels)
        start = gauge("kafka_share_start_offset", "Share-partition start offset", labels=labels)
        lag = gauge("kafka_share_lag", "Records not yet delivered per share-partition", labels=labels)
        for (group_id, topic_id, index), entry in list(self.manager.entries.items()):
            topic = self.topic_name(topic_id)
            if topic is None or entry.ready is None or not entry.ready.done() or entry.ready.exception() is not None:
                continue
            key = [group_id, topic, str(index)]
            engine = entry.engine
            in_flight.add_metric(key, engine.in_flight_count())
            start.add_metric(key, engine.start_offset)
            lag.add_metric(key, max(0, entry.partition.high_watermark - engine.start_offset
                                    - engine.delivery_complete_count()))
        yield in_flight
        yield start
        yield lag
