"""What one ShareFetch returns across its partitions, as Kafka's DelayedShareFetch and
ShareFetchUtils decide it: the order rotated by the session epoch, share-partitions that load one
by one (the first fetch of a fresh session answers with the first that loads with records),
MaxRecords taken partition by partition, MaxBytes split evenly, MinBytes and the long poll.

The partitions are in-memory fakes (batches of 10 records of 100 bytes); the manager is the real
one."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from broker.coordinator.share.records import ShareKey
from broker.coordinator.share.shard import WriteState
from broker.coordinator.share.state import ShareGroupOffset
from broker.coordinator.timer import ManualClock
from broker.share.engine import ShareSettings
from broker.share.fetch_strategy import rotate_round_robin, uniform_partition_max_bytes
from broker.share.manager import SharePartitionManager
from broker.share.ports import PartitionResult, ShareGroupSettings
from protocol.records import build_batch
from tests.share.fakes import VALUE, LogPartition

TOPIC = uuid.uuid4()
P0, P1, P2 = (TOPIC, 0), (TOPIC, 1), (TOPIC, 2)
BATCH = len(build_batch([(None, VALUE)] * 10, base_offset=0))  # bytes of one batch of 10 records


# ----- the strategies ---------------------------------------------------------------------
def test_round_robin_rotation_by_the_session_epoch() -> None:
    """PartitionRotateStrategy.ROUND_ROBIN: left by epoch % n; none at epochs 0 and -1."""
    parts = ["a", "b", "c"]
    assert [rotate_round_robin(parts, e) for e in (0, -1)] == [parts, parts]
    assert [rotate_round_robin(parts, e) for e in (1, 2, 3, 4)] == [
        ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"], ["b", "c", "a"]]
    assert rotate_round_robin(["a"], 7) == ["a"] and rotate_round_robin([], 3) == []


def test_uniform_partition_max_bytes() -> None:
    """PartitionMaxBytesStrategy.UNIFORM (the remainder, and the bytes when there are fewer
    than partitions, go to the first partitions rather than to random ones)."""
    assert uniform_partition_max_bytes(100, 4) == [25, 25, 25, 25]
    assert uniform_partition_max_bytes(103, 4) == [28, 25, 25, 25]
    assert uniform_partition_max_bytes(2, 4) == [1, 1, 0, 0]
    assert uniform_partition_max_bytes(100, 1) == [100]
    assert uniform_partition_max_bytes(100, 0) == []


# ----- fakes ------------------------------------------------------------------------------
class Persister:
    """Share-partition state at offset 0; the reads of the keys in `slow` wait for `go`."""

    def __init__(self, slow: tuple[int, ...] = ()) -> None:
        self.slow = slow
        self.go = asyncio.Event()

    async def read_state(self, key: ShareKey) -> ShareGroupOffset | None:
        if key[2] in self.slow:
            await self.go.wait()
        return ShareGroupOffset(start_offset=0, state_epoch=0, state_batches=())

    async def write_state(self, write: WriteState) -> None:
        pass


def manager(partitions: dict[int, LogPartition], persister: Persister | None = None) -> SharePartitionManager:
    settings = ShareGroupSettings(engine=ShareSettings(), auto_offset_reset="earliest")
    return SharePartitionManager(persister or Persister(), lambda topic_id, index: partitions.get(index),
                                 lambda group_id: settings, ManualClock())


async def share_fetch(m: SharePartitionManager, parts: list[Any], epoch: int = 0, max_records: int = 500,
                      max_bytes: int = 50 << 20, min_bytes: int = 1, max_wait_ms: int = 0,
                      record_limit: bool = False) -> dict[int, list[tuple[int, int]]]:
    """{partition: acquired (first, last) ranges} of the partitions that gave records."""
    results: dict[Any, PartitionResult] = await m.fetch(
        "g", "m", parts, max_wait_ms=max_wait_ms, min_bytes=min_bytes, max_bytes=max_bytes, max_records=max_records,
        batch_size=max_records, record_limit=record_limit, session_epoch=epoch)
    for r in results.values():
        assert r.error == 0, r
    return {tp[1]: [(a.first_offset, a.last_offset) for a in r.acquired] for tp, r in results.items() if r.acquired}


async def loaded(m: SharePartitionManager, *parts: Any) -> None:
    for tp in parts:
        await m.entry("g", tp)


# ----- loading: the first fetch of a fresh session ----------------------------------------
async def test_the_first_fetch_answers_with_the_first_share_partition_to_load() -> None:
    """librdkafka's test 0179: 50 records in each of two partitions; the fetch that loads them
    answers with the first (Kafka's tryComplete at its initialization), the next with the other."""
    m = manager({0: LogPartition(5), 1: LogPartition(5)})
    assert await share_fetch(m, [P0, P1]) == {0: [(0, 49)]}
    assert await share_fetch(m, [P0, P1], epoch=1) == {1: [(0, 49)]}
    await m.stop()


async def test_a_fetch_does_not_wait_for_a_share_partition_still_loading() -> None:
    persister = Persister(slow=(0,))
    m = manager({0: LogPartition(5), 1: LogPartition(5)}, persister)
    assert await share_fetch(m, [P0, P1], max_wait_ms=5000) == {1: [(0, 49)]}
    persister.go.set()
    await loaded(m, P0)
    assert await share_fetch(m, [P0, P1], epoch=1) == {0: [(0, 49)]}
    await m.stop()


async def test_a_first_loaded_partition_without_records_lets_the_next_load_answer() -> None:
    m = manager({0: LogPartition(0), 1: LogPartition(2)})
    assert await share_fetch(m, [P0, P1]) == {1: [(0, 19)]}
    await m.stop()


async def test_loaded_share_partitions_all_give_within_max_records() -> None:
    """Once loaded, one fetch takes from every partition while MaxRecords lasts."""
    m = manager({0: LogPartition(5), 1: LogPartition(5), 2: LogPartition(5)})
    await loaded(m, P0, P1, P2)
    assert await share_fetch(m, [P0, P1, P2], epoch=1) == {0: [(0, 49)], 1: [(0, 49)], 2: [(0, 49)]}
    await m.stop()


async def test_the_state_written_at_assignment_is_loaded_at_the_first_fetch() -> None:
    """initialize (the heartbeat's assignment) writes the state; the engines load at the fetch,
    one by one as ever."""
    writes: list[WriteState] = []

    class Empty(Persister):
        async def read_state(self, key: ShareKey) -> ShareGroupOffset | None:
            for w in writes:
                if w.key == key:
                    return ShareGroupOffset(start_offset=w.start_offset, state_epoch=w.state_epoch, state_batches=())
            return None

        async def write_state(self, write: WriteState) -> None:
            writes.append(write)

    partitions = {0: LogPartition(2), 1: LogPartition(3)}
    m = manager(partitions, Empty())
    m.initialize("g", [P0, P1])
    for _ in range(10):
        await asyncio.sleep(0)
    assert [(w.key[2], w.start_offset) for w in writes] == [(0, 0), (1, 0)] and not m.entries
    assert await share_fetch(m, [P0, P1]) == {0: [(0, 19)]}
    assert await share_fetch(m, [P0, P1], epoch=1) == {1: [(0, 29)]}
    assert len(writes) == 2  # nothing written again at the load
    await m.stop()


# ----- MaxRecords and the rotation -------------------------------------------------------
async def test_when_the_first_partition_takes_max_records_the_others_give_nothing() -> None:
    """ShareFetchUtils.processFetchResponse: each partition acquires what MaxRecords the ones
    before it left; the rotation by the session epoch serves the others first later."""
    m = manager({0: LogPartition(5), 1: LogPartition(5), 2: LogPartition(5)})
    await loaded(m, P0, P1, P2)
    parts = [P0, P1, P2]
    assert await share_fetch(m, parts, epoch=1, max_records=10) == {1: [(0, 9)]}
    assert await share_fetch(m, parts, epoch=2, max_records=10) == {2: [(0, 9)]}
    assert await share_fetch(m, parts, epoch=3, max_records=10) == {0: [(0, 9)]}
    # the first partition may take all of MaxRecords and more (whole batches: a soft limit)
    assert await share_fetch(m, parts, epoch=4, max_records=15) == {1: [(10, 29)]}
    await m.stop()


async def test_max_records_left_by_the_first_partitions_go_to_the_next() -> None:
    for record_limit, second in ((False, [(0, 9)]), (True, [(0, 4)])):
        m = manager({0: LogPartition(1), 1: LogPartition(5)})
        await loaded(m, P0, P1)
        # MaxRecords 15: 10 from the first partition, 5 left for the second: its whole first
        # batch (batch_optimized), or exactly 5 (record_limit, KIP-1206)
        assert await share_fetch(m, [P0, P1], epoch=2, max_records=15, record_limit=record_limit) == {
            0: [(0, 9)], 1: second}
        await m.stop()


async def test_every_partition_is_served_in_turn() -> None:
    """No partition starves while another always has records: with MaxRecords met by one
    partition, successive epochs start at successive partitions."""
    partitions = {i: LogPartition(20) for i in range(3)}
    m = manager(partitions)
    parts = [(TOPIC, i) for i in range(3)]
    await loaded(m, *parts)
    order = [list(await share_fetch(m, parts, epoch=e, max_records=10)) for e in range(1, 10)]
    assert order == [[1], [2], [0]] * 3
    await m.stop()


async def test_nothing_asked_nothing_given() -> None:
    """processShareFetch: MaxRecords 0 or MaxBytes 0 answers at once with no records."""
    m = manager({0: LogPartition(5)})
    await loaded(m, P0)
    assert await share_fetch(m, [P0], max_records=0, max_wait_ms=60_000) == {}
    assert await share_fetch(m, [P0], max_bytes=0, max_wait_ms=60_000) == {}
    await m.stop()


# ----- MaxBytes ---------------------------------------------------------------------------
async def test_max_bytes_is_split_evenly_between_the_partitions() -> None:
    """PartitionMaxBytesStrategy.UNIFORM: each of two partitions is read with half of MaxBytes
    (whole batches, so 3 of a budget of 3.5 batches), the first one at least one batch."""
    partitions = {0: LogPartition(10), 1: LogPartition(10)}
    m = manager(partitions)
    await loaded(m, P0, P1)
    got = await share_fetch(m, [P0, P1], epoch=2, max_bytes=7 * BATCH)
    assert got == {0: [(0, 29)], 1: [(0, 29)]}
    assert [partitions[0].reads[-1], partitions[1].reads[-1]] == uniform_partition_max_bytes(7 * BATCH, 2)
    # a first batch larger than a partition's part still comes (minOneMessage), then the limits hold
    assert await share_fetch(m, [P0, P1], epoch=2, max_bytes=BATCH) == {0: [(30, 39)]}
    await m.stop()


# ----- MinBytes and the long poll --------------------------------------------------------
async def test_min_bytes_counts_every_partition_and_waits_for_appends() -> None:
    partitions = {0: LogPartition(1), 1: LogPartition(1)}
    m = manager(partitions)
    await loaded(m, P0, P1)
    # two batches in all: MinBytes of two batches is met by the two partitions together
    assert await share_fetch(m, [P0, P1], epoch=2, min_bytes=2 * BATCH) == {0: [(0, 9)], 1: [(0, 9)]}
    # not met: nothing is acquired while the fetch waits; an append that meets it answers it
    partitions[0].append(1)
    waiting = asyncio.ensure_future(share_fetch(m, [P0, P1], epoch=3, min_bytes=2 * BATCH, max_wait_ms=60_000))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done() and m.in_flight()[("g", TOPIC, 0)] == 10
    partitions[1].append(1)
    assert await asyncio.wait_for(waiting, 5) == {0: [(10, 19)], 1: [(10, 19)]}
    await m.stop()


async def test_at_max_wait_a_fetch_answers_with_what_there_is() -> None:
    m = manager({0: LogPartition(1), 1: LogPartition(0)})
    await loaded(m, P0, P1)
    assert await share_fetch(m, [P0, P1], epoch=1, min_bytes=10 * BATCH, max_wait_ms=50) == {0: [(0, 9)]}
    await m.stop()


async def test_a_long_poll_wakes_when_records_come_back() -> None:
    """Records released by an acknowledgement answer a waiting fetch (the ack's wake-up)."""
    from broker.share.engine import AckBatch, AckType

    m = manager({0: LogPartition(1)})
    await loaded(m, P0)
    assert await share_fetch(m, [P0]) == {0: [(0, 9)]}
    waiting = asyncio.ensure_future(m.fetch("g", "other", [P0], max_wait_ms=60_000, min_bytes=1, max_bytes=1 << 20,
                                            max_records=500, batch_size=500, record_limit=False, session_epoch=1))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()
    await m.acknowledge("g", "m", {P0: [AckBatch(0, 9, [AckType.RELEASE])]})
    result = await asyncio.wait_for(waiting, 5)
    assert [(a.first_offset, a.last_offset, a.delivery_count) for a in result[P0].acquired] == [(0, 9, 2)]
    await m.stop()


async def test_min_bytes_zero_answers_at_once_one_waits_for_a_record() -> None:
    """MinBytes 0 is met by any acquirable partition, even one without records (Kafka answers at
    once); MinBytes 1 needs a record."""
    partitions = {0: LogPartition(0)}
    m = manager(partitions)
    await loaded(m, P0)
    assert await asyncio.wait_for(share_fetch(m, [P0], min_bytes=0, max_wait_ms=60_000), 5) == {}
    waiting = asyncio.ensure_future(share_fetch(m, [P0], epoch=1, min_bytes=1, max_wait_ms=60_000))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not waiting.done()
    partitions[0].append(1)
    assert await asyncio.wait_for(waiting, 5) == {0: [(0, 9)]}
    await m.stop()


async def test_min_bytes_above_max_bytes_counts_as_max_bytes() -> None:
    """KafkaApis: fetchMinBytes = min(MinBytes, MaxBytes)."""
    m = manager({0: LogPartition(1)})
    await loaded(m, P0)
    got = share_fetch(m, [P0], min_bytes=10 * BATCH, max_bytes=BATCH, max_wait_ms=60_000)
    assert await asyncio.wait_for(got, 5) == {0: [(0, 9)]}
    await m.stop()
