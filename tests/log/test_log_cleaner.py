"""Compaction: latest value per key, offsets kept, tombstones and delete horizons, producer state,
aborted transactions, codecs, safety with concurrent reads and appends."""

from __future__ import annotations

import os
import threading

import pytest

from broker.log import AppendOrigin, Log, LogCleaner
from protocol.records import (
    build_batch,
    build_control_batch,
    decode_batch,
    iter_batches,
)
from tests.log.log_helpers import Clock, files, new_log, read_all, reopen, small_config


def compacted(tmp_path, clock: Clock, **cfg: object) -> Log:
    config = small_config(segment_bytes=700, cleanup_policy=("compact",), delete_retention_ms=1000, **cfg)
    return new_log(tmp_path, clock, config)


def put(log: Log, clock: Clock, key: bytes, value: bytes | None, **kwargs: object) -> int:
    origin = kwargs.pop("origin", AppendOrigin.CLIENT)
    return log.append(build_batch([(key, value, (), clock.now)], **kwargs), origin=origin).first_offset  # type: ignore[arg-type]


def records(log: Log) -> list[tuple[int, bytes | None, bytes | None]]:
    data = read_all(log)
    out: list[tuple[int, bytes | None, bytes | None]] = []
    for pos, _ in iter_batches(data):
        out.extend((r.offset, r.key, r.value) for r in decode_batch(data, pos)[1])
    return out


def headers(log: Log):  # type: ignore[no-untyped-def]
    return [h for _, h in iter_batches(read_all(log))]


