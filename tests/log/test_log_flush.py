"""Flush policy (flush.messages / flush.ms), the recovery point, group commit."""

from __future__ import annotations

import asyncio
import threading

from broker.log.group_commit import GroupCommit
from tests.log.log_helpers import Clock, batch, new_log, small_config


def test_recovery_point_advances_only_on_flush(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    log.append(batch(3))
    assert log.recovery_point == 0 and log.unflushed_messages == 3
    assert not log.needs_flush()  # defaults: Long.MAX messages and ms
    assert log.flush() == 3
    assert log.recovery_point == 3 and not log.needs_flush()


def test_flush_messages_policy(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(flush_messages=5))
    log.append(batch(4))
    assert not log.needs_flush()
    log.append(batch(1))
    assert log.needs_flush()
    assert log.flush_if_needed()
    assert log.recovery_point == 5


def test_flush_ms_policy(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(flush_ms=1000))
    log.append(batch(1))
    assert not log.needs_flush()
    clock.advance(1000)
    assert log.needs_flush()
    assert log.flush_if_needed()
    assert log.recovery_point == 1


def test_roll_schedules_a_flush_of_the_rolled_segment(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(segment_bytes=500))
    for _ in range(4):
        log.append(batch(1, size=150))
    assert len(log.segments) == 2
    assert log.needs_flush()
    log.flush_if_needed()
    assert log.recovery_point == log.segments[1].base_offset  # up to the roll, not the tail
    assert log.unflushed_messages > 0


async def test_group_commit_coalesces_waiters(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock, small_config(flush_messages=1))
    gate = threading.Event()
    calls = []

    def slow_flush() -> int:
        target = log.log_end_offset  # what was written when this fsync started
        calls.append(target)
        gate.wait(10)
        return log.flush(target)

    commit = GroupCommit(slow_flush)
    first = asyncio.ensure_future(commit.commit(log.append(batch(1)).next_offset))
    for _ in range(10_000):  # until the first fsync is running in its thread (bounded: 10 s)
        if calls:
            break
        await asyncio.sleep(0.001)
    # While the first fsync runs, ten more appends arrive and wait together.
    waiters = [asyncio.ensure_future(commit.commit(log.append(batch(1)).next_offset)) for _ in range(10)]
    await asyncio.sleep(0)
    gate.set()
    results = await asyncio.gather(first, *waiters)
    assert results[-1] == 11 and log.recovery_point == 11
    assert calls == [1, 11] and commit.rounds == 2  # ten waiters, one extra fsync


async def test_group_commit_propagates_errors_and_recovers(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    failures = [OSError("disk on fire")]

    def flaky() -> int:
        if failures:
            raise failures.pop()
        return log.flush()

    commit = GroupCommit(flaky)
    end = log.append(batch(1)).next_offset
    try:
        await commit.commit(end)
    except OSError as e:
        assert "fire" in str(e)
    else:
        raise AssertionError("expected the flush error")
    assert await commit.commit(end) == end


async def test_group_commit_rejects_unwritten_offsets(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    commit = GroupCommit(log.flush)
    try:
        await commit.commit(5)
    except ValueError:
        pass
    else:
        raise AssertionError("expected ValueError")


async def test_group_commit_after_truncation(tmp_path, clock: Clock) -> None:
    log = new_log(tmp_path, clock)
    commit = GroupCommit(log.flush)
    for _ in range(5):
        log.append(batch(1))
    await commit.commit(log.log_end_offset)
    log.truncate_to(2)
    commit.reset(log.recovery_point)
    rounds = commit.rounds
    await commit.commit(log.append(batch(1)).next_offset)
    assert commit.rounds == rounds + 1 and log.recovery_point == 3
