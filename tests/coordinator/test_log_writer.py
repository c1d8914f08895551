"""The coordinator on the storage engine: offsets and groups survive reopening the logs,
compaction keeps the state, and the flush policy is honoured."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from broker.coordinator.group import create_group_coordinator
from broker.coordinator.group.shard import GroupCoordinatorShard
from broker.coordinator.log_writer import LogPartitionWriter, internal_topic_log_config
from broker.coordinator.timer import ManualClock
from broker.log import Log, LogCleaner, LogConfig, create_log, load_log
from protocol import messages as M
from tests.coordinator.harness import ShardHarness
from tests.coordinator.test_replay import persisted_view

TOPIC = "__consumer_offsets"


class Logs:
    def __init__(self, root: str, config: LogConfig) -> None:
        self.root = root
        self.config = config
        self.logs: dict[int, Log] = {}

    def log_for(self, partition: int) -> Log:
        log = self.logs.get(partition)
        if log is None:
            path = os.path.join(self.root, f"{TOPIC}-{partition}")
            if os.path.isdir(path):
                log, _ = load_log(path, self.config, had_clean_shutdown=False)
            else:
                log = create_log(self.root, TOPIC, partition, self.config)
            self.logs[partition] = log
        return log

    def close(self) -> None:
        for log in self.logs.values():
            log.close()
        self.logs.clear()


def commit_request(group_id: str, offset: int) -> Any:
    return M.OffsetCommitRequest(group_id=group_id, topics=[M.OffsetCommitRequest.OffsetCommitRequestTopic(
        name="t", partitions=[M.OffsetCommitRequest.OffsetCommitRequestPartition(
            partition_index=0, committed_offset=offset, committed_metadata="")])])


async def fetch(coordinator: Any, group_id: str) -> int:
    r = await coordinator.fetch_offsets(M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id=group_id, topics=None),
                                        False)
    return int(r.topics[0].partitions[0].committed_offset) if r.topics else -1


async def test_offsets_survive_reopening_the_log(tmp_path: Any) -> None:
    config = internal_topic_log_config(LogConfig(), segment_bytes=1 << 20)
    assert config.compact
    logs = Logs(str(tmp_path), config)
    values = {"offsets.topic.num.partitions": 3}
    coordinator = create_group_coordinator(LogPartitionWriter(logs.log_for), values, ManualClock(1000))
    await coordinator.start()
    for i in range(20):
        await coordinator.commit_offsets(commit_request("g%d" % (i % 4), i), 8)
    await coordinator.delete_groups(["g3"])
    await coordinator.stop()
    logs.close()  # as after kill -9: nothing flushed, the data is in the OS page cache

    coordinator = create_group_coordinator(LogPartitionWriter(logs.log_for), values, ManualClock(2000))
    await coordinator.start()
    assert [await fetch(coordinator, "g%d" % i) for i in range(4)] == [16, 17, 18, -1]
    await coordinator.stop()
    logs.close()


async def test_flush_policy_fsyncs_with_group_commit(tmp_path: Any) -> None:
    config = internal_topic_log_config(LogConfig()).with_overrides({"flush.messages": "1"})
    logs = Logs(str(tmp_path), config)
    writer = LogPartitionWriter(logs.log_for)
    await writer.append(0, [(b"\x00\x01k", b"v")])
    assert logs.log_for(0).recovery_point == logs.log_for(0).log_end_offset == 1
    assert list(writer.read(0)) == [[(b"\x00\x01k", b"v")]]  # a batch of plain records
    logs.close()


async def test_compaction_keeps_the_state(tmp_path: Any) -> None:
    config = dataclasses.replace(  # small segments (below what a topic config may ask) to have some to clean
        internal_topic_log_config(LogConfig()).with_overrides(
            {"min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0"}),
        segment_bytes=4096)
    logs = Logs(str(tmp_path), config)
    writer = LogPartitionWriter(logs.log_for)
    h = ShardHarness()
    (a, b), gen = h.form_group("g", 2)
    for i in range(300):
        h.commit("g", {("t", i % 5): i}, generation=gen, member_id=a)
        h.commit("simple%d" % (i % 7), {("u", 0): i})
    h.run(lambda s, now: s.delete_groups(["simple0"], now))
    for key, value in h.log:
        await writer.append(0, [(key, value)])
    log = logs.log_for(0)
    assert len(log.segments) > 2
    before = log.size
    LogCleaner().clean(log, force=True)
    assert log.size < before

    loaded = GroupCoordinatorShard(h.timer, h.config)
    for batch in writer.read(0):  # plain records only: one list per batch
        assert isinstance(batch, list)
        loaded.replay_batch(batch, loaded.replay)
    assert persisted_view(loaded) == persisted_view(h.shard)
    logs.close()


async def test_transactional_batches_and_markers_round_trip(tmp_path: Any) -> None:
    from broker.coordinator.result import TransactionalRecord, TxnMarker
    from protocol.records import iter_batches

    logs = Logs(str(tmp_path), internal_topic_log_config(LogConfig()))
    writer = LogPartitionWriter(logs.log_for)
    assert writer.write(0, [(b"\x00\x01a", b"1")]) is None
    writer.write(0, [(b"\x00\x01b", b"2"), (b"\x00\x01c", None)], producer=(42, 3))
    writer.write_marker(0, TxnMarker(42, 3, False, 0))
    assert list(writer.read(0)) == [
        [(b"\x00\x01a", b"1")], TransactionalRecord(42, b"\x00\x01b", b"2"), TransactionalRecord(42, b"\x00\x01c", None),
        TxnMarker(42, 3, False, 0)]
    headers = [h for _, h in iter_batches(logs.log_for(0).read_bytes(0, 1 << 20))]
    assert [(h.is_transactional, h.is_control, h.producer_id, h.producer_epoch) for h in headers] == [
        (False, False, -1, -1), (True, False, 42, 3), (True, True, 42, 3)]
    logs.close()


async def test_transactional_offsets_survive_reopening_the_log(tmp_path: Any) -> None:
    config = internal_topic_log_config(LogConfig())
    logs = Logs(str(tmp_path), config)
    values = {"offsets.topic.num.partitions": 1}
    coordinator = create_group_coordinator(LogPartitionWriter(logs.log_for), values, ManualClock(1000))
    await coordinator.start()
    R = M.TxnOffsetCommitRequest

    def txn(pid: int, offset: int) -> Any:
        return R(transactional_id="t%d" % pid, group_id="g", producer_id=pid, producer_epoch=0, topics=[
            R.TxnOffsetCommitRequestTopic(name="t", partitions=[R.TxnOffsetCommitRequestPartition(
                partition_index=0, committed_offset=offset, committed_metadata="")])])

    await coordinator.commit_transactional_offsets(txn(1, 10), 0)
    await coordinator.complete_transaction(0, 1, 0, True)
    await coordinator.commit_transactional_offsets(txn(2, 20), 0)  # left open
    await coordinator.stop()
    logs.close()

    coordinator = create_group_coordinator(LogPartitionWriter(logs.log_for), values, ManualClock(2000))
    await coordinator.start()
    assert await fetch(coordinator, "g") == 10
    stable = await coordinator.fetch_offsets(M.OffsetFetchRequest.OffsetFetchRequestGroup(group_id="g", topics=None),
                                             True)
    assert stable.topics[0].partitions[0].error_code == 88  # UNSTABLE_OFFSET_COMMIT
    await coordinator.complete_transaction(0, 2, 0, True)
    assert await fetch(coordinator, "g") == 20
    await coordinator.stop()
    logs.close()
