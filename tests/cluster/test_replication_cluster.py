"""Followers copy their leaders (issue 23, the follower's side) on a three-process cluster with
replication factor 3: records produced with confluent-kafka (idempotent, and transactions
committed and aborted) appear in every replica's segment files as the same batches, byte for
byte, at the same offsets; a follower killed with -9 catches up when it returns; a follower whose
log holds batches the leader does not have truncates them and copies the leader's from there."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from protocol.records import build_batch, iter_batches
from tests.cluster.harness import ProcessCluster
from tests.cluster.nodes import (
    create_topic,
    metadata,
    need_etcd,
    spread,
    start_cluster,
    wait_leaders,
    wait_live,
)
from tests.harness import wait_for

TOPIC = "replicated"
PARTITIONS = 3


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ProcessCluster]:
    need_etcd()
    made = start_cluster(tmp_path / "cluster")
    try:
        code, message = create_topic(made.node(1).port, TOPIC, PARTITIONS, factor=3)
        assert code == 0, message
        spread(made, TOPIC, PARTITIONS)
        yield made
    except BaseException:
        print(made.logs())
        raise
    finally:
        made.stop()


def batches(cluster: ProcessCluster, node: int, partition: int) -> list[bytes]:
    """The batches in a replica's segment files, in offset order (an incomplete last one left out)."""
    directory = cluster.node(node).data_dir / ("%s-%d" % (TOPIC, partition))
    if not directory.exists():
        return []
    out = []
    for name in sorted(n for n in os.listdir(directory) if n.endswith(".log")):
        data = (directory / name).read_bytes()
        out += [data[pos:pos + h.size] for pos, h in iter_batches(data)]
    return out


def current_leaders(cluster: ProcessCluster) -> dict[int, int]:
    """The leaders every node agrees on, each partition led (after a failover a returning node
    leads again only by a preferred election, so they need not be every node)."""
    return wait_leaders(cluster, TOPIC, lambda ls: len(ls) == PARTITIONS and min(ls.values()) >= 0)


def leader_of(cluster: ProcessCluster, partition: int) -> int:
    return current_leaders(cluster)[partition]


def wait_replicated(cluster: ProcessCluster, partitions: range = range(PARTITIONS), timeout: float = 30.0
                    ) -> dict[int, list[bytes]]:
    """Until every replica of each partition holds exactly its leader's batches; the leaders' batches."""
    leaders = current_leaders(cluster)
    found: dict[int, list[bytes]] = {}

    def same() -> bool:
        for p in partitions:
            found[p] = batches(cluster, leaders[p], p)
            if not found[p] or any(batches(cluster, n, p) != found[p] for n in cluster.nodes):
                return False
        return True

    wait_for(same, timeout, interval=0.1, what="every replica holding its leader's batches")
    return found


def produce(cluster: ProcessCluster, tag: str, per_partition: int = 30) -> None:
    errors: list[Any] = []

    def delivered(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "acks": "all",
                         "linger.ms": 5})
    for i in range(per_partition):
        for p in range(PARTITIONS):
            producer.produce(TOPIC, value=b"%s-%d-%d" % (tag.encode(), p, i), partition=p, on_delivery=delivered)
    assert producer.flush(30) == 0
    assert not errors, errors


def produce_transactions(cluster: ProcessCluster) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": "replicated-txn"})
    producer.init_transactions(30)
    for commit in (True, False):
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce(TOPIC, value=b"txn-%s-%d" % (b"commit" if commit else b"abort", p), partition=p)
        assert producer.flush(30) == 0  # written before the abort (which drops what is still queued)
        if commit:
            producer.commit_transaction(30)
        else:
            producer.abort_transaction(30)


def test_followers_hold_the_leaders_batches_byte_for_byte(cluster: ProcessCluster) -> None:
    produce(cluster, "a")
    produce_transactions(cluster)
    produce(cluster, "b")
    copied = wait_replicated(cluster)
    for p in range(PARTITIONS):
        headers = [h for b in copied[p] for _, h in iter_batches(b)]
        assert sum(h.records_count for h in headers if not h.is_control) == 62, p
        assert sum(1 for h in headers if h.is_control) == 2, p  # the COMMIT and ABORT markers
        offsets = [h.base_offset for h in headers]
        assert offsets == sorted(offsets) and offsets[0] == 0


