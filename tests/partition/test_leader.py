"""A Partition leading followers: its stored high watermark, follower fetch state, acks=all waits
and ISR changes through a fake AlterPartition manager (no network, an explicit clock)."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from broker.log import LogConfig, create_log
from broker.partition import Partition
from broker.partition.partition import LOG_END, READ_COMMITTED, READ_UNCOMMITTED
from broker.partition.replica import BrokerStatus, IsrChange, LeaderAndIsr
from protocol.errors import ErrorCode, KafkaError
from tests.log.log_helpers import Clock, batch

pytestmark = pytest.mark.timeout(20)


class FakeAlterPartition:
    """Records what is submitted; the test answers each future."""

    def __init__(self) -> None:
        self.sent: list[tuple[str, int, LeaderAndIsr, asyncio.Future[LeaderAndIsr]]] = []

    def submit(self, topic_id, topic, partition, leader_and_isr):
        future = asyncio.get_running_loop().create_future()
        self.sent.append((topic, partition, leader_and_isr, future))
        return future


def leader(tmp_path, clock: Clock, replicas=(1, 2, 3), isr=(1, 2, 3), min_isr: int | None = None,
           statuses=None) -> tuple[Partition, FakeAlterPartition]:
    extra = (("min.insync.replicas", str(min_isr)),) if min_isr is not None else ()
    log = create_log(str(tmp_path), "t", 0, LogConfig(extra=extra), time=clock)
    p = Partition("t", 0, uuid.uuid4(), log)
    p.rebuild_producer_state()
    p.local_id = 1
    p.broker_statuses = statuses
    manager = FakeAlterPartition()
    p.alter_partition = manager
    p.make_leader(3, 5, list(replicas), list(isr))
    return p, manager


def fetch(p: Partition, replica: int, offset: int, epoch: int = 7) -> None:
    """A follower's fetch as the Fetch handler does it: checked, read to the log end, recorded."""
    assert p.follower_fetch(replica, epoch, 3, offset, 0, -1) is None
    end = p.log.log_end_offset
    p.read(offset, 1 << 20, LOG_END)
    p.update_follower(replica, epoch, offset, 0, end)


async def test_a_single_node_keeps_its_high_watermark_at_the_log_end(tmp_path, clock):
    log = create_log(str(tmp_path), "t", 0, LogConfig(), time=clock)
    p = Partition("t", 0, uuid.uuid4(), log)
    await p.append(batch(3), required_acks=-1)
    assert p.followers is None and p.high_watermark == p.log.log_end_offset == 3
    assert await p.wait_replicated(3, 1.0) == ErrorCode.NONE


async def test_the_high_watermark_follows_the_slowest_in_sync_follower(tmp_path, clock):
    p, _ = leader(tmp_path, clock)
    await p.append(batch(5))
    assert p.high_watermark == 0 and p.log.log_end_offset == 5
    # consumers read below the high watermark, followers to the log end
    assert len(p.read(0, 1 << 20, READ_UNCOMMITTED).records) == 0
    assert len(p.read(0, 1 << 20, LOG_END).records) > 0
    fetch(p, 2, 5)
    assert p.high_watermark == 0
    fetch(p, 3, 2)
    assert p.high_watermark == 2
    fetch(p, 3, 5)
    assert p.high_watermark == 5 and p.last_stable_offset == 5
    assert p.fetch_bound(READ_COMMITTED) == 5


async def test_an_isr_of_one_moves_with_every_append(tmp_path, clock):
    p, _ = leader(tmp_path, clock, isr=(1,))
    await p.append(batch(4))
    assert p.high_watermark == 4


async def test_acks_all_waits_for_the_isr(tmp_path, clock):
    p, _ = leader(tmp_path, clock)
    await p.append(batch(2), required_acks=-1)
    waiting = asyncio.ensure_future(p.wait_replicated(2, 5.0))
    await asyncio.sleep(0)
    assert not waiting.done()
    fetch(p, 2, 2)
    await asyncio.sleep(0)
    assert not waiting.done()
    fetch(p, 3, 2)
    assert await asyncio.wait_for(waiting, 1.0) == ErrorCode.NONE


async def test_acks_all_times_out(tmp_path, clock):
    p, _ = leader(tmp_path, clock)
    await p.append(batch(1), required_acks=-1)
    assert await p.wait_replicated(1, 0.05) == ErrorCode.REQUEST_TIMED_OUT
    assert p._delayed_produces == []


