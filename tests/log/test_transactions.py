"""Transactions in a partition: producer state, markers, the last stable offset, the aborted-
transaction index (.txnindex, Kafka's layout) across rolls, restarts and crash recovery."""

from __future__ import annotations

import os
import struct
import uuid

import pytest

from broker.log import Log, create_log
from broker.log.txn_index import ENTRY_SIZE, AbortedTxn
from broker.partition import READ_COMMITTED, READ_UNCOMMITTED, Partition
from protocol.errors import ErrorCode, KafkaError
from protocol.records import iter_batches
from tests.log.log_helpers import Clock, batch, reopen, small_config

E = ErrorCode


def txn_batch(pid: int, seq: int, n: int = 1, epoch: int = 0, size: int = 40) -> bytes:
    return batch(n, producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True, size=size)


def plain(n: int = 1) -> bytes:
    return batch(n)


def partition_of(log: Log) -> Partition:
    p = Partition(log.topic, log.partition, uuid.uuid4(), log)
    p.rebuild_producer_state()
    return p


@pytest.fixture
def part(tmp_path, clock: Clock) -> Partition:
    return partition_of(create_log(str(tmp_path), "t", 0, small_config(), time=clock))


def append_txn(p: Partition, records: bytes) -> int:
    """A transactional append that opens (or continues) a transaction: verified as the produce path does."""
    header = next(iter(iter_batches(records)))[1]
    guard = p.start_verification(header.producer_id) if p.needs_verification(header) else None
    return p.append_records(records, guard).base_offset


def test_lso_stops_at_the_oldest_open_transaction(part: Partition) -> None:
    part.append_records(plain(2))                       # 0-1
    assert append_txn(part, txn_batch(7, 0, 2)) == 2    # 2-3, pid 7 opens at 2
    part.append_records(plain())                        # 4
    assert append_txn(part, txn_batch(8, 0)) == 5       # 5, pid 8 opens at 5
    assert (part.high_watermark, part.last_stable_offset) == (6, 2)
    assert part.fetch_bound(READ_COMMITTED) == 2 and part.fetch_bound(READ_UNCOMMITTED) == 6
    info = part.read(0, 1 << 20, READ_COMMITTED)
    assert [h.base_offset for _, h in iter_batches(info.records.read())] == [0]
    assert info.next_offset == 2
    part.append_marker(7, 0, committed=True)            # 6: COMMIT of pid 7
    assert part.last_stable_offset == 5
    part.append_marker(8, 0, committed=False)           # 7: ABORT of pid 8
    assert part.last_stable_offset == part.high_watermark == 8
    assert part.aborted_transactions(0, 8) == [AbortedTxn(8, 5, 7, 8)]
    assert part.aborted_transactions(0, 5) == []  # the range ends before it starts
    assert part.aborted_transactions(8, 9) == []  # it ended before the range


def test_the_lso_recorded_for_an_abort_is_the_next_open_transaction(part: Partition) -> None:
    append_txn(part, txn_batch(1, 0))   # 0
    append_txn(part, txn_batch(2, 0))   # 1
    part.append_marker(2, 0, committed=False)  # 2: pid 1 still open from 0
    assert part.aborted_transactions(0, 3) == [AbortedTxn(2, 1, 2, 0)]


def test_transactional_batches_need_a_verification(part: Partition) -> None:
    with pytest.raises(KafkaError) as exc:
        part.append_records(txn_batch(7, 0))
    assert exc.value.code == E.INVALID_TXN_STATE
    guard = part.start_verification(7)
    part.append_marker(7, 0, committed=False)  # e.g. the coordinator aborted it meanwhile
    with pytest.raises(KafkaError) as exc:
        part.append_records(txn_batch(7, 0), guard)
    assert exc.value.code == E.INVALID_TXN_STATE
    assert part.high_watermark == 1  # only the marker
    append_txn(part, txn_batch(7, 0))
    part.append_records(txn_batch(7, 1))  # the transaction is open here: no verification


def test_a_producer_in_a_transaction_writes_only_transactional_batches(part: Partition) -> None:
    append_txn(part, txn_batch(7, 0))
    with pytest.raises(KafkaError) as exc:
        part.append_records(batch(1, producer_id=7, producer_epoch=0, base_sequence=1))
    assert exc.value.code == E.INVALID_TXN_STATE


