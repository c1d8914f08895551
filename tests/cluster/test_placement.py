"""Striped replica placement (broker/cluster/placement.py), as Kafka's StripedReplicaPlacer."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from broker.cluster.placement import UsableBroker, place_partitions
from protocol.errors import ErrorCode, KafkaError


def brokers(*specs: tuple[int, str | None, bool]) -> list[UsableBroker]:
    return [UsableBroker(n, rack, fenced) for n, rack, fenced in specs]


THREE = brokers((1, None, False), (2, None, False), (3, None, False))


def test_every_partition_has_distinct_replicas_and_leaders_spread_evenly() -> None:
    placed = place_partitions(THREE, 30, 3, random.Random(7))
    assert all(len(set(r)) == 3 for r in placed)
    assert Counter(r[0] for r in placed) == {1: 10, 2: 10, 3: 10}


def test_the_same_seed_places_the_same_way() -> None:
    assert place_partitions(THREE, 12, 2, random.Random(3)) == place_partitions(THREE, 12, 2, random.Random(3))


def test_replicas_spread_over_racks_first() -> None:
    racked = brokers(*[(n, "r%d" % (n % 3), False) for n in range(1, 10)])
    rack_of = {b.node_id: b.rack for b in racked}
    for replicas in place_partitions(racked, 50, 3, random.Random(1)):
        assert len({rack_of[n] for n in replicas}) == 3


def test_the_leader_is_never_fenced_and_fenced_brokers_come_last() -> None:
    mixed = brokers((1, None, True), (2, None, False), (3, None, False))
    placed = place_partitions(mixed, 20, 2, random.Random(5))
    assert all(r[0] != 1 for r in placed)
    assert all(1 not in r for r in placed)  # two unfenced brokers are enough for two replicas
    assert any(1 in r for r in place_partitions(mixed, 5, 3, random.Random(5)))


@pytest.mark.parametrize(("pool", "factor", "message"), [
    (THREE, 0, "Invalid replication factor 0: the replication factor must be positive."),
    (THREE, 4, "The target replication factor of 4 cannot be reached because only 3 broker(s) are registered."),
    (brokers((1, None, True)), 1, "All brokers are currently fenced."),
])
def test_refusals_carry_kafkas_messages(pool: list[UsableBroker], factor: int, message: str) -> None:
    with pytest.raises(KafkaError) as failure:
        place_partitions(pool, 1, factor, random.Random(0))
    assert failure.value.code == ErrorCode.INVALID_REPLICATION_FACTOR and failure.value.message == message
