"""Metrics read from the broker's state when /metrics is scraped (on the event loop, where that
state lives, so nothing is copied or locked while serving):

- kafka_exporter's names and labels, so its dashboards and alerts work unchanged:
  kafka_brokers, kafka_broker_info, kafka_topic_partitions, kafka_topic_partition_current_offset
  (high watermark), kafka_topic_partition_oldest_offset (log start offset), the partition's
  leader / replicas / in-sync replicas, kafka_consumergroup_current_offset (committed offset),
  kafka_consumergroup_lag (last stable offset - committed: what a read_committed consumer can
  still read, the high watermark when no transaction is open; -1 with no committed offset, as
  the exporter does) with their per-topic sums, kafka_consumergroup_members;
- the broker's own: open connections, groups by state and protocol, rebalances begun,
  coordinator queue depth, incremental fetch sessions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from broker.observability.metrics import counter, gauge

if TYPE_CHECKING:
    from prometheus_client.core import Metric


class BrokerStateCollector:
    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def collect(self) -> Iterator[Metric]:
        broker = self.broker
        if broker.metadata is None:  # not started
            return
        yield from self._cluster(broker)
        yield from self._topics(broker)
        yield from self._groups(broker)
        yield from self._coordinators(broker)
        yield gauge("kafka_connections", "Open client connections", value=len(broker.server.connections))
        yield from self._fetch_sessions(broker.fetch_sessions)

    @staticmethod
    def _fetch_sessions(sessions: Any) -> Iterator[Metric]:
        """Kafka's FetchSessionCache metrics (NumIncrementalFetchSessions and the like)."""
        yield gauge("kafka_fetch_sessions", "Incremental fetch sessions kept (KIP-227)", value=len(sessions.sessions))
        yield gauge("kafka_fetch_session_partitions", "Partitions the incremental fetch sessions hold",
                    value=sessions.partitions_cached)
        yield counter("kafka_fetch_session_evictions", "Incremental fetch sessions evicted for another",
                      value=sessions.evictions)

    @staticmethod
    def _cluster(broker: Any) -> Iterator[Metric]:
        nodes = broker.topology.live_brokers(None)
        yield gauge("kafka_brokers", "Number of Brokers in the Kafka Cluster.", value=len(nodes))
        info = gauge("kafka_broker_info", "Information about the Kafka Broker.", ["address", "id"])
        for node_id, host, port in nodes:
            info.add_metric(["%s:%d" % (host, port), str(node_id)], node_id)
        yield info

    @staticmethod
    def _topics(broker: Any) -> Iterator[Metric]:
        partitions = gauge("kafka_topic_partitions", "Number of partitions for this Topic", ["topic"])
        labels = ["topic", "partition"]
        current = gauge("kafka_topic_partition_current_offset", "Current Offset of a Broker at Topic/Partition",
                         labels)
        oldest = gauge("kafka_topic_partition_oldest_offset", "Oldest Offset of a Broker at Topic/Partition", labels)
        leader = gauge("kafka_topic_partition_leader", "Leader Broker ID of this Topic/Partition", labels)
        replicas = gauge("kafka_topic_partition_replicas", "Number of Replicas for this Topic/Partition", labels)
        isr = gauge("kafka_topic_partition_in_sync_replica", "Number of In-Sync Replicas for this Topic/Partition",
                     labels)
        preferred = gauge("kafka_topic_partition_leader_is_preferred",
                           "1 if Topic/Partition is using the Preferred Broker", labels)
        under = gauge("kafka_topic_partition_under_replicated_partition",
                       "1 if Topic/Partition is under Replicated", labels)
        for name, info in sorted(broker.metadata.topics.items()):
            partitions.add_metric([name], info.partitions)
            for index in range(info.partitions):
                partition = broker.partitions.get(name, index)
                if partition is None:
                    continue
                key = [name, str(index)]
                current.add_metric(key, partition.high_watermark)
                oldest.add_metric(key, partition.log_start_offset)
                lead, nodes, in_sync = broker.topology.assignment(name, index)
                leader.add_metric(key, lead)
                replicas.add_metric(key, len(nodes))
                isr.add_metric(key, len(in_sync))
                preferred.add_metric(key, 1 if nodes and nodes[0] == lead else 0)
                under.add_metric(key, 1 if len(in_sync) < len(nodes) else 0)
        yield from (partitions, current, oldest, leader, replicas, isr, preferred, under)

    @staticmethod
    def _groups(broker: Any) -> Iterator[Metric]:
        coordinator = broker.group_coordinator
        if coordinator is None:
            return
        labels = ["consumergroup", "topic", "partition"]
        current = gauge("kafka_consumergroup_current_offset", "Current Offset of a ConsumerGroup at Topic/Partition",
                         labels)
        lag = gauge("kafka_consumergroup_lag", "Current Approximate Lag of a ConsumerGroup at Topic/Partition", labels)
        current_sum = gauge("kafka_consumergroup_current_offset_sum",
                             "Current Offset of a ConsumerGroup at Topic for all partitions", ["consumergroup", "topic"])
        lag_sum = gauge("kafka_consumergroup_lag_sum",
                         "Current Approximate Lag of a ConsumerGroup at Topic for all partitions",
                         ["consumergroup", "topic"])
        members = gauge("kafka_consumergroup_members", "Amount of members in a consumer group", ["consumergroup"])
        by_state: Counter[tuple[str, str]] = Counter()
        rebalances: Counter[str] = Counter()
        for shard in coordinator.loaded_shards():
            rebalances["classic"] += shard.classic.rebalances
            rebalances["consumer"] += shard.consumer_rebalances
            for group_id, group in shard.groups.items():
                by_state[(group.state.value, group.type)] += 1
                members.add_metric([group_id], len(group.members))
            for group_id, topics in shard.offsets.store.by_group.items():
                for topic, offsets in sorted(topics.items()):
                    offset_total = lag_total = 0
                    for index, committed in sorted(offsets.items()):
                        partition = broker.partitions.get(topic, index)
                        key = [group_id, topic, str(index)]
                        current.add_metric(key, committed.committed_offset)
                        offset_total += committed.committed_offset
                        if partition is None or committed.committed_offset < 0:
                            lag.add_metric(key, -1)
                            continue
                        behind = max(partition.last_stable_offset - committed.committed_offset, 0)
                        lag.add_metric(key, behind)
                        lag_total += behind
                    current_sum.add_metric([group_id, topic], offset_total)
                    lag_sum.add_metric([group_id, topic], lag_total)
        yield from (current, lag, current_sum, lag_sum, members)
        groups = gauge("kafka_groups", "Groups by state and protocol", ["state", "protocol"])
        for (state, protocol), count in sorted(by_state.items()):
            groups.add_metric([state, protocol], count)
        yield groups
        begun = counter("kafka_group_rebalances", "Rebalances begun (classic generations, consumer group epochs) "
                        "since the coordinator loaded", labels=["protocol"])
        for protocol, count in sorted(rebalances.items()):
            begun.add_metric([protocol], count)
        yield begun

    @staticmethod
    def _coordinators(broker: Any) -> Iterator[Metric]:
        queued = gauge("kafka_coordinator_queue_size", "Operations waiting in the coordinators' event queues",
                        ["coordinator"])
        for name, coordinator in broker.coordinators():
            runtime = coordinator.runtime
            queued.add_metric([name], sum(runtime.queue_size(p) for p in runtime.active_partitions()))
        yield queued