def test_markers_check_the_epoch(part: Partition) -> None:
    append_txn(part, txn_batch(7, 0, epoch=3))
    with pytest.raises(KafkaError) as exc:
        part.append_marker(7, 2, committed=True)
    assert exc.value.code == E.INVALID_PRODUCER_EPOCH
    with pytest.raises(KafkaError) as exc:  # transactions v2: the marker must bump the epoch
        part.append_marker(7, 3, committed=True, transaction_version=2)
    assert exc.value.code == E.INVALID_PRODUCER_EPOCH
    part.append_marker(7, 4, committed=True, transaction_version=2)
    part.append_marker(7, 4, committed=True, transaction_version=2)  # a retried marker is written again
    with pytest.raises(KafkaError) as exc:  # the producer's old epoch is fenced
        part.append_records(txn_batch(7, 1, epoch=3))
    assert exc.value.code == E.INVALID_PRODUCER_EPOCH
    # a marker for a producer this partition never saw is written (it opens nothing)
    part.append_marker(99, 0, committed=False)
    assert part.last_stable_offset == part.high_watermark


def test_txnindex_file_layout(part: Partition) -> None:
    append_txn(part, txn_batch(5, 0))
    part.append_marker(5, 0, committed=False)
    path = part.log.active_segment.txn_index.path
    assert path.endswith("00000000000000000000.txnindex")
    data = open(path, "rb").read()
    assert len(data) == ENTRY_SIZE == 34
    assert struct.unpack(">hqqqq", data) == (0, 5, 0, 1, 2)


def test_aborted_transactions_span_segments_and_survive_restarts(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(segment_bytes=1024), time=clock)
    p = partition_of(log)
    append_txn(p, txn_batch(1, 0, size=200))
    for seq in range(1, 8):  # several segments
        p.append_records(txn_batch(1, seq, size=200))
    p.append_marker(1, 0, committed=False)
    assert len(log.segments) > 2
    end = log.log_end_offset
    expected = [AbortedTxn(1, 0, end - 1, end)]
    assert p.aborted_transactions(0, end) == expected
    assert p.aborted_transactions(3, end) == expected  # a fetch in the middle of the transaction
    # the entry is in the segment of the marker
    assert [s.base_offset for s in log.segments if not s.txn_index.is_empty()] == [log.segments[-1].base_offset]
    log.close()
    p2 = partition_of(reopen(log, clean=True, clock=clock))
    assert p2.aborted_transactions(0, end) == expected
    assert p2.last_stable_offset == end


def test_open_transactions_survive_a_restart(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(), time=clock)
    p = partition_of(log)
    p.append_records(plain())
    append_txn(p, txn_batch(3, 0))
    log.close()
    p2 = partition_of(reopen(log, clean=True, clock=clock))
    assert p2.last_stable_offset == 1 and p2.high_watermark == 2
    p2.append_records(txn_batch(3, 1))  # still open: no verification needed
    p2.append_marker(3, 0, committed=False)
    assert p2.aborted_transactions(0, 4) == [AbortedTxn(3, 1, 3, 4)]


def test_crash_recovery_rebuilds_the_txnindex(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(), time=clock)
    p = partition_of(log)
    append_txn(p, txn_batch(1, 0))
    p.append_marker(1, 0, committed=False)
    append_txn(p, txn_batch(2, 0))
    p.append_marker(2, 0, committed=True)
    append_txn(p, txn_batch(1, 1, epoch=0))
    p.append_marker(1, 0, committed=False)
    expected = p.aborted_transactions(0, 100)
    assert len(expected) == 2
    # the index is lost (never flushed) and the broker dies
    os.unlink(log.active_segment.txn_index.path)
    p3 = partition_of(reopen(log, clean=False, clock=clock))
    assert p3.aborted_transactions(0, 100) == expected
    assert os.path.getsize(p3.log.active_segment.txn_index.path) == 2 * ENTRY_SIZE


def test_truncation_drops_index_entries(part: Partition) -> None:
    append_txn(part, txn_batch(1, 0))
    part.append_marker(1, 0, committed=False)  # 1
    append_txn(part, txn_batch(2, 0))          # 2
    part.append_marker(2, 0, committed=False)  # 3
    part.log.truncate_to(3)
    assert part.aborted_transactions(0, 10) == [AbortedTxn(1, 0, 1, 2)]


def test_control_batches_from_clients_are_refused(part: Partition) -> None:
    from protocol.records import build_control_batch

    with pytest.raises(KafkaError) as exc:
        part.append_records(build_control_batch("COMMIT", 1, 0, 0))
    assert exc.value.code == E.INVALID_RECORD


