"""The coordinator runtime on its own: a key-value fake shard, the in-memory writer, a manual clock."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Sequence
from typing import Any

import pytest

from broker.coordinator.result import CoordinatorResult, Deferred, Record
from broker.coordinator.runtime import (
    CoordinatorRuntime,
    InMemoryWriter,
    PartitionState,
    java_string_hashcode,
    partition_for,
)
from broker.coordinator.timer import CoordinatorTimer, ManualClock, Op, Timer
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode

# (group id, Java's String.hashCode, Kafka's partition among 50) computed with Java 17.
JAVA_VECTORS = [
    ("", 0, 0),
    ("a", 97, 47),
    ("my-group", -1906497762, 12),
    ("console-consumer-12345", 158455506, 6),
    ("polygenelubricants", -2147483648, 0),  # Integer.MIN_VALUE: Utils.abs maps it to 0
    ("Aa", 2112, 12),
    ("BB", 2112, 12),
    ("group\u00e9", -1237460406, 6),
    ("\u30b0\u30eb\u30fc\u30d7", 383750870, 20),
    ("g\U0001f600x", 58028462, 12),  # a surrogate pair: two UTF-16 code units
    ("test-group-0", 2060176935, 35),
    ("spark-kafka-source-abc", 2037676455, 5),
    ("z" * 40, 1577242880, 30),
    ("\uffff\uffff", 2097120, 20),
]


@pytest.mark.parametrize(("key", "hashcode", "partition"), JAVA_VECTORS)
def test_java_hashcode_and_partition(key: str, hashcode: int, partition: int) -> None:
    assert java_string_hashcode(key) == hashcode
    assert partition_for(key, 50) == partition


class KVShard:
    """A fake shard: a dict changed only by replay."""

    def __init__(self, partition: int, timer: Timer) -> None:
        self.partition = partition
        self.timer = timer
        self.state: dict[bytes, bytes] = {}
        self.loaded_at: int | None = None
        self.unloaded = False
        self.parked: list[Deferred[str]] = []

    def replay(self, key: bytes, value: bytes | None) -> None:
        if key == b"poison":
            raise ValueError("cannot apply")
        if value is None:
            self.state.pop(key, None)
        else:
            self.state[key] = value

    def on_loaded(self, now_ms: int) -> None:
        self.loaded_at = now_ms

    def on_unloaded(self) -> None:
        self.unloaded = True
        for d in self.parked:
            d.complete("not-coordinator")


def put(key: bytes, value: bytes | None) -> Op:
    return lambda shard, now: CoordinatorResult([(key, value)], response="put %s at %d" % (key.decode(), now))


def get(key: bytes) -> Any:
    return lambda shard: shard.state.get(key)


async def runtime_with(writer: Any = None, partitions: int = 3, **kw: Any) -> CoordinatorRuntime[KVShard]:
    rt: CoordinatorRuntime[KVShard] = CoordinatorRuntime(writer or InMemoryWriter(), KVShard, partitions,
                                                         ManualClock(1000), **kw)
    await rt.load_all()
    return rt


async def test_write_replays_appends_and_responds() -> None:
    writer = InMemoryWriter()
    rt = await runtime_with(writer)
    assert rt.state(1) is PartitionState.ACTIVE and rt.shard(1).loaded_at == 1000
    assert await rt.write(1, put(b"k", b"v")) == "put k at 1000"
    assert writer.logs[1] == [(b"k", b"v")]
    assert rt.shard(1).state == {b"k": b"v"}
    assert await rt.read(1, get(b"k")) == b"v"
    await rt.write(1, put(b"k", None))
    assert await rt.read(1, get(b"k")) is None
    assert rt.partition_for("my-group") == partition_for("my-group", 3)
    await rt.close()


async def test_unknown_partition_and_loading() -> None:
    class SlowReadWriter(InMemoryWriter):
        def read(self, partition: int) -> Iterable[Record]:
            return [(b"k%d" % i, b"v") for i in range(10)]

    rt: CoordinatorRuntime[KVShard] = CoordinatorRuntime(SlowReadWriter(), KVShard, 2, ManualClock(), load_yield_every=1)
    with pytest.raises(KafkaError) as exc:
        await rt.write(0, put(b"a", b"b"))
    assert exc.value.code == E.NOT_COORDINATOR
    loading = asyncio.ensure_future(rt.load(0))
    await asyncio.sleep(0)
    assert rt.state(0) is PartitionState.LOADING
    with pytest.raises(KafkaError) as exc:
        await rt.write(0, put(b"a", b"b"))
    assert exc.value.code == E.COORDINATOR_LOAD_IN_PROGRESS
    await loading
    assert len(rt.shard(0).state) == 10
    await rt.close()


async def test_response_waits_for_durability_and_batches_share_one_append() -> None:
    class GatedWriter(InMemoryWriter):
        def __init__(self) -> None:
            super().__init__()
            self.gate = asyncio.Event()
            self.batches: list[int] = []

        def write(self, partition: int, records: Sequence[Record]) -> Awaitable[Any]:
            super().write(partition, records)
            self.batches.append(len(records))
            return self.gate.wait()

    writer = GatedWriter()
    rt = await runtime_with(writer)
    first = asyncio.ensure_future(rt.write(0, put(b"a", b"1")))
    await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(rt.write(0, put(b"k%d" % i, b"x"))) for i in range(5)]
    await asyncio.sleep(0.01)
    assert not first.done() and not any(f.done() for f in rest)
    writer.gate.set()
    await asyncio.gather(first, *rest)
    assert writer.batches == [1, 5]  # the five writes queued during the first append went together
    await rt.close()


async def test_append_failure_reloads_the_shard_and_fails_the_batch() -> None:
    writer = InMemoryWriter()
    rt = await runtime_with(writer)
    await rt.write(0, put(b"kept", b"1"))
    parked: Deferred[str] = Deferred()
    rt.shard(0).parked.append(parked)
    old_shard = rt.shard(0)

    writer.fail_next = OSError("disk full")
    with pytest.raises(KafkaError) as exc:
        await rt.write(0, put(b"lost", b"2"))
    assert exc.value.code == E.NOT_COORDINATOR
    assert old_shard.unloaded and parked.result() == "not-coordinator"
    assert rt.shard(0) is not old_shard
    assert rt.shard(0).state == {b"kept": b"1"}  # rebuilt from the log: the failed write is gone
    assert await rt.write(0, put(b"next", b"3"))

    for error, expected in [(E.NOT_LEADER_OR_FOLLOWER, E.NOT_COORDINATOR),
                            (E.REQUEST_TIMED_OUT, E.COORDINATOR_NOT_AVAILABLE),
                            (E.MESSAGE_TOO_LARGE, E.UNKNOWN_SERVER_ERROR)]:
        writer.fail_next = KafkaError(error)
        with pytest.raises(KafkaError) as exc:
            await rt.write(0, put(b"x", b"y"))
        assert exc.value.code == expected
    await rt.close()


@pytest.mark.parametrize("queued", [0, 2])
async def test_an_append_failing_while_the_partition_unloads_does_not_bring_it_back(queued: int) -> None:
    """The append of a coordinator that stops leading fails (not replicated) while its unload
    waits for it: the partition stays unloaded and the unload returns (found by the fault runs:
    a reload made the closing partition ACTIVE again, and the unload, the metadata publisher's,
    never returned)."""
    class FailingWriter(InMemoryWriter):
        def __init__(self) -> None:
            super().__init__()
            self.outcome: asyncio.Future[None] | None = None

        def write(self, partition: int, records: Sequence[Record]) -> Awaitable[Any]:
            super().write(partition, records)
            self.outcome = asyncio.get_running_loop().create_future()
            return self.outcome

    writer = FailingWriter()
    rt = await runtime_with(writer)
    writes = [asyncio.ensure_future(rt.write(0, put(b"k%d" % i, b"v"))) for i in range(1 + queued)]
    await asyncio.sleep(0.01)
    unloading = asyncio.ensure_future(rt.unload(0))
    await asyncio.sleep(0.01)
    assert writer.outcome is not None and not unloading.done()
    writer.outcome.set_exception(KafkaError(E.NOT_LEADER_OR_FOLLOWER, "offset 0 not replicated"))
    await asyncio.wait_for(unloading, 5)
    for write in writes:
        with pytest.raises(KafkaError) as exc:
            await write
        assert exc.value.code == E.NOT_COORDINATOR
    assert rt.state(0) is None
    await rt.load(0)  # and it can be led again later
    assert rt.state(0) is PartitionState.ACTIVE
    await rt.close()


async def test_operation_errors_fail_only_that_operation() -> None:
    rt = await runtime_with()

    def refuse(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        raise KafkaError(E.UNKNOWN_MEMBER_ID)

    def crash(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        raise ZeroDivisionError

    results = await asyncio.gather(rt.write(0, put(b"a", b"1")), rt.write(0, refuse), rt.write(0, crash),
                                   rt.write(0, put(b"b", b"2")), return_exceptions=True)
    assert results[0] == "put a at 1000" and results[3] == "put b at 1000"
    assert isinstance(results[1], KafkaError) and results[1].code == E.UNKNOWN_MEMBER_ID
    assert isinstance(results[2], KafkaError) and results[2].code == E.UNKNOWN_SERVER_ERROR
    await rt.close()


async def test_deferred_response_completed_by_a_later_operation() -> None:
    rt = await runtime_with()

    def park(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        d: Deferred[str] = Deferred()
        shard.parked.append(d)
        return CoordinatorResult([(b"parked", b"1")], response=d)

    def release(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        for d in shard.parked:
            d.complete("released")
        return CoordinatorResult(response="done")

    waiting = asyncio.ensure_future(rt.write(2, park))
    await rt.read(2, get(b"parked"))
    assert not waiting.done()
    assert await rt.write(2, release) == "done"
    assert await waiting == "released"
    await rt.close()


async def test_on_durable_and_replay_false() -> None:
    writer = InMemoryWriter()
    rt = await runtime_with(writer)
    seen: list[int] = []

    def snapshot(shard: KVShard, now: int) -> CoordinatorResult[Any]:
        return CoordinatorResult([(b"snap", b"1")], response="ok", replay=False,
                                 on_durable=lambda: seen.append(len(writer.logs[0])))

    assert await rt.write(0, snapshot) == "ok"
    assert seen == [1]  # called after the append
    assert rt.shard(0).state == {}  # not replayed now...
    await rt.unload(0)
    await rt.load(0)
    assert rt.shard(0).state == {b"snap": b"1"}  # ...but replayed when loading
    await rt.close()


async def test_timers_run_as_write_operations() -> None:
    clock = ManualClock(0)
    rt: CoordinatorRuntime[KVShard] = CoordinatorRuntime(InMemoryWriter(), KVShard, 1, clock)
    await rt.load(0)
    timer = rt.shard(0).timer
    timer.schedule("a", 100, put(b"a", b"1"))
    timer.schedule("b", 100, put(b"b", b"1"))
    timer.schedule("b", 300, put(b"b", b"2"))  # rescheduling replaces
    timer.schedule("c", 100, put(b"c", b"1"))
    timer.cancel("c")
    clock.advance(100)
    assert await rt.read(0, lambda s: dict(s.state)) == {b"a": b"1"}
    clock.advance(200)
    assert await rt.read(0, lambda s: dict(s.state)) == {b"a": b"1", b"b": b"2"}
    assert not timer.is_scheduled("b")
    await rt.close()


def test_an_expiry_superseded_before_it_runs_does_nothing() -> None:
    clock = ManualClock(0)
    submitted: list[Op] = []
    timer = CoordinatorTimer(clock, submitted.append)
    calls: list[str] = []

    def op(name: str) -> Op:
        def run(shard: Any, now: int) -> CoordinatorResult[Any]:
            calls.append(name)
            return CoordinatorResult()
        return run

    timer.schedule("k", 10, op("first"))
    clock.advance(10)
    assert len(submitted) == 1
    timer.schedule("k", 10, op("second"))  # rescheduled while the first expiry is queued
    submitted.pop()(None, 10)
    assert calls == []
    clock.advance(10)
    submitted.pop()(None, 20)
    assert calls == ["second"]


async def test_unload_fails_queued_and_parked() -> None:
    rt = await runtime_with()
    parked: Deferred[str] = Deferred()
    rt.shard(0).parked.append(parked)
    await rt.unload(0)
    assert parked.result() == "not-coordinator"
    with pytest.raises(KafkaError) as exc:
        await rt.write(0, put(b"a", b"b"))
    assert exc.value.code == E.NOT_COORDINATOR
    await rt.close()


async def test_bad_records_are_skipped_when_loading() -> None:
    writer = InMemoryWriter()
    writer.logs[0] = [(b"a", b"1"), (b"poison", b"x"), (b"b", b"2")]
    rt = await runtime_with(writer, partitions=1)
    assert rt.shard(0).state == {b"a": b"1", b"b": b"2"}
    await rt.close()
