"""All partition logs of the broker across `log.dirs`: load, create, delete, checkpoint, shut down.

Per log dir (Kafka's files): `recovery-point-offset-checkpoint`, `log-start-offset-checkpoint`,
`cleaner-offset-checkpoint`, in cluster mode `replication-offset-checkpoint` (high watermarks) and, after a clean shutdown, `.kafka_cleanshutdown`. The marker is
removed once the logs are loaded, so any later crash makes the next start recover.

Background work is exposed as plain methods the broker schedules (each blocking; run them in a
worker thread): `flush_dirty_logs`, `run_retention`, `checkpoint`.
"""

from __future__ import annotations

import os
import shutil
import threading
import time as _time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from broker.log.checkpoint import (
    CLEANER_OFFSET_CHECKPOINT,
    HIGH_WATERMARK_CHECKPOINT,
    LOG_START_OFFSET_CHECKPOINT,
    RECOVERY_POINT_CHECKPOINT,
    CheckpointError,
    fsync_dir,
    has_clean_shutdown,
    read_offsets,
    remove_clean_shutdown,
    write_clean_shutdown,
    write_offsets,
    write_partition_metadata,
)
from broker.log.config import LogConfig
from broker.log.loader import LoadStats, create_log, load_log, parse_partition_dir
from broker.log.log import Log, wall_clock_ms
from broker.log.mover import FUTURE_DIR_SUFFIX
from protocol.errors import ErrorCode, KafkaError

TopicPartition = tuple[str, int]
DELETE_DIR_SUFFIX = "-delete"


@dataclass
class StartupStats:
    """Returned by `LogManager.startup`: how long loading took and what recovery did."""

    seconds: float = 0.0
    logs: int = 0
    clean_shutdown: dict[str, bool] = field(default_factory=dict)
    recovered_segments: int = 0
    truncated_bytes: int = 0
    per_log: dict[TopicPartition, LoadStats] = field(default_factory=dict)


def _read_checkpoint(path: str) -> dict[TopicPartition, int]:
    try:
        return read_offsets(path)
    except CheckpointError:
        return {}  # an unreadable checkpoint means "recover from the start", never a failed start