def test_read_committed_never_returns_a_batch_beyond_the_lso(part: Partition) -> None:
    append_txn(part, txn_batch(1, 0))
    part.append_records(plain())
    assert part.read(0, 1 << 20, READ_COMMITTED).records.length == 0
    assert len(part.read(1, 1 << 20, READ_UNCOMMITTED).records) > 0


# ----- producer-state snapshots --------------------------------------------------------------
def snapshots(log: Log) -> list[str]:
    return sorted(n for n in os.listdir(log.dir) if n.endswith(".snapshot"))


def state(p: Partition) -> dict[int, tuple[int, int, int, int]]:
    return {pid: (e.epoch, e.last_seq, e.current_txn_first_offset, e.coordinator_epoch)
            for pid, e in p.producers.producers.items()}


def test_a_clean_restart_starts_from_the_snapshot(tmp_path, clock: Clock) -> None:
    import crc32c

    log = create_log(str(tmp_path), "t", 0, small_config(), time=clock)
    p = partition_of(log)
    p.append_records(batch(2, producer_id=4, producer_epoch=1, base_sequence=0))  # idempotent
    append_txn(p, txn_batch(5, 0))                                             # open transaction
    append_txn(p, txn_batch(6, 0))
    p.append_marker(6, 0, committed=True)
    before = state(p)
    p.take_snapshot()
    assert snapshots(log) == ["%020d.snapshot" % log.log_end_offset]
    data = open(os.path.join(log.dir, snapshots(log)[0]), "rb").read()
    version, crc, count = struct.unpack_from(">hIi", data)
    assert (version, count, crc) == (1, 3, crc32c.crc32c(data[6:]))
    log.close()
    log2 = reopen(log, clean=True, clock=clock)
    for seg in log2.segments:  # nothing is read from the log
        seg.iter_batches_from = None  # type: ignore[method-assign]
    p2 = partition_of(log2)
    assert state(p2) == before
    assert p2.last_stable_offset == 2
    # a retry of the idempotent producer's last batch is still recognised
    assert p2.append_records(batch(2, producer_id=4, producer_epoch=1, base_sequence=0)).base_offset == 0


def test_a_roll_writes_a_snapshot_and_a_crash_replays_after_it(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(segment_bytes=1024), time=clock)
    p = partition_of(log)
    append_txn(p, txn_batch(1, 0, size=300))
    for seq in range(1, 6):
        p.append_records(txn_batch(1, seq, size=300))
    assert len(log.segments) > 1 and snapshots(log)
    assert len(snapshots(log)) <= 2  # only the latest are kept
    p.append_marker(1, 0, committed=False)
    expected = p.aborted_transactions(0, 100)
    before = state(p)
    p2 = partition_of(reopen(log, clean=False, clock=clock, recovery_point=log.segments[-1].base_offset))
    assert state(p2) == before
    assert p2.aborted_transactions(0, 100) == expected


def test_unusable_snapshots_are_ignored(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(), time=clock)
    p = partition_of(log)
    append_txn(p, txn_batch(1, 0))
    before = state(p)
    p.take_snapshot()
    path = os.path.join(log.dir, snapshots(log)[0])
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(b"\xff")  # corrupt
    with open(os.path.join(log.dir, "%020d.snapshot" % 99), "wb") as f:
        f.write(b"beyond the log end")
    log.close()
    p2 = partition_of(reopen(log, clean=True, clock=clock))
    assert state(p2) == before
    assert snapshots(p2.log) == []  # both removed