async def test_acks_all_ends_when_the_leadership_goes(tmp_path, clock):
    p, _ = leader(tmp_path, clock)
    await p.append(batch(1), required_acks=-1)
    waiting = asyncio.ensure_future(p.wait_replicated(1, 5.0))
    await asyncio.sleep(0)
    p.make_follower(2, 4, 6, [1, 2, 3], [2, 3])
    assert await asyncio.wait_for(waiting, 1.0) == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_not_enough_replicas_before_the_append(tmp_path, clock):
    p, _ = leader(tmp_path, clock, isr=(1,), min_isr=2)
    with pytest.raises(KafkaError) as e:
        await p.append(batch(1), required_acks=-1)
    assert e.value.code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert p.log.log_end_offset == 0
    await p.append(batch(1), required_acks=1)  # acks=1 still writes
    # and under min.insync.replicas the high watermark does not move (KIP-966)
    assert p.high_watermark == 0


async def test_min_insync_replicas_is_capped_by_the_replicas(tmp_path, clock):
    p, _ = leader(tmp_path, clock, replicas=(1, 2), isr=(1, 2), min_isr=3)
    assert p.min_insync_replicas() == 2
    await p.append(batch(1), required_acks=-1)


async def test_a_caught_up_follower_joins_the_isr_through_alter_partition(tmp_path, clock):
    statuses = {2: BrokerStatus(7), 3: BrokerStatus(9)}.get
    p, manager = leader(tmp_path, clock, isr=(1, 2), statuses=statuses)
    await p.append(batch(3))
    fetch(p, 2, 3)
    assert p.high_watermark == 3
    fetch(p, 3, 1, epoch=9)  # behind the high watermark: not yet
    assert manager.sent == []
    fetch(p, 3, 3, epoch=9)
    (_, _, sent, future), = manager.sent
    assert sent == LeaderAndIsr(1, 3, (1, 2, 3), 5, (-1, 7, 9))
    assert p.isr_state.change is IsrChange.EXPAND and p.isr_state.maximal_isr == {1, 2, 3}
    # meanwhile the new member already counts for the high watermark
    await p.append(batch(1))
    fetch(p, 2, 4)
    assert p.high_watermark == 3
    future.set_result(LeaderAndIsr(1, 3, (1, 2, 3), 6))
    await asyncio.sleep(0)
    assert p.isr_state.change is IsrChange.NONE and p.isr == [1, 2, 3] and p.partition_epoch == 6


async def test_a_follower_with_a_stale_broker_epoch_is_refused(tmp_path, clock):
    p, _ = leader(tmp_path, clock, statuses={2: BrokerStatus(8), 3: BrokerStatus(8)}.get)
    with pytest.raises(KafkaError) as e:
        p.update_follower(2, 7, 0, 0, 0)
    assert e.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_a_lagging_follower_leaves_the_isr(tmp_path, clock):
    p, manager = leader(tmp_path, clock)
    await p.append(batch(2))
    fetch(p, 2, 2)
    fetch(p, 3, 1)
    clock.advance(20_000)
    p.maybe_shrink_isr()
    assert manager.sent == []
    clock.advance(11_000)
    fetch(p, 2, 2)
    p.maybe_shrink_isr()
    (_, _, sent, future), = manager.sent
    assert sent.isr == (1, 2)
    assert p.high_watermark == 1  # a pending shrink does not count yet
    future.set_result(LeaderAndIsr(1, 3, (1, 2), 6))
    await asyncio.sleep(0)
    assert p.isr == [1, 2] and p.high_watermark == 2


async def test_a_refused_change_goes_back_to_the_committed_isr(tmp_path, clock):
    p, manager = leader(tmp_path, clock)
    clock.advance(31_000)
    p.maybe_shrink_isr()
    (_, _, _, future), = manager.sent
    future.set_exception(KafkaError(ErrorCode.INVALID_UPDATE_VERSION, ""))
    await asyncio.sleep(0)
    assert p.isr_state.in_flight  # pending until the metadata says more
    p.make_leader(3, 6, [1, 2, 3], [1, 2, 3])
    assert not p.isr_state.in_flight
    p.maybe_shrink_isr()
    future = manager.sent[-1][3]
    future.set_exception(KafkaError(ErrorCode.OPERATION_NOT_ATTEMPTED, ""))
    await asyncio.sleep(0)
    assert p.isr_state.isr == (1, 2, 3) and not p.isr_state.in_flight


async def test_an_unknown_replica(tmp_path, clock):
    p, _ = leader(tmp_path, clock)
    with pytest.raises(KafkaError) as e:
        p.follower_fetch(4, 1, 3, 0, 0, -1)
    assert e.value.code == ErrorCode.UNKNOWN_LEADER_EPOCH
    with pytest.raises(KafkaError) as e:
        p.follower_fetch(4, 1, -1, 0, 0, -1)
    assert e.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_a_diverging_follower_is_told_where_to_truncate(tmp_path, clock):
    p, _ = leader(tmp_path, clock)
    await p.append(batch(4))  # epoch 3 from offset 0
    p.make_leader(5, 6, [1, 2, 3], [1, 2, 3])  # epoch 5 from offset 4
    await p.append(batch(2))
    # the follower has epoch 4 up to 6 (a leader we never knew): our epoch 3 ends at 4
    assert p.follower_fetch(2, 7, 5, 6, 0, 4) == (3, 4)
    assert p.follower_fetch(2, 7, 5, 4, 0, 3) is None
    assert p.follower_fetch(2, 7, 5, 6, 0, 5) is None
    with pytest.raises(KafkaError) as e:
        p.follower_fetch(2, 7, 5, 6, 0, 9)
    assert e.value.code == ErrorCode.OFFSET_OUT_OF_RANGE


