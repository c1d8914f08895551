"""Several log.dirs with raw frames: AlterReplicaLogDirs moves a partition for real (its data, its
offsets, appends during and after the move, a restart), DescribeLogDirs agrees at every step, and
the errors are Kafka's."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient, wait_for
from tests.integration.test_server_support import BrokerThread, batch, fetch_one, produce, records_of

ALTER_REPLICA_LOG_DIRS, DESCRIBE_LOG_DIRS = 34, 35


@pytest.fixture
def two_dirs(tmp_path: Path) -> Iterator[BrokerThread]:
    dirs = "%s,%s" % (tmp_path / "d1", tmp_path / "d2")
    with BrokerThread(tmp_path, **{"log.dirs": dirs}) as bt:
        yield bt


def alter(c: RawClient, moves: list[tuple[str, str, int]], version: int = 2) -> dict[tuple[str, int], int]:
    R = M.AlterReplicaLogDirsRequest
    request = R(dirs=[R.AlterReplicaLogDir(path=path, topics=[R.AlterReplicaLogDirTopic(name=t, partitions=[p])])
                      for path, t, p in moves])
    response = c.call(ALTER_REPLICA_LOG_DIRS, version, request)
    return {(t.topic_name, p.partition_index): p.error_code for t in response.results for p in t.partitions}


def placement(c: RawClient, topic: str) -> dict[tuple[str, bool], tuple[int, int]]:
    """(log dir, future?) -> (partition size, offset lag) of partition 0 of `topic`."""
    R = M.DescribeLogDirsRequest
    response = c.call(DESCRIBE_LOG_DIRS, 4, R(topics=[R.DescribableLogDirTopic(topic=topic, partitions=[0])]))
    return {(r.log_dir, p.is_future_key): (p.partition_size, p.offset_lag)
            for r in response.results for t in r.topics for p in t.partitions}


def values(c: RawClient, topic: str) -> list[bytes | None]:
    data = fetch_one(c, topic, 0, 0)
    assert data.error_code == 0
    return [r.value for r in records_of(data.records)]


def test_a_partition_moves_with_its_data(tmp_path: Path) -> None:
    dirs = "%s,%s" % (tmp_path / "d1", tmp_path / "d2")
    with BrokerThread(tmp_path, **{"log.dirs": dirs}) as two_dirs:
        source, target = moved_and_back(two_dirs)
    with BrokerThread(tmp_path, **{"log.dirs": dirs}) as again:
        assert again.broker.logs.log_dir_of("moving", 0) == source
        assert "moving-0" not in os.listdir(target)
        c = again.client()
        assert values(c, "moving")[-1] == b"after"
        c.close()


def moved_and_back(two_dirs: BrokerThread) -> tuple[str, str]:
    broker: Any = two_dirs.broker
    two_dirs.create_topic("moving", 1, {"segment.bytes": "1048576"})
    c = two_dirs.client()
    for i in range(30):
        assert produce(c, "moving", 0, batch([b"v%d" % i])).error_code == 0
    source = broker.logs.log_dir_of("moving", 0)
    (target,) = [d for d in broker.logs.log_dirs if d != source]
    before = placement(c, "moving")
    assert list(before) == [(source, False)]
    assert alter(c, [(target, "moving", 0)]) == {("moving", 0): 0}
    wait_for(lambda: broker.logs.log_dir_of("moving", 0) == target, what="the move")
    wait_for(lambda: list(placement(c, "moving")) == [(target, False)], what="DescribeLogDirs to agree")
    after = placement(c, "moving")
    assert after[(target, False)][0] == before[(source, False)][0]
    assert not os.path.exists(os.path.join(source, "moving-0"))
    assert produce(c, "moving", 0, batch([b"after"])).base_offset == 30
    assert values(c, "moving") == [b"v%d" % i for i in range(30)] + [b"after"]
    # moving it to where it is changes nothing; back again works too
    assert alter(c, [(target, "moving", 0)]) == {("moving", 0): 0}
    assert alter(c, [(source, "moving", 0)]) == {("moving", 0): 0}
    wait_for(lambda: broker.logs.log_dir_of("moving", 0) == source, what="the move back")
    c.close()
    return source, target


def test_appends_during_a_move_are_kept(two_dirs: BrokerThread) -> None:
    broker: Any = two_dirs.broker
    two_dirs.create_topic("busy", 1)
    c = two_dirs.client()
    for _ in range(200):
        assert produce(c, "busy", 0, batch([b"x" * 1000])).error_code == 0
    target = [d for d in broker.logs.log_dirs if d != broker.logs.log_dir_of("busy", 0)][0]
    assert alter(c, [(target, "busy", 0)]) == {("busy", 0): 0}
    sent = 200
    while broker.logs.log_dir_of("busy", 0) != target:
        assert produce(c, "busy", 0, batch([b"y"])).error_code == 0
        sent += 1
        assert sent < 100_000
    assert produce(c, "busy", 0, batch([b"z"])).base_offset == sent
    assert broker.partitions.get("busy", 0).log.log_end_offset == sent + 1
    c.close()


def test_errors(two_dirs: BrokerThread, tmp_path: Path) -> None:
    two_dirs.create_topic("e", 1)
    c = two_dirs.client()
    dirs = two_dirs.broker.logs.log_dirs
    got = alter(c, [(str(tmp_path / "elsewhere"), "e", 0), (dirs[1], "missing", 0), (dirs[1], "e", 7),
                    (dirs[0], "x" * 240, 0)], version=1)
    assert got == {("e", 0): ErrorCode.LOG_DIR_NOT_FOUND, ("missing", 0): ErrorCode.REPLICA_NOT_AVAILABLE,
                   ("e", 7): ErrorCode.REPLICA_NOT_AVAILABLE, ("x" * 240, 0): ErrorCode.INVALID_TOPIC_EXCEPTION}
    c.close()
