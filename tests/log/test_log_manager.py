"""LogManager: loading log dirs, checkpoints, the clean-shutdown marker, creating and deleting logs."""

from __future__ import annotations

import os

from broker.log import LogManager
from broker.log.checkpoint import CLEAN_SHUTDOWN_FILE, read_offsets
from tests.log.log_helpers import Clock, batch, offsets_of, read_all, small_config


def manager(dirs: list[str], clock: Clock, **cfg: object) -> LogManager:
    return LogManager(dirs, small_config(segment_bytes=600, **cfg), time=clock)


def test_create_spreads_over_dirs_and_shutdown_writes_kafka_files(tmp_path, clock: Clock) -> None:
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    mgr = manager(dirs, clock)
    stats = mgr.startup()
    assert stats.logs == 0 and stats.clean_shutdown == {dirs[0]: False, dirs[1]: False}
    for p in range(4):
        log = mgr.get_or_create_log("orders", p)
        for _ in range(5):
            log.append(batch(1, size=100))
    assert mgr.get_or_create_log("orders", 0) is mgr.get_log("orders", 0)
    assert [n for n in sorted(os.listdir(dirs[0])) if n.startswith("orders")] == ["orders-0", "orders-2"]
    assert "orders-1" in os.listdir(dirs[1])
    mgr.get_log("orders", 1).delete_records_before(4)  # type: ignore[union-attr]
    mgr.get_log("orders", 3).delete_records_before(3)  # type: ignore[union-attr]  # a segment boundary
    mgr.shutdown(broker_epoch=5)
    for d in dirs:
        assert os.path.exists(os.path.join(d, CLEAN_SHUTDOWN_FILE))
        assert os.path.exists(os.path.join(d, "cleaner-offset-checkpoint"))
    assert read_offsets(os.path.join(dirs[0], "recovery-point-offset-checkpoint")) == {
        ("orders", 0): 5,
        ("orders", 2): 5,
    }
    # Like Kafka, only start offsets inside the first segment need a checkpoint entry.
    assert read_offsets(os.path.join(dirs[1], "log-start-offset-checkpoint")) == {("orders", 1): 4}
    assert open(os.path.join(dirs[1], "log-start-offset-checkpoint")).read() == "0\n1\norders 1 4\n"


def test_restart_clean_and_unclean(tmp_path, clock: Clock) -> None:
    dirs = [str(tmp_path / "a")]
    mgr = manager(dirs, clock)
    mgr.startup()
    log = mgr.get_or_create_log("t", 0)
    for _ in range(20):
        log.append(batch(1, size=100))
    data = read_all(log)
    mgr.shutdown()

    mgr2 = manager(dirs, clock)
    stats = mgr2.startup()
    assert stats.clean_shutdown == {os.path.abspath(dirs[0]): True}
    assert stats.recovered_segments == 0 and stats.seconds >= 0
    assert not os.path.exists(os.path.join(dirs[0], CLEAN_SHUTDOWN_FILE))  # removed once loaded
    log2 = mgr2.get_log("t", 0)
    assert log2 is not None and read_all(log2) == data
    log2.append(batch(1))
    with open(log2.segments[-1].log_path, "ab") as f:
        f.write(b"torn write")
    # kill -9: no shutdown, no marker.
    mgr3 = manager(dirs, clock)
    stats = mgr3.startup()
    assert stats.clean_shutdown == {os.path.abspath(dirs[0]): False}
    assert stats.truncated_bytes == len(b"torn write")
    assert stats.recovered_segments >= 1
    log3 = mgr3.get_log("t", 0)
    assert log3 is not None and offsets_of(read_all(log3)) == list(range(21))


def test_recovery_point_checkpoint_limits_recovery(tmp_path, clock: Clock) -> None:
    dirs = [str(tmp_path / "a")]
    mgr = manager(dirs, clock)
    mgr.startup()
    log = mgr.get_or_create_log("t", 0)
    for _ in range(30):
        log.append(batch(1, size=100))
    log.flush()
    mgr.checkpoint()
    log.append(batch(1))
    stats = manager(dirs, clock).startup()
    assert stats.recovered_segments == 1


def test_delete_log_renames_then_removes(tmp_path, clock: Clock) -> None:
    dirs = [str(tmp_path / "a")]
    mgr = manager(dirs, clock)
    mgr.startup()
    log = mgr.get_or_create_log("gone", 3)
    log.append(batch(2))
    held = log.read(0, 1000).records
    assert mgr.delete_log("gone", 3)
    assert not mgr.delete_log("gone", 3)
    assert mgr.get_log("gone", 3) is None
    assert os.listdir(dirs[0]).count("gone-3") == 0
    assert not [n for n in os.listdir(dirs[0]) if n.endswith("-delete")]
    assert offsets_of(held.read()) == [0, 1]  # a fetch in flight still reads its slice
    # A deletion cut short by a crash is finished at startup.
    os.makedirs(os.path.join(dirs[0], "x-0.0123456789abcdef0123456789abcdef-delete"))
    stats = manager(dirs, clock).startup()
    assert stats.logs == 0
    assert not [n for n in os.listdir(dirs[0]) if n.endswith("-delete")]


def test_background_steps(tmp_path, clock: Clock) -> None:
    dirs = [str(tmp_path / "a")]
    mgr = manager(dirs, clock, flush_ms=100, retention_ms=1000)
    mgr.startup()
    log = mgr.get_or_create_log("t", 0)
    for _ in range(10):
        log.append(batch(1, size=100, ts=clock.now))
    clock.advance(100)
    assert mgr.flush_dirty_logs() == 1
    assert log.recovery_point == 10
    clock.advance(10_000)
    assert mgr.run_retention() > 0
    assert log.log_start_offset == 10


def test_unreadable_checkpoint_means_full_recovery(tmp_path, clock: Clock) -> None:
    dirs = [str(tmp_path / "a")]
    mgr = manager(dirs, clock)
    mgr.startup()
    log = mgr.get_or_create_log("t", 0)
    for _ in range(10):
        log.append(batch(1, size=100))
    mgr.checkpoint()
    with open(os.path.join(dirs[0], "recovery-point-offset-checkpoint"), "w") as f:
        f.write("garbage\n")
    stats = manager(dirs, clock).startup()
    assert stats.recovered_segments == len(log.segments)


def test_topic_config_callback_and_update(tmp_path, clock: Clock) -> None:
    special = small_config(segment_bytes=600, max_message_bytes=100)
    mgr = LogManager(
        [str(tmp_path)], small_config(), time=clock, topic_config=lambda t: special if t == "s" else None
    )
    mgr.startup()
    assert mgr.get_or_create_log("s", 0).config is special
    assert mgr.get_or_create_log("o", 0).config.max_message_bytes != 100
    mgr.update_topic_config("o", special)
    assert mgr.get_log("o", 0).config is special  # type: ignore[union-attr]


def test_parallel_recovery_of_many_partitions(tmp_path, clock: Clock) -> None:
    dirs = [str(tmp_path / "a"), str(tmp_path / "b")]
    mgr = manager(dirs, clock)
    mgr.startup()
    for p in range(6):
        log = mgr.get_or_create_log("many", p)
        for _ in range(p + 1):
            log.append(batch(1, size=100))
    # kill -9, then a start with two recovery threads per dir.
    again = LogManager(dirs, small_config(segment_bytes=600), time=clock, recovery_threads_per_dir=2)
    stats = again.startup()
    assert stats.logs == 6
    for p in range(6):
        loaded = again.get_log("many", p)
        assert loaded is not None and loaded.log_end_offset == p + 1
