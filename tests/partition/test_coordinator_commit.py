"""A coordinator's write to a replicated internal partition counts once the high watermark passes
its records (Kafka's coordinator runtime appends as acks=1 and holds the response until then)."""

from __future__ import annotations

import asyncio

import pytest

from broker.coordinator.log_writer import LogPartitionWriter
from protocol.errors import ErrorCode, KafkaError
from tests.partition.test_leader import fetch, leader

pytestmark = pytest.mark.timeout(20)


def writer_for(p, timeout_ms: int = 5000) -> LogPartitionWriter:
    return LogPartitionWriter(lambda index: p.log, lambda index: p.notify(), partition_of=lambda index: p,
                              write_timeout_ms=timeout_ms)


async def test_a_write_is_released_once_every_in_sync_replica_has_it(tmp_path, clock):
    p, _ = leader(tmp_path, clock, isr=(1, 2))
    waiting = writer_for(p).write(0, [(b"k", b"v")])
    assert waiting is not None
    task = asyncio.ensure_future(waiting)
    await asyncio.sleep(0)
    assert not task.done() and p.high_watermark == 0  # on the leader's log only
    fetch(p, 2, 1)  # the in-sync follower has it
    assert await asyncio.wait_for(task, 5) == 1


async def test_a_write_not_replicated_in_time_fails_as_the_runtime_expects(tmp_path, clock):
    p, _ = leader(tmp_path, clock, isr=(1, 2))
    waiting = writer_for(p, timeout_ms=50).write(0, [(b"k", b"v")])
    assert waiting is not None
    with pytest.raises(KafkaError) as raised:
        await waiting
    assert raised.value.code == ErrorCode.REQUEST_TIMED_OUT  # COORDINATOR_NOT_AVAILABLE to the client


async def test_a_write_of_a_partition_that_stops_leading_fails_not_coordinator(tmp_path, clock):
    p, _ = leader(tmp_path, clock, isr=(1, 2))
    waiting = writer_for(p).write(0, [(b"k", b"v")])
    assert waiting is not None
    task = asyncio.ensure_future(waiting)
    await asyncio.sleep(0)
    p.make_follower(2, 4, 6, [1, 2, 3], [2])
    with pytest.raises(KafkaError) as raised:
        await asyncio.wait_for(task, 5)
    assert raised.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_a_leader_alone_answers_at_once(tmp_path, clock):
    p, _ = leader(tmp_path, clock, replicas=(1,), isr=(1,))
    assert writer_for(p).write(0, [(b"k", b"v")]) is None