def test_keeps_latest_value_per_key_and_offsets(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    expected: dict[bytes, tuple[int, bytes]] = {}
    written = []
    for i in range(60):
        key = b"k%d" % (i % 7)
        value = b"v%d" % i
        expected[key] = (put(log, clock, key, value), value)
        written.append((expected[key][0], key, value))
    active = log.active_segment.base_offset
    before = records(log)
    result = LogCleaner(time=clock).clean(log)
    assert result is not None and result.segments_written >= 1
    assert result.end_offset == active
    after = records(log)
    # Below the active segment exactly the latest record of each key (within that range) survives.
    latest_below = {k: (o, k, v) for o, k, v in written if o < active}
    assert [r for r in after if r[0] < active] == sorted(latest_below.values())
    # Every key's latest value is still there, with its offset.
    for key, (offset, value) in expected.items():
        assert (offset, key, value) in after
    # The active segment is untouched; offsets only grow.
    assert [r for r in after if r[0] >= active] == [r for r in before if r[0] >= active]
    offsets = [r[0] for r in after]
    assert offsets == sorted(set(offsets))
    assert log.cleaner_checkpoint == result.end_offset
    assert not [n for n in files(log) if n.endswith((".cleaned", ".swap"))]
    assert log.log_end_offset == 60


def test_dirty_ratio_and_min_lag(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock, min_cleanable_dirty_ratio=0.99)
    for i in range(40):
        put(log, clock, b"k%d" % (i % 3), b"v")
    cleaner = LogCleaner(time=clock)
    assert cleaner.clean(log) is not None  # everything is dirty the first time: ratio 1.0
    for i in range(5):
        put(log, clock, b"k%d" % (i % 3), b"w")
    log.roll()
    assert not cleaner.needs_cleaning(log)
    assert cleaner.clean(log) is None
    assert cleaner.clean(log, force=True) is not None
    lagged = compacted(tmp_path / "lag", clock, min_compaction_lag_ms=10_000)
    for i in range(40):
        put(lagged, clock, b"k%d" % (i % 3), b"v")
    assert cleaner.clean(lagged) is None  # every segment is younger than the lag
    clock.advance(10_001)
    assert cleaner.clean(lagged) is not None


def test_tombstones_survive_one_delete_retention_then_go(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    for i in range(20):
        put(log, clock, b"k%d" % (i % 4), b"value-%d" % i)
    dead = put(log, clock, b"k1", None)
    for i in range(20):
        put(log, clock, b"other%d" % (i % 3), b"x")
    cleaner = LogCleaner(time=clock)
    cleaner.clean(log, force=True)
    assert (dead, b"k1", None) in records(log)
    horizon_batches = [h for h in headers(log) if h.has_delete_horizon]
    assert horizon_batches and all(h.base_timestamp == clock.now + 1000 for h in horizon_batches)
    assert not [r for r in records(log) if r[1] == b"k1" and r[2] is not None]
    clock.advance(999)
    cleaner.clean(log, force=True)
    assert (dead, b"k1", None) in records(log)
    clock.advance(1)
    cleaner.clean(log, force=True)
    assert not [r for r in records(log) if r[1] == b"k1"]


@pytest.mark.parametrize("codec", [1, 2, 3, 4])
def test_compressed_batches_are_recompressed_with_their_codec(tmp_path, clock: Clock, codec: int) -> None:
    log = compacted(tmp_path, clock)
    for i in range(12):
        recs = [(b"k%d" % ((i + j) % 5), b"v%d-%d" % (i, j) * 5, (), clock.now) for j in range(4)]
        log.append(build_batch(recs, compression=codec))
    latest = {}
    for offset, key, value in records(log):
        latest[key] = (offset, value)
    log.roll()
    LogCleaner(time=clock).clean(log, force=True)
    after = records(log)
    assert sorted(after) == sorted((o, k, v) for k, (o, v) in latest.items())
    assert {h.compression for h in headers(log)} == {codec}


def test_producer_state_survives_in_empty_batches(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    put(log, clock, b"a", b"1", producer_id=7, producer_epoch=0, base_sequence=0)
    last_of_7 = put(log, clock, b"b", b"1", producer_id=7, producer_epoch=0, base_sequence=1)
    for i in range(30):
        put(log, clock, b"a" if i % 2 else b"b", b"2")
    log.roll()
    LogCleaner(time=clock).clean(log, force=True)
    hs = headers(log)
    of_7 = [h for h in hs if h.producer_id == 7]
    assert len(of_7) == 1
    kept = of_7[0]
    assert (kept.base_offset, kept.records_count, kept.base_sequence) == (last_of_7, 0, 1)
    assert kept.last_offset == last_of_7  # the offset range (and so the sequence) is preserved


def test_aborted_transactions_are_removed_and_ignored(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    put(log, clock, b"key", b"committed")
    txn = dict(producer_id=11, producer_epoch=0, is_transactional=True)
    put(log, clock, b"key", b"aborted", base_sequence=0, **txn)
    log.append(build_control_batch("ABORT", 11, 0, 0, timestamp=clock.now), origin=AppendOrigin.COORDINATOR)
    put(log, clock, b"other", b"committed-in-txn", base_sequence=1, **txn)
    log.append(build_control_batch("COMMIT", 11, 0, 0, timestamp=clock.now), origin=AppendOrigin.COORDINATOR)
    for i in range(20):
        put(log, clock, b"filler%d" % (i % 2), b"x" * 30)
    log.roll()
    LogCleaner(time=clock).clean(log, force=True)
    values = {(k, v) for _, k, v in records(log)}
    assert (b"key", b"committed") in values
    assert (b"key", b"aborted") not in values
    assert (b"other", b"committed-in-txn") in values
    assert sum(1 for h in headers(log) if h.is_control) == 2  # markers are kept


def test_readers_keep_their_slices_across_a_swap(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    for i in range(40):
        put(log, clock, b"k%d" % (i % 2), b"v%d" % i)
    held = log.read(0, 10**6).records
    before = held.read()
    LogCleaner(time=clock).clean(log, force=True)
    log.delete_pending_files(force=True)
    assert held.read() == before
    assert records(log)[0][0] > 0


def test_swap_is_refused_when_retention_changed_the_log(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    for i in range(40):
        put(log, clock, b"k%d" % (i % 2), b"v%d" % i)
    cleaner = LogCleaner(time=clock)
    original = log.replace_segments

    meddled: list[bool] = []

    def meddle(new, old):  # type: ignore[no-untyped-def]
        if not meddled:  # retention removes the first segment while the cleaner works
            meddled.append(True)
            log.delete_records_before(log.segments[1].base_offset)
        return original(new, old)

    log.replace_segments = meddle  # type: ignore[method-assign]
    result = cleaner.clean(log, force=True)
    assert result is not None and result.aborted_swaps >= 1
    assert log.cleaner_checkpoint is None
    assert not [n for n in files(log) if n.endswith((".cleaned", ".swap"))]
    log.replace_segments = original  # type: ignore[method-assign]
    assert cleaner.clean(log, force=True) is not None


def test_cleaning_in_a_thread_while_appending(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    for i in range(200):
        put(log, clock, b"k%d" % (i % 10), b"v%d" % i)
    done = threading.Event()
    errors: list[BaseException] = []

    def clean() -> None:
        try:
            LogCleaner(time=clock).clean(log, force=True)
        except BaseException as e:  # pragma: no cover - reported below
            errors.append(e)
        finally:
            done.set()

    thread = threading.Thread(target=clean)
    thread.start()
    n = 200
    while not done.is_set() and n < 5000:
        put(log, clock, b"k%d" % (n % 10), b"v%d" % n)
        n += 1
    thread.join(30)
    assert not errors
    after = records(log)
    offsets = [r[0] for r in after]
    assert offsets == sorted(set(offsets)) and offsets[-1] == n - 1
    latest = {}
    for _offset, key, value in after:
        latest[key] = value
    assert latest == {b"k%d" % (i % 10): b"v%d" % i for i in range(n - 10, n)}


def test_cleaned_log_survives_restarts(tmp_path, clock: Clock) -> None:
    log = compacted(tmp_path, clock)
    for i in range(50):
        put(log, clock, b"k%d" % (i % 5), b"v%d" % i)
    LogCleaner(time=clock).clean(log, force=True)
    before = records(log)
    for clean in (True, False):
        log = reopen(log, clean=clean)
        assert records(log) == before
    names = os.listdir(log.dir)
    assert all(not n.endswith((".deleted", ".cleaned", ".swap")) for n in names)


def test_clean_filthiest_picks_the_dirtiest_due_log(tmp_path, clock: Clock) -> None:
    a = compacted(tmp_path / "a", clock)
    b = compacted(tmp_path / "b", clock)
    plain = new_log(tmp_path / "p", clock, small_config(segment_bytes=700))
    for i in range(40):
        put(a, clock, b"k%d" % (i % 20), b"v")  # little duplication
        put(b, clock, b"k", b"v%d" % i)  # all duplicates
        put(plain, clock, b"k", b"v")
    cleaner = LogCleaner(time=clock)
    picked = cleaner.clean_filthiest([a, b, plain])
    assert picked is not None
    assert cleaner.clean_filthiest([plain]) is None