# ----- compaction ------------------------------------------------------------------------------
def test_compaction_removes_aborted_data_then_the_markers(tmp_path, clock: Clock) -> None:
    from broker.log import LogCleaner

    config = small_config(segment_bytes=700, cleanup_policy=("compact",), delete_retention_ms=1000)
    log = create_log(str(tmp_path), "c", 0, config, time=clock)
    p = partition_of(log)

    def keyed(key: bytes, **kw: object) -> bytes:
        return batch([b"v"], keys=[key], **kw)

    p.append_records(keyed(b"plain"))
    aborted_first = append_txn(p, keyed(b"a", producer_id=1, producer_epoch=0, base_sequence=0, is_transactional=True))
    p.append_marker(1, 0, committed=False)
    append_txn(p, keyed(b"c", producer_id=2, producer_epoch=0, base_sequence=0, is_transactional=True))
    p.append_marker(2, 0, committed=True)
    for i in range(12):  # later batches of both producers and fillers: the markers are not their last batches
        p.append_records(keyed(b"f%d" % (i % 2)))
    append_txn(p, keyed(b"a", producer_id=1, producer_epoch=0, base_sequence=1, is_transactional=True))
    p.append_marker(1, 0, committed=True)
    append_txn(p, keyed(b"c", producer_id=2, producer_epoch=0, base_sequence=1, is_transactional=True))
    p.append_marker(2, 0, committed=True)
    log.roll()
    abort_marker = [t.last_offset for t in p.aborted_transactions(0, 100)]
    assert len(abort_marker) == 1
    cleaner = LogCleaner(time=clock)

    def markers() -> list[tuple[int, int, bool]]:
        return [(h.base_offset, h.records_count, h.has_delete_horizon)
                for h in (h for _, h in iter_batches(read(log))) if h.is_control]

    # round 1: the aborted data goes; its marker stays (data was there) with its index entry
    cleaner.clean(log, force=True)
    assert all(h.base_offset != aborted_first for _, h in iter_batches(read(log)) if not h.is_control)
    assert [m[0] for m in markers()][:2] == [abort_marker[0], abort_marker[0] + 2]
    assert p.aborted_transactions(0, 100) == [AbortedTxn(1, aborted_first, abort_marker[0], abort_marker[0] + 1)]
    # round 2: no data left behind the first two markers: they get a delete horizon
    cleaner.clean(log, force=True)
    assert markers()[:2] == [(abort_marker[0], 1, True), (abort_marker[0] + 2, 1, True)]
    assert p.aborted_transactions(0, 100) == []
    # round 3, past the horizon: they are gone; the later markers (with data) stay
    clock.advance(2000)
    cleaner.clean(log, force=True)
    assert [m[0] for m in markers()] == [abort_marker[0] + 16, abort_marker[0] + 18]


def read(log: Log) -> bytes:
    out = bytearray()
    offset = log.log_start_offset
    while offset < log.log_end_offset:
        data = log.read_bytes(offset, 1 << 20)
        if not data:
            break
        out += data
        offset = [h for _, h in iter_batches(data)][-1].next_offset
    return bytes(out)


def test_compaction_stops_at_the_last_stable_offset(tmp_path, clock: Clock) -> None:
    from broker.log import LogCleaner

    config = small_config(segment_bytes=700, cleanup_policy=("compact",))
    log = create_log(str(tmp_path), "c", 0, config, time=clock)
    p = partition_of(log)
    p.append_records(batch([b"1"], keys=[b"k"]))
    append_txn(p, batch([b"open"], keys=[b"t"], producer_id=3, producer_epoch=0, base_sequence=0,
                        is_transactional=True))
    for _ in range(20):
        p.append_records(batch([b"2"], keys=[b"k"]))
    log.roll()
    result = LogCleaner(time=clock).clean(log, first_unstable_offset=p.last_stable_offset, force=True)
    assert result is None or result.end_offset <= p.last_stable_offset
    assert len([h for _, h in iter_batches(read(log)) if h.base_offset == 0]) == 1  # nothing cleaned


def test_retention_takes_the_txnindex_with_its_segment(tmp_path, clock: Clock) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config(segment_bytes=1024), time=clock)
    p = partition_of(log)
    append_txn(p, txn_batch(1, 0, size=400))
    p.append_marker(1, 0, committed=False)
    first = log.segments[0]
    assert not first.txn_index.is_empty()
    for _ in range(4):
        p.append_records(batch(1, size=400))
    path = first.txn_index.path
    log.delete_records_before(log.segments[-1].base_offset)
    log.delete_pending_files(force=True)
    assert not os.path.exists(path) and p.aborted_transactions(0, 100) == []


def test_a_verified_batch_starts_no_later_than_the_lowest_sequence_seen_kip_890(part: Partition) -> None:
    # transactions v2: a producer without state here starts at sequence 0
    guard = part.start_verification(7, 3, supports_epoch_bump=True)
    with pytest.raises(KafkaError) as exc:
        part.append_records(txn_batch(7, 3), guard)
    assert exc.value.code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert exc.value.message == ("Invalid sequence number for producer 7 at offset 0 in partition t-0: 3 (incoming "
                                 "seq. number). Expected sequence 0 for transactions v2 idempotent producer with no "
                                 "existing state.")
    # requests verified together keep the lowest sequence: a later one may not start past it
    part.append_records(batch(1, producer_id=8, producer_epoch=0, base_sequence=0))
    guard = part.start_verification(8, 1)
    part.start_verification(8, 0)
    with pytest.raises(KafkaError) as exc:
        part.append_records(txn_batch(8, 1), guard)
    assert exc.value.code == E.OUT_OF_ORDER_SEQUENCE_NUMBER and "0 (earliest seen sequence)" in (exc.value.message or "")
    assert part.high_watermark == 1