async def test_a_restarted_leader_starts_from_its_checkpointed_high_watermark(tmp_path, clock):
    """After a crash the records the leader had not replicated stay hidden (Kafka keeps the high
    watermark in replication-offset-checkpoint; without one it starts at 0)."""
    log = create_log(str(tmp_path), "t", 0, LogConfig(), time=clock)
    p = Partition("t", 0, uuid.uuid4(), log, high_watermark=2)  # as PartitionManager.ensure reads the checkpoint
    await p.append(batch(5))
    assert p.high_watermark == 5  # alone, before the metadata says otherwise
    p.local_id, p.alter_partition = 1, FakeAlterPartition()
    p.make_leader(3, 5, [1, 2], [1, 2])
    assert p.high_watermark == 2
    fetch(p, 2, 5)
    assert p.high_watermark == 5


async def test_the_log_manager_keeps_high_watermarks_across_a_restart(tmp_path, clock):
    from broker.log import LogManager
    from broker.partition import PartitionManager

    logs = LogManager([str(tmp_path)], time=clock)
    logs.startup()
    partitions = PartitionManager(logs)
    p = partitions.ensure("t", 0, uuid.uuid4())
    await p.append(batch(4))
    logs.high_watermarks = partitions.high_watermark_of
    logs.checkpoint()
    assert (tmp_path / "replication-offset-checkpoint").read_text().splitlines() == ["0", "1", "t 0 4"]
    logs.shutdown()
    again = LogManager([str(tmp_path)], time=clock)
    again.startup()
    assert again.checkpointed_high_watermarks == {("t", 0): 4}
    assert PartitionManager(again).ensure("t", 0, uuid.uuid4())._high_watermark == 4
    again.shutdown()


async def test_only_the_leader_appends_records_and_markers(tmp_path, clock):
    """A follower refuses what only a leader may write (Kafka's appendRecordsToLeader): a client's
    batch, a transaction marker (the fault runs found a marker appended by a follower, in its
    leader's epoch, that truncation could not find), a coordinator's records."""
    p, _ = leader(tmp_path, clock)
    p.make_follower(2, 4, 6, [1, 2, 3], [1, 2, 3])
    with pytest.raises(KafkaError) as exc:
        p.append_records(batch(1))
    assert exc.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    with pytest.raises(KafkaError) as exc:
        p.append_marker(1000, 0, committed=False)
    assert exc.value.code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert p.log.log_end_offset == 0


async def test_a_failed_change_answered_after_the_partition_moved_on_is_not_left_unretrieved(tmp_path, clock):
    """An ISR change whose answer (here a refusal) comes after the metadata changed the partition
    is out of date and ignored, but its error is still taken (the fault runs' brokers logged
    hundreds of "Future exception was never retrieved" for them)."""
    import gc

    lost: list[object] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _loop, context: lost.append(context.get("message")))
    try:
        p, manager = leader(tmp_path, clock)
        clock.advance(31_000)
        p.maybe_shrink_isr()
        (_, _, _, future), = manager.sent
        p.make_follower(2, 4, 6, [1, 2, 3], [2, 3])  # the partition moved on
        future.set_exception(KafkaError(ErrorCode.OPERATION_NOT_ATTEMPTED, ""))
        await asyncio.sleep(0)
        manager.sent.clear()
        del future
        gc.collect()
        assert lost == []
    finally:
        loop.set_exception_handler(None)


async def test_truncating_to_the_log_end_drops_an_epoch_begun_there(tmp_path, clock):
    """A replica that led in an epoch without appending anything keeps that epoch at its log end;
    as a follower, told that its history diverges at its own end, it must drop that epoch (as
    Kafka's truncateTo does even when there is nothing to remove), else it fetches with it again
    and is told the same again, forever (found by the fault runs: a follower that never caught up,
    a high watermark that never moved, a transaction that never completed)."""
    p, _ = leader(tmp_path, clock)
    await p.append(batch(3))
    p.make_leader(9, 7, [1, 2, 3], [1, 2, 3])  # a new epoch begins at the log end, nothing appended
    assert p.log.epoch_cache.latest_epoch == 9
    p.make_follower(2, 10, 8, [1, 2, 3], [2, 3])
    p.truncate_to(p.log.log_end_offset)  # the leader: your epoch 3 ends at 3
    assert p.log.epoch_cache.latest_epoch == 3 and p.log.log_end_offset == 3
