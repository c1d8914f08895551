"""Replication throttles (KIP-73): Kafka's ReplicationQuotaManager, for the leader's and the
follower's side of replication.

Which replicas are throttled is a topic config: `leader.replication.throttled.replicas` and
`follower.replication.throttled.replicas`, each `*` (every partition) or a list of
`partition:broker` pairs of which a broker takes the pairs naming it (kafka-reassign-partitions
--throttle puts the current replicas in the leader list and the joining ones in the follower
list). How fast they may go is a dynamic broker config, per broker or cluster-wide:
`leader.replication.throttled.rate` and `follower.replication.throttled.rate` (bytes per second,
unbounded by default), measured as Kafka's SimpleRate over `replication.quota.window.num`
samples of `replication.quota.window.size.seconds` (11 x 1 s).

Once the rate of a side is over its bound, the leader answers a follower's fetch of a throttled
partition with no records when that follower is out of the ISR (ReplicaManager's
shouldLeaderThrottle), and a follower leaves out of its fetches the throttled partitions it has
not caught up on (the fetcher's shouldFollowerThrottle). Every byte replicated for a throttled
partition counts, in sync or not, so the bound is on the throttled traffic as a whole. Replicas
in sync are never held back: throttling cannot shrink an ISR.

With no rate set a side is inactive, and the fetch path pays one attribute read.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import lru_cache

from broker.metadata.dynamic_config import (
    FOLLOWER_REPLICATION_THROTTLED_RATE,
    LEADER_REPLICATION_THROTTLED_RATE,
)
from broker.security.quotas import Rate

LEADER_REPLICAS = "leader.replication.throttled.replicas"
FOLLOWER_REPLICAS = "follower.replication.throttled.replicas"
UNBOUNDED = 2**63 - 1  # QuotaConfig.QUOTA_BYTES_PER_SECOND_DEFAULT (Long.MAX_VALUE)
ALL_PARTITIONS = None  # "*"


@lru_cache(maxsize=1024)
def throttled_partitions(value: str, broker_id: int) -> frozenset[int] | None:
    """The partitions `value` throttles on `broker_id` (ConfigHandler.parseThrottledPartitions):
    ALL_PARTITIONS for `*`, else the partitions of the pairs naming this broker."""
    value = value.strip()
    if value == "*":
        return ALL_PARTITIONS
    partitions = set()
    for pair in value.split(","):
        if ":" in pair:
            partition, broker = pair.split(":", 1)
            if int(broker) == broker_id:
                partitions.add(int(partition))
    return frozenset(partitions)


class SimpleRate(Rate):
    """Kafka's SimpleRate: the samples' sum over the time since the oldest sample began (at least
    one window), not padded to the whole window count as Rate is."""

    __slots__ = ()

    def window_size_ms(self, now_ms: int) -> int:
        self._purge(now_ms)
        oldest = min(self._starts) if self._starts else now_ms
        return max(now_ms - oldest, self.window_ms)


class ReplicationQuota:
    """One side's throttle: the throttled replicas' bytes measured against the rate set for it."""

    def __init__(self, replicas_config: str, broker_id: int, samples: int = 11, window_s: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.replicas_config = replicas_config  # the topic config naming this side's throttled replicas
        self.broker_id = broker_id
        self.samples = samples
        self.window_ms = window_s * 1000
        self.clock = clock
        self.bound: int | None = None  # bytes per second; None: unbounded, nothing throttled
        self._rate = SimpleRate(samples, self.window_ms)

    @property
    def active(self) -> bool:
        return self.bound is not None

    def set_bound(self, rate: int | None) -> None:
        self.bound = None if rate is None or rate >= UNBOUNDED else rate

    def is_throttled(self, topic_extra: tuple[tuple[str, str], ...], partition: int) -> bool:
        """Whether this side throttles `partition` of a topic whose LogConfig.extra is `topic_extra`."""
        value = next((v for k, v in topic_extra if k == self.replicas_config), None)
        if not value:
            return False
        partitions = throttled_partitions(value, self.broker_id)
        return partitions is ALL_PARTITIONS or partition in partitions

    def exceeded(self) -> bool:
        """Kafka's isQuotaExceeded: the rate measured now is over the bound."""
        if self.bound is None:
            return False
        return self._rate.measure(self._now_ms()) > self.bound

    def record(self, size: int) -> None:
        if self.bound is not None and size:
            self._rate.record(size, self._now_ms())

    def _now_ms(self) -> int:
        return int(self.clock() * 1000)


class ReplicationQuotas:
    """The leader's and the follower's throttle of one broker (Kafka's QuotaManagers.leader and
    .follower), their rates from the broker's dynamic configs."""

    def __init__(self, broker_id: int, samples: int = 11, window_s: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.leader = ReplicationQuota(LEADER_REPLICAS, broker_id, samples, window_s, clock)
        self.follower = ReplicationQuota(FOLLOWER_REPLICAS, broker_id, samples, window_s, clock)

    def configure(self, get: Callable[[str], object]) -> None:
        """Take the rates from the broker's configs (`get`: a config's value or None)."""
        for quota, name in ((self.leader, LEADER_REPLICATION_THROTTLED_RATE),
                            (self.follower, FOLLOWER_REPLICATION_THROTTLED_RATE)):
            value = get(name)
            quota.set_bound(None if value is None else int(str(value)))
