"""The runtime's fast path: a write on an idle partition runs at once in the caller's task, with
the same order and durability as the queue (a key-value fake shard, gated writers)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine, Sequence
from typing import Any

import pytest

from broker.coordinator.log_writer import (
    LogPartitionWriter,
    build_coordinator_batch,
    coordinator_batch,
    internal_topic_log_config,
)
from broker.coordinator.result import CoordinatorResult, Record
from broker.coordinator.runtime import (
    CoordinatorRuntime,
    InMemoryWriter,
    PartitionState,
    java_abs,
    java_string_hashcode,
    partition_for,
)
from broker.coordinator.timer import ManualClock, Op
from broker.log import LogConfig
from protocol.errors import ErrorCode, KafkaError
from protocol.records import build_batch, decode_batch, parse_batch_header
from tests.coordinator.test_log_writer import Logs
from tests.coordinator.test_runtime import KVShard, put, runtime_with

E = ErrorCode


class GatedWriter(InMemoryWriter):
    """Writes at once; while `gated`, durability waits for `open_gate()` (or `fail_gate()`)."""

    def __init__(self) -> None:
        super().__init__()
        self.gated = False
        self.batches: list[list[bytes]] = []
        self._gate: asyncio.Future[None] | None = None

    def write(self, partition: int, records: Sequence[Record]) -> Awaitable[Any] | None:
        super().write(partition, records)
        self.batches.append([key for key, _ in records])
        if not self.gated:
            return None
        if self._gate is None:
            self._gate = asyncio.get_running_loop().create_future()
        return asyncio.shield(self._gate)

    def open_gate(self) -> None:
        gate, self._gate, self.gated = self._gate, None, False
        assert gate is not None
        gate.set_result(None)

    def fail_gate(self, exc: BaseException) -> None:
        gate, self._gate, self.gated = self._gate, None, False
        assert gate is not None
        gate.set_exception(exc)


async def without_yielding(coro: Coroutine[Any, Any, Any]) -> tuple[Any, bool]:
    """Await `coro`; also say whether it completed without giving the event loop a turn."""
    turns: list[int] = []
    probe = asyncio.get_running_loop().call_soon(turns.append, 1)
    result = await coro
    probe.cancel()
    return result, not turns


async def turns(n: int = 5) -> None:
    """Give the event loop a few turns (bounded: nothing here waits on a condition)."""
    for _ in range(n):
        await asyncio.sleep(0)


def traced(key: bytes, trace: list[bytes], value: bytes = b"v") -> Op:
    """A write of `key` that records when it runs and what it saw of `key`'s previous writes."""
    def op(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        trace.append(key)
        return CoordinatorResult([(key, value)], response=(key, sorted(shard.state)))
    return op


async def test_a_write_on_an_idle_partition_needs_no_event_loop_turn() -> None:
    writer = InMemoryWriter()
    rt = await runtime_with(writer)
    response, immediate = await without_yielding(rt.write(0, put(b"k", b"v")))
    assert immediate and response == "put k at 1000"
    assert writer.logs[0] == [(b"k", b"v")] and rt.shard(0).state == {b"k": b"v"}

    def refuse(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        raise KafkaError(E.UNKNOWN_MEMBER_ID)

    with pytest.raises(KafkaError) as exc:  # an operation's error comes back the same way
        await rt.write(0, refuse)
    assert exc.value.code == E.UNKNOWN_MEMBER_ID
    _, immediate = await without_yielding(rt.write(0, put(b"k", b"w")))
    assert immediate  # and the partition is free again
    # a read queues (a barrier): it takes a turn of the loop; read_now on an idle partition does not
    value, immediate = await without_yielding(rt.read(0, lambda s: s.state.get(b"k")))
    assert value == b"w" and not immediate
    value, immediate = await without_yielding(rt.read_now(0, lambda s: s.state.get(b"k")))
    assert value == b"w" and immediate
    await rt.close()


async def test_an_operation_submitted_by_on_durable_runs_before_anything_sent_after_the_answer() -> None:
    """submit() queues without waiting: the fast-path answer needs no turn of the loop, and what
    comes after it (a write, a read_now) runs after the submitted operation."""
    rt = await runtime_with()
    trace: list[bytes] = []
    submitted: list[asyncio.Future[Any]] = []

    def first(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        trace.append(b"first")
        return CoordinatorResult([(b"first", b"v")], response="answered",
                                 on_durable=lambda: submitted.append(rt.submit(0, traced(b"then", trace))))

    answer, immediate = await without_yielding(rt.write(0, first))
    assert (answer, immediate, trace) == ("answered", True, [b"first"])  # answered before `then` ran
    assert await rt.read_now(0, lambda s: sorted(s.state)) == [b"first", b"then"]
    assert await rt.write(0, traced(b"after", trace)) == (b"after", [b"first", b"then"])
    assert trace == [b"first", b"then", b"after"]
    assert await submitted[0] == (b"then", [b"first"])
    with pytest.raises(KafkaError) as exc:
        rt.submit(7, put(b"k", b"v"))
    assert exc.value.code == E.NOT_COORDINATOR
    await rt.close()


async def test_a_task_writing_in_a_row_still_lets_others_run() -> None:
    rt = await runtime_with()
    ticks = 0

    async def other() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.ensure_future(other())
    await asyncio.sleep(0)
    start = ticks
    for i in range(100):  # like a connection working through pipelined commits
        await rt.write(0, put(b"k%d" % i, b"v"))
    assert 3 <= ticks - start <= 5  # a turn every 32 fast-path writes, not one per write
    ticker.cancel()
    await rt.close()


async def test_writes_arriving_during_a_durability_wait_queue_and_keep_their_order() -> None:
    writer = GatedWriter()
    rt = await runtime_with(writer)
    trace: list[bytes] = []
    writer.gated = True
    first = asyncio.ensure_future(rt.write(0, traced(b"a", trace)))
    await turns()
    assert trace == [b"a"] and not first.done()  # ran at once; its response waits for durability
    later = [asyncio.ensure_future(rt.write(0, traced(k, trace))) for k in (b"b", b"c")]
    read = asyncio.ensure_future(rt.read(0, lambda s: sorted(s.state)))
    read_now = asyncio.ensure_future(rt.read_now(0, lambda s: sorted(s.state)))
    await turns()
    assert trace == [b"a"] and rt.queue_size(0) == 4  # nothing overtakes the write in flight
    assert not any(f.done() for f in [first, *later, read, read_now])

    writer.open_gate()
    assert await first == (b"a", [])
    assert [await f for f in later] == [(b"b", [b"a"]), (b"c", [b"a", b"b"])]
    assert await read == [b"a", b"b", b"c"]
    assert await read_now == [b"a", b"b", b"c"]  # a busy partition: queued like any read
    assert trace == [b"a", b"b", b"c"]
    assert writer.batches == [[b"a"], [b"b", b"c"]]  # the queued writes shared one write

    # idle again: the next write takes the fast path
    _, immediate = await without_yielding(rt.write(0, put(b"d", b"1")))
    assert immediate
    await rt.close()


async def test_other_partitions_are_not_held_up_by_a_durability_wait() -> None:
    writer = GatedWriter()
    rt = await runtime_with(writer)
    writer.gated = True
    slow = asyncio.ensure_future(rt.write(0, put(b"a", b"1")))
    await turns()
    writer.gated = False
    _, immediate = await without_yielding(rt.write(1, put(b"b", b"1")))
    assert immediate and not slow.done()
    writer.open_gate()
    assert await slow == "put a at 1000"
    await rt.close()


async def test_a_cancelled_caller_does_not_cut_the_durability_wait_short() -> None:
    writer = GatedWriter()
    rt = await runtime_with(writer)
    durable: list[str] = []

    def snapshot(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        return CoordinatorResult([(b"s", b"1")], response="ok", on_durable=lambda: durable.append("s"))

    writer.gated = True
    caller = asyncio.ensure_future(rt.write(0, snapshot))
    await turns()
    queued = asyncio.ensure_future(rt.write(0, put(b"after", b"1")))
    await turns()
    caller.cancel()
    await turns()
    assert caller.cancelled() and durable == [] and not queued.done()
    writer.open_gate()
    assert await queued == "put after at 1000"
    assert durable == ["s"]  # still called once durable, before the next operation's response
    assert rt.shard(0).state == {b"s": b"1", b"after": b"1"}
    _, immediate = await without_yielding(rt.write(0, put(b"x", b"1")))
    assert immediate  # the partition was released
    await rt.close()


async def test_a_failed_write_on_the_fast_path_reloads_the_shard() -> None:
    class SlowLoadWriter(InMemoryWriter):
        def read(self, partition: int) -> list[Record]:
            return [(b"k%d" % i, b"v") for i in range(5)] + list(self.logs[partition])

    writer = SlowLoadWriter()
    rt = await runtime_with(writer, load_yield_every=1)
    old_shard = rt.shard(0)
    writer.fail_next = OSError("disk full")
    failing = asyncio.ensure_future(rt.write(0, put(b"lost", b"1")))
    await asyncio.sleep(0)
    assert rt.state(0) is PartitionState.LOADING  # the reload runs in its own task
    with pytest.raises(KafkaError) as exc:
        await rt.write(0, put(b"meanwhile", b"1"))
    assert exc.value.code == E.COORDINATOR_LOAD_IN_PROGRESS
    with pytest.raises(KafkaError) as exc:
        await failing
    assert exc.value.code == E.NOT_COORDINATOR
    assert old_shard.unloaded and rt.shard(0) is not old_shard
    assert b"lost" not in rt.shard(0).state and len(rt.shard(0).state) == 5
    _, immediate = await without_yielding(rt.write(0, put(b"next", b"1")))
    assert immediate
    await rt.close()


async def test_a_failed_durability_wait_fails_the_write_and_queued_ones_run_on_the_reloaded_shard() -> None:
    writer = GatedWriter()
    rt = await runtime_with(writer)
    old_shard = rt.shard(0)
    trace: list[bytes] = []
    writer.gated = True
    first = asyncio.ensure_future(rt.write(0, traced(b"a", trace)))
    await turns()
    queued = asyncio.ensure_future(rt.write(0, traced(b"b", trace)))
    await turns()
    writer.fail_gate(KafkaError(E.REQUEST_TIMED_OUT))
    with pytest.raises(KafkaError) as exc:
        await first
    assert exc.value.code == E.COORDINATOR_NOT_AVAILABLE
    # the queued write ran after the reload, on the new shard (rebuilt from the log, which holds
    # what was written before the flush failed)
    assert await queued == (b"b", [b"a"])
    assert rt.shard(0) is not old_shard and old_shard.unloaded
    await rt.close()


async def test_unload_lets_the_write_in_flight_and_the_queued_ones_finish() -> None:
    writer = GatedWriter()
    rt = await runtime_with(writer)
    writer.gated = True
    first = asyncio.ensure_future(rt.write(0, put(b"a", b"1")))
    await turns()
    queued = asyncio.ensure_future(rt.write(0, put(b"b", b"1")))
    await turns()
    unloading = asyncio.ensure_future(rt.unload(0))
    await turns()
    assert not unloading.done()
    with pytest.raises(KafkaError) as exc:
        await rt.write(0, put(b"c", b"1"))
    assert exc.value.code == E.NOT_COORDINATOR
    writer.open_gate()
    await unloading
    assert await first == "put a at 1000" and await queued == "put b at 1000"
    assert [key for batch in writer.batches for key in batch] == [b"a", b"b"]
    await rt.close()


async def test_a_timer_expiry_during_a_durability_wait_runs_after_it() -> None:
    clock = ManualClock(0)
    writer = GatedWriter()
    rt: CoordinatorRuntime[KVShard] = CoordinatorRuntime(writer, KVShard, 1, clock)
    await rt.load(0)
    rt.shard(0).timer.schedule("t", 10, put(b"timer", b"1"))
    writer.gated = True
    first = asyncio.ensure_future(rt.write(0, put(b"a", b"1")))
    await turns()
    clock.advance(10)
    await turns()
    assert rt.queue_size(0) == 1 and b"timer" not in rt.shard(0).state
    writer.open_gate()
    await first
    assert await rt.read(0, lambda s: sorted(s.state)) == [b"a", b"timer"]
    assert [key for batch in writer.batches for key in batch] == [b"a", b"timer"]
    await rt.close()


async def test_on_the_storage_engine_the_response_follows_the_flush_policy(tmp_path: Any) -> None:
    # Kafka's defaults: the write reaches the OS at once, no fsync, no await.
    logs = Logs(str(tmp_path / "default"), internal_topic_log_config(LogConfig()))
    rt: CoordinatorRuntime[KVShard] = CoordinatorRuntime(LogPartitionWriter(logs.log_for), KVShard, 1, ManualClock(0))
    await rt.load(0)
    await rt.write(0, put(b"warm-up", b"1"))  # a new log's directory is synced once
    _, immediate = await without_yielding(rt.write(0, put(b"k", b"v")))
    log = logs.log_for(0)
    assert immediate and log.log_end_offset == 2
    await rt.close()
    logs.close()

    # flush.messages=1: the response waits for the fsync; writes meanwhile share the next one.
    config = internal_topic_log_config(LogConfig()).with_overrides({"flush.messages": "1"})
    logs = Logs(str(tmp_path / "fsync"), config)
    rt = CoordinatorRuntime(LogPartitionWriter(logs.log_for), KVShard, 1, ManualClock(0))
    await rt.load(0)
    log = logs.log_for(0)
    responses = await asyncio.gather(*(rt.write(0, put(b"k%d" % i, b"v")) for i in range(4)))
    assert responses == ["put k%d at 0" % i for i in range(4)]
    assert log.recovery_point == log.log_end_offset == 4
    batches = list(LogPartitionWriter(logs.log_for).read(0))
    assert [k for batch in batches for k, _ in batch] == [b"k0", b"k1", b"k2", b"k3"]
    await rt.close()
    logs.close()


def test_partition_for_is_cached_per_key_and_partition_count() -> None:
    assert partition_for("my-group", 50) == 12
    assert partition_for("my-group", 7) == java_abs(java_string_hashcode("my-group")) % 7
    hits = partition_for.cache_info().hits
    assert partition_for("my-group", 50) == 12
    assert partition_for.cache_info().hits == hits + 1


@pytest.mark.parametrize("records", [
    [(b"\x00\x01key", b"\x00\x04value")],
    [(b"k", None)],  # a tombstone
    [(b"k" * 200, b"v" * 70000), (b"k2", None), (b"", b"")],  # multi-byte varints, empty key and value
    [(b"k%d" % i, b"v") for i in range(300)],  # offset deltas past one varint byte
])
def test_the_coordinator_batch_is_what_build_batch_gives(records: list[Record]) -> None:
    batch = coordinator_batch(records, 1_700_000_000_123)
    assert batch == build_batch([(k, v, (), 1_700_000_000_123) for k, v in records])
    built, header = build_coordinator_batch(records, 1_700_000_000_123)
    assert built == batch and header == parse_batch_header(batch, 0)
    header, decoded = decode_batch(batch, 0)
    assert [(r.key, r.value) for r in decoded] == records and header.max_timestamp == 1_700_000_000_123