def test_a_follower_killed_catches_up_when_it_returns(cluster: ProcessCluster) -> None:
    assert create_topic(cluster.node(1).port, "solo", PARTITIONS) == (0, None)  # one replica each
    solo = spread(cluster, "solo", PARTITIONS)
    produce(cluster, "before")
    wait_replicated(cluster)
    leader = leader_of(cluster, 0)
    follower = next(n for n in sorted(cluster.nodes) if n != leader)
    cluster.node(follower).kill()
    produce_to(cluster, [p for p, n in spread_without(cluster, follower).items() if n >= 0], "while-down")
    cluster.restart(follower)
    wait_live(cluster)
    produce(cluster, "after")
    copied = wait_replicated(cluster, timeout=60)
    assert b"while-down-0-0" in b"".join(copied[0])
    # the leader epochs in Metadata are the metadata's, whichever node answers (a node without a
    # replica of the partition too): librdkafka ignores a Metadata answer with an older epoch
    wait_leaders(cluster, "solo", lambda ls: ls == solo)
    epochs = [{p.partition_index: (p.leader_id, p.leader_epoch) for p in metadata(cluster.node(n).port, ["solo"])
               .topics[0].partitions} for n in sorted(cluster.nodes)]
    assert epochs[0] == epochs[1] == epochs[2], epochs
    assert all(epochs[0][p][1] > 0 for p, n in solo.items() if n == follower), epochs


def test_a_follower_with_records_the_leader_lacks_truncates_them(cluster: ProcessCluster) -> None:
    produce(cluster, "common")
    copied = wait_replicated(cluster)
    leader = leader_of(cluster, 0)
    follower = next(n for n in sorted(cluster.nodes) if n != leader)
    cluster.node(follower).kill()
    # history the leader never had: batches past its end, in its current leader epoch
    last = next(h for _, h in iter_batches(copied[0][-1]))
    directory = cluster.node(follower).data_dir / ("%s-0" % TOPIC)
    active = sorted(n for n in os.listdir(directory) if n.endswith(".log"))[-1]
    offset = last.next_offset
    with open(directory / active, "ab") as f:
        for i in range(3):
            f.write(build_batch([(None, b"diverged-%d-%d" % (i, k)) for k in range(5)], base_offset=offset,
                                partition_leader_epoch=last.partition_leader_epoch))
            offset += 5
    assert len(batches(cluster, follower, 0)) == len(copied[0]) + 3
    cluster.restart(follower)
    wait_live(cluster)
    copied = wait_replicated(cluster, range(1), timeout=60)
    assert b"diverged" not in b"".join(copied[0])
    produce(cluster, "later")
    copied = wait_replicated(cluster)
    assert b"diverged" not in b"".join(batches(cluster, follower, 0))
    assert b"later-0-29" in b"".join(copied[0])
    assert "truncating" in cluster.node(follower).output()


def spread_without(cluster: ProcessCluster, gone: int) -> dict[int, int]:
    """The leaders once the killed node leads none (its session ran out)."""
    alive = [n for n in cluster.nodes if n != gone]
    return wait_leaders(cluster, TOPIC, lambda ls: gone not in ls.values(), nodes=alive, timeout=30)


def produce_to(cluster: ProcessCluster, partitions: list[int], tag: str, per_partition: int = 20) -> None:
    alive = ",".join(p.bootstrap for n, p in cluster.nodes.items() if p.proc is not None and p.proc.poll() is None)
    producer = Producer({"bootstrap.servers": alive, "acks": "all", "linger.ms": 5})
    errors: list[Any] = []
    for i in range(per_partition):
        for p in partitions:
            producer.produce(TOPIC, value=b"%s-%d-%d" % (tag.encode(), p, i), partition=p,
                             on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
    assert producer.flush(30) == 0
    assert not errors, errors