class LogManager:
    def __init__(
        self,
        log_dirs: list[str],
        default_config: LogConfig | None = None,
        *,
        time: Callable[[], int] = wall_clock_ms,
        topic_config: Callable[[str], LogConfig | None] | None = None,
        recovery_threads_per_dir: int = 1,
        flush_observer: Callable[[float], None] | None = None,
    ) -> None:
        if not log_dirs:
            raise ValueError("at least one log dir is required")
        self.log_dirs = [os.path.abspath(d) for d in log_dirs]
        self.default_config = default_config or LogConfig()
        self.time = time
        self._topic_config = topic_config
        self.recovery_threads_per_dir = max(1, recovery_threads_per_dir)
        self.flush_observer = flush_observer  # given to every log: how long each flush took (metrics)
        self._logs: dict[TopicPartition, Log] = {}
        self._log_dir_of: dict[TopicPartition, str] = {}
        self._hosted: dict[str, int] = {d: 0 for d in self.log_dirs}  # partitions per log dir (placement)
        self._lock = threading.RLock()
        self._checkpoint_lock = threading.Lock()
        # replication (cluster mode): each partition's high watermark for `replication-offset-checkpoint`
        # (None: not replicated, no file), and what that file held at startup
        self.high_watermarks: Callable[[TopicPartition], int | None] | None = None
        self.checkpointed_high_watermarks: dict[TopicPartition, int] = {}
        self.started = False

    # -- lookup ----------------------------------------------------------------------------------

    def config_for(self, topic: str) -> LogConfig:
        if self._topic_config is not None:
            cfg = self._topic_config(topic)
            if cfg is not None:
                return cfg
        return self.default_config

    def get_log(self, topic: str, partition: int) -> Log | None:
        return self._logs.get((topic, partition))

    @property
    def logs(self) -> dict[TopicPartition, Log]:
        with self._lock:
            return dict(self._logs)

    def log_dir_of(self, topic: str, partition: int) -> str | None:
        return self._log_dir_of.get((topic, partition))

    # -- startup ----------------------------------------------------------------------------------

    def startup(self) -> StartupStats:
        """Load every partition of every log dir (recovering after an unclean shutdown)."""
        started = _time.perf_counter()
        stats = StartupStats()
        for log_dir in self.log_dirs:
            os.makedirs(log_dir, exist_ok=True)
            clean = has_clean_shutdown(log_dir)
            stats.clean_shutdown[log_dir] = clean
            recovery_points = _read_checkpoint(os.path.join(log_dir, RECOVERY_POINT_CHECKPOINT))
            start_offsets = _read_checkpoint(os.path.join(log_dir, LOG_START_OFFSET_CHECKPOINT))
            cleaner_offsets = _read_checkpoint(os.path.join(log_dir, CLEANER_OFFSET_CHECKPOINT))
            self.checkpointed_high_watermarks.update(_read_checkpoint(os.path.join(log_dir, HIGH_WATERMARK_CHECKPOINT)))
            jobs = []
            with os.scandir(log_dir) as entries:
                dirs = sorted([e.name for e in entries if e.is_dir()])
            for name in dirs:
                path = os.path.join(log_dir, name)
                if name.endswith((DELETE_DIR_SUFFIX, FUTURE_DIR_SUFFIX)):
                    # a deletion cut short, or a move between log dirs that did not finish (the
                    # partition is still whole in its old dir)
                    shutil.rmtree(path, ignore_errors=True)
                    continue
                try:
                    tp = parse_partition_dir(name)
                except KafkaError:
                    continue  # -future / -stray / foreign directories are left alone
                jobs.append((tp, path))

            def load(
                job: tuple[TopicPartition, str],
                clean: bool = clean,
                recovery_points: dict[TopicPartition, int] = recovery_points,
                start_offsets: dict[TopicPartition, int] = start_offsets,
            ) -> tuple[TopicPartition, Log, LoadStats]:
                tp, path = job
                log, load_stats = load_log(
                    path,
                    self.config_for(tp[0]),
                    had_clean_shutdown=clean,
                    recovery_point=recovery_points.get(tp, 0),
                    log_start_offset=start_offsets.get(tp, 0),
                    time=self.time,
                )
                return tp, log, load_stats

            if self.recovery_threads_per_dir > 1 and len(jobs) > 1:
                with ThreadPoolExecutor(self.recovery_threads_per_dir) as pool:
                    loaded = list(pool.map(load, jobs))
            else:
                loaded = [load(job) for job in jobs]
            for tp, log, load_stats in loaded:
                if tp in self._logs:
                    raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"{tp[0]}-{tp[1]} found in two log dirs")
                if tp in cleaner_offsets:
                    log.cleaner_checkpoint = cleaner_offsets[tp]
                log.flush_observer = self.flush_observer
                self._logs[tp] = log
                self._place(tp, log_dir)
                stats.per_log[tp] = load_stats
                stats.recovered_segments += load_stats.recovered_segments
                stats.truncated_bytes += load_stats.truncated_bytes
        # From here on a crash must trigger recovery: checkpoint what we know, drop the markers.
        self.checkpoint()
        for log_dir in self.log_dirs:
            remove_clean_shutdown(log_dir)
        stats.logs = len(self._logs)
        stats.seconds = _time.perf_counter() - started
        self.started = True
        return stats

    # -- create / delete --------------------------------------------------------------------------

    def _pick_log_dir(self) -> str:
        # counted as partitions come and go: counting them here made creating n partitions O(n^2)
        return min(self.log_dirs, key=lambda d: (self._hosted.get(d, 0), self.log_dirs.index(d)))

    def _place(self, tp: TopicPartition, log_dir: str | None) -> None:
        """Record that `tp` lives in `log_dir` (None: nowhere any more)."""
        old = self._log_dir_of.pop(tp, None)
        if old is not None:
            self._hosted[old] -= 1
        if log_dir is not None:
            self._log_dir_of[tp] = log_dir
            self._hosted[log_dir] = self._hosted.get(log_dir, 0) + 1

    def get_or_create_log(
        self,
        topic: str,
        partition: int,
        config: LogConfig | None = None,
        topic_id: uuid.UUID | None = None,
    ) -> Log:
        """The partition's log, created (in the log dir holding the fewest partitions) when missing;
        `topic_id` is recorded in Kafka's `partition.metadata` file of a new partition."""
        with self._lock:
            log = self._logs.get((topic, partition))
            if log is not None:
                return log
            log_dir = self._pick_log_dir()
            log = create_log(log_dir, topic, partition, config or self.config_for(topic), time=self.time)
            if topic_id is not None:
                write_partition_metadata(log.dir, topic_id)
            log.flush_observer = self.flush_observer
            self._logs[(topic, partition)] = log
            self._place((topic, partition), log_dir)
            return log

    def replace_log(self, topic: str, partition: int, log: Log, log_dir: str) -> Log:
        """Put `log` (the partition moved to `log_dir`) in place of the current one, returned."""
        with self._lock:
            old = self._logs[(topic, partition)]
            log.flush_observer = self.flush_observer
            self._logs[(topic, partition)] = log
            self._place((topic, partition), log_dir)
        return old

    def remove_moved_dir(self, old: Log) -> None:
        """The directory a moved partition left: renamed away and deleted."""
        self._discard(old, os.path.dirname(old.dir))

    def delete_log(self, topic: str, partition: int) -> bool:
        """Remove a partition: rename its dir to `<topic>-<partition>.<uuid>-delete`, then delete it.
        Slices already handed out stay readable (their files are open)."""
        with self._lock:
            log = self._logs.pop((topic, partition), None)
            log_dir = self._log_dir_of.get((topic, partition))
            self._place((topic, partition), None)
        if log is None or log_dir is None:
            return False
        log.close_handles()
        self._discard(log, log_dir)
        return True

    def _discard(self, log: Log, parent: str) -> None:
        doomed = os.path.join(parent, f"{log.topic}-{log.partition}.{uuid.uuid4().hex}{DELETE_DIR_SUFFIX}")
        os.replace(log.dir, doomed)
        fsync_dir(parent)
        shutil.rmtree(doomed, ignore_errors=True)
        self.checkpoint()

    def update_topic_config(self, topic: str, config: LogConfig) -> None:
        for (t, _), log in self.logs.items():
            if t == topic:
                log.update_config(config)

    # -- background work ----------------------------------------------------------------------------

    def flush_dirty_logs(self) -> int:
        """One pass of the flusher: fsync logs whose flush.ms / flush.messages / roll asks. Blocking."""
        now = self.time()
        flushed = 0
        logs = self.logs
        # New partitions' entries in their log dir: one fsync of the log dir covers all those
        # created before it (not one each: creating 50,000 partitions would make 50,000).
        for log_dir in self.log_dirs:
            new = [log for tp, log in logs.items() if log.parent_dirty and self._log_dir_of.get(tp) == log_dir]
            if new:
                fsync_dir(log_dir)
                for log in new:
                    log.parent_synced()
        for log in logs.values():
            if not log.closed and log.flush_if_needed(now):
                flushed += 1
        return flushed

    def run_retention(self, high_watermarks: Callable[[TopicPartition], int | None] | None = None) -> int:
        """One retention pass over every log (time, size, log start offset) plus delayed file
        deletions. Returns the number of segments deleted. Blocking."""
        deleted = 0
        for tp, log in self.logs.items():
            if log.closed:
                continue
            hw = high_watermarks(tp) if high_watermarks is not None else None
            deleted += log.delete_old_segments(high_watermark=hw)
        return deleted

    def checkpoint(self) -> None:
        """Write the recovery points, log start offsets and cleaner offsets of every log dir."""
        with self._checkpoint_lock:
            logs = self.logs
            for log_dir in self.log_dirs:
                mine = {tp: log for tp, log in logs.items() if self._log_dir_of.get(tp) == log_dir}
                write_offsets(
                    os.path.join(log_dir, RECOVERY_POINT_CHECKPOINT),
                    {tp: log.recovery_point for tp, log in mine.items()},
                )
                write_offsets(
                    os.path.join(log_dir, LOG_START_OFFSET_CHECKPOINT),
                    {
                        tp: log.log_start_offset
                        for tp, log in mine.items()
                        if log.log_start_offset > log.segments[0].base_offset  # as Kafka writes it
                    },
                )
                if self.high_watermarks is not None:
                    marks = {tp: self.high_watermarks(tp) for tp in mine}
                    write_offsets(os.path.join(log_dir, HIGH_WATERMARK_CHECKPOINT),
                                  {tp: hw for tp, hw in marks.items() if hw is not None})
                write_offsets(
                    os.path.join(log_dir, CLEANER_OFFSET_CHECKPOINT),
                    {
                        tp: log.cleaner_checkpoint
                        for tp, log in mine.items()
                        if log.cleaner_checkpoint is not None
                    },
                )

    def abandon(self) -> None:
        """Stop as a killed process stops: files released, nothing flushed or checkpointed, no
        clean-shutdown markers (broker.testing's restart as after `kill -9`)."""
        for log in self.logs.values():
            log.abandon()
        self.started = False

    def shutdown(self, broker_epoch: int = -1) -> None:
        """Clean shutdown: close (flush) every log, checkpoint, then write the clean-shutdown markers."""
        for log in self.logs.values():
            log.close()
        self.checkpoint()
        for log_dir in self.log_dirs:
            write_clean_shutdown(log_dir, broker_epoch)
        self.started = False
