"""Opening a partition directory: leftovers of interrupted operations, segments, crash recovery.

Kafka's LogLoader, simplified:
1. `.deleted` and `.cleaned` files are removed; `.swap` files (a cleaner swap cut short) replace
   the segments they cover, then lose their suffix. Orphan index files and `*.tmp` go.
2. Without a clean shutdown every segment from the one holding the recovery point onwards is
   scanned batch by batch (length, magic, CRC-32C, ascending offsets); the first invalid byte
   truncates the segment and every later segment is deleted. Indexes of scanned segments are
   rebuilt. Nothing valid before the damage is lost.
3. With a clean shutdown only the active segment's indexes are checked now (a failed check runs
   the same recovery); older segments check theirs when first used and rebuild them if needed.

A broker may load tens of thousands of partitions, so each costs as few syscalls as it can: the
directory is listed once and the listing answers which index, txnindex, leader-epoch and
snapshot files exist (the partition reads its snapshots' names from it: `Log.listing`), and the
size of a segment that recovery scans is measured by the scan.
"""

from __future__ import annotations

import os
import time as _time
from collections.abc import Callable
from dataclasses import dataclass

from broker.log.checkpoint import LEADER_EPOCH_CHECKPOINT, fsync_dir
from broker.log.config import LogConfig
from broker.log.leader_epoch import LeaderEpochCache
from broker.log.log import Log, wall_clock_ms
from broker.log.segment import (
    CLEANED_SUFFIX,
    DELETED_SUFFIX,
    INDEX_SUFFIX,
    LOG_SUFFIX,
    SWAP_SUFFIX,
    TIME_INDEX_SUFFIX,
    TXN_INDEX_SUFFIX,
    LogSegment,
    walk_headers,
)
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import BatchHeader


@dataclass
class LoadStats:
    """What loading one partition took (returned rather than logged; the broker logs it)."""

    segments: int = 0
    recovered_segments: int = 0
    truncated_bytes: int = 0
    deleted_segments: int = 0
    swaps_completed: int = 0
    seconds: float = 0.0


def parse_partition_dir(name: str) -> tuple[str, int]:
    """`<topic>-<partition>` -> (topic, partition); KafkaError for anything else."""
    topic, sep, partition = name.rpartition("-")
    if not sep or not topic or not partition.isdigit():
        raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"not a partition directory: {name}")
    return topic, int(partition)


def _offset_of(filename: str) -> int | None:
    head = filename.split(".", 1)[0]
    return int(head) if head.isdigit() else None


def create_log(
    parent: str,
    topic: str,
    partition: int,
    config: LogConfig,
    *,
    time: Callable[[], int] = wall_clock_ms,
) -> Log:
    """A new empty partition log under `parent` (a log dir). The new directory and its files are
    made durable by the log's first flush (the background flusher's next pass, or the first
    fsync an append asks for), as Kafka flushes a log's directory with its first new segment:
    creating 50,000 partitions spent a fifth of its time in two directory fsyncs each. A crash
    before then loses nothing acknowledged: the partition is created again from the metadata."""
    directory = os.path.join(parent, f"{topic}-{partition}")
    os.makedirs(directory, exist_ok=False)
    segment = _segment(directory, 0, config, time(), create=True)
    log = Log(
        directory,
        topic,
        partition,
        config,
        [segment],
        log_start_offset=0,
        recovery_point=0,
        epoch_cache=LeaderEpochCache(directory),
        time=time,
    )
    log.new_directory()
    return log


def load_log(
    directory: str,
    config: LogConfig,
    *,
    had_clean_shutdown: bool,
    recovery_point: int = 0,
    log_start_offset: int = 0,
    time: Callable[[], int] = wall_clock_ms,
) -> tuple[Log, LoadStats]:
    """Open an existing partition directory, recovering it when the shutdown was not clean."""
    started = _time.perf_counter()
    topic, partition = parse_partition_dir(os.path.basename(os.path.normpath(directory)))
    stats = LoadStats()
    names = _file_names(directory)
    if _complete_interrupted_swaps(directory, names, stats):
        names = _file_names(directory)
    listing = frozenset(names)  # what exists is known from here on without a syscall per file
    segments = _open_segments(directory, names, listing, config, time(),
                              None if had_clean_shutdown else recovery_point)
    epoch_cache = LeaderEpochCache.load(directory, LEADER_EPOCH_CHECKPOINT in listing)

    recovered_from: int | None = None  # base offset of the first segment recovered
    if not had_clean_shutdown:
        recovered_from = _recover_unflushed(directory, segments, recovery_point, epoch_cache, stats)
    elif segments and not segments[-1].load_indexes(rebuild=False):
        stats.recovered_segments += 1
        stats.truncated_bytes += segments[-1].recover(on_batch=_epoch_collector(epoch_cache))
        recovered_from = segments[-1].base_offset

    if segments:
        log_end = segments[-1].next_offset
        if log_end < log_start_offset:
            # Segments vanished below the checkpointed start (files removed by hand): start over.
            for seg in segments:
                seg.delete_files()
            stats.deleted_segments += len(segments)
            segments = []
            epoch_cache.clear()
            epoch_cache.write()
    if not segments:
        segments = [_segment(directory, log_start_offset, config, time(), create=True)]
    log_end = segments[-1].next_offset
    start = max(log_start_offset, segments[0].base_offset)
    point = log_end if had_clean_shutdown else min(recovery_point, log_end)

    epoch_cache.truncate_from_end(log_end)
    epoch_cache.truncate_from_start(start)
    epoch_cache.recovered()
    log = Log(
        directory,
        topic,
        partition,
        config,
        segments,
        log_start_offset=start,
        recovery_point=point,
        epoch_cache=epoch_cache,
        time=time,
    )
    # the aborted-transaction indexes of recovered segments are rebuilt with the producer state
    log.recovered_from = recovered_from
    log.listing = listing
    # Recovery opened and rebuilt files of every segment it touched: none stays open (a broker
    # with many partitions would hold three descriptors each); they reopen at their next use.
    log.release_handles()
    stats.segments = len(segments)
    stats.seconds = _time.perf_counter() - started
    return log, stats


