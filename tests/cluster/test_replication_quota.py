"""Replication throttles (KIP-73), Kafka's ReplicationQuotaManager: which replicas a topic's
throttle lists name on a broker, the SimpleRate they are measured with, and the follower's
fetcher leaving out a throttled partition it has not caught up on while over its rate."""

from __future__ import annotations

import pytest

from broker.cluster.etcd_fake import ManualClock
from broker.cluster.fetcher import FetcherSettings, ReplicaFetcher
from broker.cluster.replication_quota import (
    ALL_PARTITIONS,
    FOLLOWER_REPLICAS,
    LEADER_REPLICAS,
    ReplicationQuota,
    ReplicationQuotas,
    throttled_partitions,
)
from broker.log.config import LogConfig
from protocol.errors import KafkaError
from tests.cluster.test_fetcher import TOPIC_ID, FakeLeader, partition
from tests.log.log_helpers import batch


def test_a_throttle_list_names_partitions_per_broker_or_all_of_them() -> None:
    assert throttled_partitions("*", 1) is ALL_PARTITIONS
    assert throttled_partitions(" * ", 7) is ALL_PARTITIONS
    assert throttled_partitions("0:1,1:2,2:1", 1) == frozenset({0, 2})
    assert throttled_partitions("0:1,1:2,2:1", 2) == frozenset({1})
    assert throttled_partitions("0:1", 3) == frozenset()
    assert throttled_partitions("", 1) == frozenset()


def test_a_throttle_list_is_checked_as_kafkas_validator_does() -> None:
    for good in ("*", "0:1,1:2", "0:1, 1:2", ""):
        LogConfig.from_properties({LEADER_REPLICAS: good, FOLLOWER_REPLICAS: good})
    for bad in ("0", "a:1", "0:1,*", "0:1:2"):
        with pytest.raises(KafkaError, match="must be the literal '\\*' or a list of replicas"):
            LogConfig.from_properties({LEADER_REPLICAS: bad})


def test_a_side_throttles_only_the_replicas_its_list_names_on_this_broker() -> None:
    quota = ReplicationQuota(LEADER_REPLICAS, broker_id=1)
    assert quota.is_throttled(((LEADER_REPLICAS, "0:1,1:2"),), 0)
    assert not quota.is_throttled(((LEADER_REPLICAS, "0:1,1:2"),), 1)
    assert not quota.is_throttled(((FOLLOWER_REPLICAS, "*"),), 0)  # the other side's list
    assert quota.is_throttled(((LEADER_REPLICAS, "*"),), 5)


def test_the_rate_is_kafkas_simple_rate_over_the_time_since_the_oldest_sample() -> None:
    clock = ManualClock(0.0)
    quota = ReplicationQuota(LEADER_REPLICAS, 1, samples=11, window_s=1, clock=clock)
    quota.set_bound(1000)
    quota.record(900)
    assert not quota.exceeded()  # 900 B over one window (at least one window is counted)
    quota.record(200)
    assert quota.exceeded()  # 1100 B/s
    clock.now = 2.0
    assert not quota.exceeded()  # 1100 B over 2 s (Rate would pad to 10 windows; SimpleRate does not)
    clock.now = 30.0
    quota.record(1)
    assert not quota.exceeded()  # the old samples expired


def test_no_rate_set_throttles_nothing_and_measures_nothing() -> None:
    quotas = ReplicationQuotas(1)
    quotas.configure({}.get)
    assert not quotas.leader.active and not quotas.follower.active
    quotas.leader.record(10**9)
    assert not quotas.leader.exceeded()
    quotas.configure({"leader.replication.throttled.rate": "100", "follower.replication.throttled.rate":
                      str(2**63 - 1)}.get)
    assert quotas.leader.bound == 100 and not quotas.follower.active  # Long.MAX_VALUE: unbounded


async def test_the_follower_leaves_out_a_throttled_partition_it_has_not_caught_up_on(tmp_path) -> None:
    leaders = {i: partition(str(tmp_path), "leader", i) for i in range(2)}
    followers = {i: partition(str(tmp_path), "follower", i) for i in range(2)}
    for p in leaders.values():
        p.become_leader(3)
        for _ in range(4):
            p.append_records(batch([b"x" * 1000] * 2))
        p.update_follower_high_watermark(p.log.log_end_offset)  # all of it committed on the leader
    for p in followers.values():
        p.make_follower(1, 3, 0, [1, 2], [1, 2])
    followers[0].log.update_config(followers[0].log.config.with_overrides({FOLLOWER_REPLICAS: "0:2"}))
    clock = ManualClock(0.0)
    quota = ReplicationQuota(FOLLOWER_REPLICAS, broker_id=2, clock=clock)
    quota.set_bound(1000)
    client = FakeLeader(leaders, epoch=3)
    fetcher = ReplicaFetcher(2, 1, client, lambda: 77, lambda t, i: followers.get(i),  # type: ignore[arg-type]
                             FetcherSettings(max_wait_ms=0, backoff_ms=10, max_bytes=1), quota=quota)
    for index in followers:
        fetcher.add_partition(("t", index), TOPIC_ID, 3)

    def fetched() -> list[int]:  # the partitions the last fetch read (its session's: a request names the changed)
        return sorted(index for _, index in fetcher.session.partitions)

    assert await fetcher.fetch_once()
    assert fetched() == [0, 1]  # nothing measured yet: both go, one batch each (max_bytes)
    assert quota.exceeded()  # the throttled partition's batch, over 1000 B/s
    assert await fetcher.fetch_once()
    assert fetched() == [1]  # partition 0 waits: behind the leader and over the rate
    clock.now = 30.0
    assert await fetcher.fetch_once()
    assert fetched() == [0, 1]
    while not all(s.in_sync for s in fetcher.states.values()):
        clock.now += 30.0
        assert await fetcher.fetch_once()
    quota.record(10**6)
    assert await fetcher.fetch_once()
    assert fetched() == [0, 1]  # caught up: never held back, whatever the rate