def _epoch_collector(cache: LeaderEpochCache) -> Callable[[BatchHeader], None]:
    def on_batch(header: BatchHeader) -> None:
        epoch = header.partition_leader_epoch
        if epoch >= 0 and (cache.latest_epoch is None or epoch > cache.latest_epoch):
            cache.assign(epoch, header.base_offset)

    return on_batch


def _recover_unflushed(
    directory: str,
    segments: list[LogSegment],
    recovery_point: int,
    epoch_cache: LeaderEpochCache,
    stats: LoadStats,
) -> int | None:
    """Scan the segments at or after the recovery point; truncate at the first damage. Returns the
    base offset of the first segment scanned."""
    first = _first_to_recover([s.base_offset for s in segments], recovery_point)
    on_batch = _epoch_collector(epoch_cache)
    changed = False
    for i in range(first, len(segments)):
        seg = segments[i]
        stats.recovered_segments += 1
        truncated = seg.recover(on_batch=on_batch)
        stats.truncated_bytes += truncated
        changed = changed or truncated > 0
        if truncated:
            doomed = segments[i + 1 :]
            for later in doomed:
                later.delete_files()
                later.close()
            stats.deleted_segments += len(doomed)
            del segments[i + 1 :]
            break
    if changed:
        fsync_dir(directory)
    return segments[first].base_offset if first < len(segments) else None


def _first_to_recover(bases: list[int], recovery_point: int) -> int:
    """Index of the segment holding the recovery point (the last one starting at or below it)."""
    first = 0
    for i, base in enumerate(bases):
        if base <= recovery_point:
            first = i
    return first


def _segment(
    directory: str,
    base: int,
    config: LogConfig,
    now_ms: int,
    create: bool = False,
    size: int | None = None,
    listing: frozenset[str] | None = None,
) -> LogSegment:
    return LogSegment(
        directory,
        base,
        index_interval_bytes=config.index_interval_bytes,
        max_index_bytes=config.segment_index_bytes,
        now_ms=now_ms,
        create=create,
        size=size,
        listing=listing,
    )


def _file_names(directory: str) -> list[str]:
    """The regular files of a partition directory, sorted (one directory read, no stat per file)."""
    with os.scandir(directory) as entries:
        return sorted([e.name for e in entries if e.is_file()])


def _open_segments(
    directory: str,
    names: list[str],
    listing: frozenset[str],
    config: LogConfig,
    now_ms: int,
    recovery_point: int | None,
) -> list[LogSegment]:
    """The segments of the directory, in offset order; orphan index files are removed. The size
    of a segment that recovery will scan (at or after the one holding `recovery_point`, when
    given) is left to the scan to measure."""
    logs = []
    for name in names:
        if name.endswith(LOG_SUFFIX):
            base = _offset_of(name)
            if base is not None:
                logs.append(base)
    logs.sort()
    bases = set(logs)
    for name in names:
        if name.endswith((INDEX_SUFFIX, TIME_INDEX_SUFFIX, TXN_INDEX_SUFFIX)):
            base = _offset_of(name)
            if base is not None and base not in bases:
                os.unlink(os.path.join(directory, name))  # an orphan index
                listing = listing - {name}
    scanned = len(logs) if recovery_point is None else _first_to_recover(logs, recovery_point)
    return [
        _segment(directory, base, config, now_ms, size=0 if i >= scanned else None, listing=listing)
        for i, base in enumerate(logs)
    ]


def _complete_interrupted_swaps(directory: str, names: list[str], stats: LoadStats) -> bool:
    """Remove leftovers of deletions and cleanings, complete cut-short swaps; True when files changed."""
    swaps: list[str] = []
    removed = False
    for name in names:
        if name.endswith((DELETED_SUFFIX, CLEANED_SUFFIX)) or name.endswith(".tmp"):
            os.unlink(os.path.join(directory, name))
            removed = True
        elif name.endswith(SWAP_SUFFIX):
            swaps.append(name)
    if not swaps:
        return removed
    # The cleaned data in the .swap log files replaces every segment in [first base, last next offset).
    lo, hi = None, None
    for name in swaps:
        if not name.endswith(LOG_SUFFIX + SWAP_SUFFIX):
            continue
        base = _offset_of(name)
        if base is None:
            continue
        next_offset = _next_offset_of(os.path.join(directory, name), base)
        lo = base if lo is None else min(lo, base)
        hi = next_offset if hi is None else max(hi, next_offset)
    if lo is not None and hi is not None:
        for name in os.listdir(directory):
            base = _offset_of(name)
            if base is not None and not name.endswith(SWAP_SUFFIX) and lo <= base < hi:
                os.unlink(os.path.join(directory, name))
    for name in swaps:
        path = os.path.join(directory, name)
        os.replace(path, path[: -len(SWAP_SUFFIX)])
        stats.swaps_completed += 1
    fsync_dir(directory)
    return True


def _next_offset_of(path: str, base: int) -> int:
    fd = os.open(path, os.O_RDONLY)
    try:
        next_offset = base
        try:
            for _, header in walk_headers(fd, 0, os.fstat(fd).st_size):
                next_offset = header.next_offset
        except ProtocolError:
            pass
        return next_offset
    finally:
        os.close(fd)
