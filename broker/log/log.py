"""A partition's log: ordered segments, offsets, appends, reads, rolls, flushes and retention.

Threading: appends and reads run on the broker's event loop; `flush()` (fsync) and the cleaner
run in worker threads. One lock guards the segment list and the offsets; appends hold it while
they write to the OS (page cache), reads only to snapshot the segment list, and fsync runs
outside it. Appends never touch anything but the active segment, so the cleaner can rewrite
older segments and swap them in under the lock without stopping writers.

Durability: `append` writes with pwrite before it returns, so acknowledged data survives the
death of the process. `flush()` makes it survive power loss and advances the recovery point.
"""

from __future__ import annotations

import bisect
import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from broker.log.checkpoint import fsync_dir
from broker.log.config import LONG_MAX, LogConfig
from broker.log.leader_epoch import LeaderEpochCache
from broker.log.segment import DELETED_SUFFIX, EMPTY_SLICE, FileSlice, LogSegment, all_segment_paths
from broker.log.txn_index import AbortedTxn
from broker.log.validation import (
    AppendOrigin,
    RecordValidationError,
    check_batch_size,
    check_record_set_size,
    validate_records,
)
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import (
    TIMESTAMP_TYPE_MASK,
    BatchHeader,
    decode_batch,
    iter_batches,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)

Buffer = bytes | bytearray | memoryview


# baseOffset, batchLength, partitionLeaderEpoch, magic: the header bytes before the CRC that an
# append rewrites.
_PREFIX = 17


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


def _placed(h: BatchHeader, base_offset: int, leader_epoch: int) -> BatchHeader:
    """`h._replace(base_offset=..., partition_leader_epoch=...)`, at a third of its cost (every
    coordinator write pays for it)."""
    return BatchHeader(base_offset, h.batch_length, leader_epoch, h.magic, h.crc, h.attributes, h.last_offset_delta,
                       h.base_timestamp, h.max_timestamp, h.producer_id, h.producer_epoch, h.base_sequence,
                       h.records_count)


class AppendResult(NamedTuple):
    """What a produce response needs, plus where the data landed (a NamedTuple: one is made per
    append, and a frozen dataclass costs three times as much to build)."""

    first_offset: int
    last_offset: int
    log_append_time: int  # -1 unless message.timestamp.type=LogAppendTime
    log_start_offset: int
    max_timestamp: int
    record_count: int
    size: int
    segment_base_offset: int
    position: int

    @property
    def next_offset(self) -> int:
        return self.last_offset + 1


@dataclass(frozen=True)
class FetchDataInfo:
    """Whole batches from one segment file, starting with the batch holding `fetch_offset`."""

    records: FileSlice
    fetch_offset: int
    log_start_offset: int
    log_end_offset: int
    next_offset: int = -1  # the offset after the batches read (-1: none read, or not known)


@dataclass(frozen=True)
class TimestampAndOffset:
    timestamp: int
    offset: int
    leader_epoch: int  # -1 when unknown


class Log:
    """Construct with `broker.log.loader.load_log` (or `Log.create` for a new partition)."""

    def __init__(
        self,
        directory: str,
        topic: str,
        partition: int,
        config: LogConfig,
        segments: list[LogSegment],
        *,
        log_start_offset: int,
        recovery_point: int,
        epoch_cache: LeaderEpochCache,
        time: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.dir = directory
        self.topic = topic
        self.partition = partition
        self.config = config
        self.time = time
        self.epoch_cache = epoch_cache
        self.leader_epoch = epoch_cache.latest_epoch if epoch_cache.latest_epoch is not None else 0
        self._lock = threading.RLock()
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self.log_start_offset = log_start_offset
        self.recovery_point = recovery_point
        self._last_flush_ms = time()
        self._dir_dirty = False
        self._parent_dirty = False  # a new directory: its entry in the log dir is not durable yet
        self._roll_flush_offset: int | None = None
        self._pending_deletes: list[tuple[int, LogSegment]] = []
        self.cleaner_checkpoint: int | None = None  # first dirty offset (cleaner-offset-checkpoint)
        # set by the loader: the segments from this base offset on were recovered after a crash,
        # and their aborted-transaction indexes are rebuilt with the producer state
        self.recovered_from: int | None = None
        # set by the loader: the file names of the directory as it found them, for the partition's
        # own files at start-up (producer snapshots); see take_listing
        self.listing: frozenset[str] | None = None
        self.generation = 0  # bumped whenever the segment list changes
        self.closed = False
        # broker.testing's fail_disk: called before each write, raises OSError as a broken disk would
        self.write_fault: Callable[[], None] | None = None
        self.flush_observer: Callable[[float], None] | None = None  # told how long each flush took (metrics)
        self._roll_jitter_ms = self._new_jitter()

    def take_listing(self) -> frozenset[str] | None:
        """The directory's file names as the loader found them, once (None after, or for a new log):
        only right after loading are they known to be current."""
        listing, self.listing = self.listing, None
        return listing

    # -- basic facts ------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"Log({self.topic}-{self.partition}, start={self.log_start_offset}, end={self.log_end_offset})"

    @property
    def name(self) -> str:
        return f"{self.topic}-{self.partition}"

    @property
    def active_segment(self) -> LogSegment:
        return self._segments[-1]

    @property
    def log_end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def lock(self) -> threading.RLock:
        """Held by every change of the log; a holder sees it standing still (the mover's last step)."""
        return self._lock

    @property
    def segments(self) -> tuple[LogSegment, ...]:
        with self._lock:
            return tuple(self._segments)

    @property
    def size(self) -> int:
        with self._lock:
            return sum(s.size for s in self._segments)

    @property
    def unflushed_messages(self) -> int:
        return self.log_end_offset - self.recovery_point

    def _new_jitter(self) -> int:
        jitter = self.config.segment_jitter_ms
        return random.randrange(jitter) if jitter > 0 else 0

    def _new_segment(self, base_offset: int) -> LogSegment:
        return LogSegment(
            self.dir,
            base_offset,
            index_interval_bytes=self.config.index_interval_bytes,
            max_index_bytes=self.config.segment_index_bytes,
            now_ms=self.time(),
            create=True,
        )

    def update_config(self, config: LogConfig) -> None:
        """Apply a new topic config at runtime (takes effect for the next append/roll/retention run)."""
        with self._lock:
            self.config = config
            active = self._segments[-1]
            active.index_interval_bytes = config.index_interval_bytes
            active.offset_index.set_max_size(config.segment_index_bytes)
            active.time_index.set_max_size(config.segment_index_bytes)
            self._roll_jitter_ms = self._new_jitter()

    # -- append ------------------------------------------------------------------------------------

    def append(
        self,
        records: Buffer,
        *,
        origin: AppendOrigin = AppendOrigin.CLIENT,
        leader_epoch: int | None = None,
        crc_checked: bool = False,
    ) -> AppendResult:
        """Validate a produced record set, assign offsets, stamp the epoch (and LogAppendTime) and
        write it. All or nothing: a KafkaError leaves the log untouched. `records` is not modified:
        the rewritten 17-byte header prefix of each batch is written next to the untouched rest
        (one pwritev, no copy of the payload). `crc_checked`: every batch went through
        validate_batch already (its CRC is not computed twice)."""
        config = self.config
        now = self.time()
        view = memoryview(records)
        try:
            batches = validate_records(view, config, origin, now, f"{self.topic}-{self.partition}", crc_checked)
        except RecordValidationError as e:
            e.log_start_offset = self.log_start_offset
            raise
        if not batches:
            return self._empty_result()
        epoch = self.leader_epoch if leader_epoch is None else leader_epoch
        log_append_time = -1
        if config.log_append_time:
            # The timestamp is CRC-covered: rewrite a copy of the batches (CRC included).
            log_append_time = now
            view = memoryview(bytearray(view))
            for pos, _ in batches:
                set_log_append_time(view, pos, now)
            batches = [
                (pos, h._replace(max_timestamp=now, attributes=h.attributes | TIMESTAMP_TYPE_MASK))
                for pos, h in batches
            ]
        with self._lock:
            self._check_open()
            first = offset = self.log_end_offset
            assigned = []
            chunks: list[Buffer] = []
            for pos, h in batches:
                prefix = bytearray(view[pos : pos + _PREFIX])
                set_base_offset(prefix, 0, offset)
                set_partition_leader_epoch(prefix, 0, epoch)
                chunks += (prefix, view[pos + _PREFIX : pos + h.size])
                assigned.append((pos, h._replace(base_offset=offset, partition_leader_epoch=epoch)))
                offset += h.last_offset_delta + 1
            return self._write(chunks, len(view), assigned, first, now, log_append_time)

    def append_built(self, batch: bytearray, header: BatchHeader) -> AppendResult:
        """Append one batch the broker built itself (a coordinator's records), `header` being its
        header as built: it is not parsed and CRC-checked again as `append` does. Its offset and
        leader epoch are written into `batch` (outside the CRC); the size limits apply."""
        config = self.config
        if config.log_append_time:  # the timestamps change, and with them the CRC
            return self.append(batch, origin=AppendOrigin.COORDINATOR)
        size = len(batch)
        check_batch_size(size, config)
        check_record_set_size(size, config)
        with self._lock:
            self._check_open()
            first = self.log_end_offset
            epoch = self.leader_epoch
            set_base_offset(batch, 0, first)
            set_partition_leader_epoch(batch, 0, epoch)
            return self._write([batch], size, [(0, _placed(header, first, epoch))], first, self.time(), -1)

    def append_as_follower(self, records: Buffer) -> AppendResult:
        """Append batches whose offsets are already assigned (replication, restoring a copy, tests):
        checked for CRC and ascending offsets at or after the log end, written unchanged."""
        buf = bytes(records)
        try:
            batches = list(iter_batches(buf, strict=True))
            for pos, _ in batches:
                validate_batch(buf, pos)
        except ProtocolError as e:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(e)) from None
        if not batches:
            return self._empty_result()
        with self._lock:
            self._check_open()
            expected = self.log_end_offset
            for _, h in batches:
                if h.base_offset < expected or h.records_count > h.last_offset_delta + 1:
                    raise KafkaError(
                        ErrorCode.INVALID_RECORD, f"batch at offset {h.base_offset} is below {expected}"
                    )
                expected = h.next_offset
            first = batches[0][1].base_offset
            return self._write([buf], len(buf), batches, first, self.time(), -1)

    def _write(
        self,
        chunks: list[Buffer],
        size: int,
        batches: list[tuple[int, BatchHeader]],
        first: int,
        now: int,
        log_append_time: int,
    ) -> AppendResult:
        if self.write_fault is not None:
            self.write_fault()
        if len(batches) == 1:  # the usual append: its one batch's facts, without generators
            h = batches[0][1]
            last, max_timestamp, record_count = h.base_offset + h.last_offset_delta, h.max_timestamp, h.records_count
        else:
            last = batches[-1][1].last_offset
            max_timestamp = max(h.max_timestamp for _, h in batches)
            record_count = sum(h.records_count for _, h in batches)
        segment = self._maybe_roll(size, max_timestamp, first, last, now)
        position = segment.append(chunks, size, batches)
        for _, h in batches:
            if h.partition_leader_epoch >= 0 and self.epoch_cache.assign(
                h.partition_leader_epoch, h.base_offset
            ):
                self.epoch_cache.write()
        # (first, last, log append time, log start, max timestamp, records, size, segment, position)
        return AppendResult(first, last, log_append_time, self.log_start_offset, max_timestamp, record_count, size,
                            segment.base_offset, position)

    def _empty_result(self) -> AppendResult:
        return AppendResult(
            -1,
            -1,
            -1,
            self.log_start_offset,
            -1,
            0,
            0,
            self.active_segment.base_offset,
            self.active_segment.size,
        )

    def _check_open(self) -> None:
        if self.closed:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"log {self.name} is closed")

    # -- rolling -----------------------------------------------------------------------------------

    def _maybe_roll(
        self, size: int, max_timestamp: int, first_offset: int, max_offset: int, now: int
    ) -> LogSegment:
        seg = self._segments[-1]
        cfg = self.config
        if (
            seg.size > cfg.segment_bytes - size
            or (
                seg.size > 0
                and seg.time_waited_for_roll(now, max_timestamp) > cfg.segment_ms - self._roll_jitter_ms
            )
            or seg.offset_index.is_full
            or seg.time_index.is_full
            or not seg.can_hold_offset(max_offset)
        ):
            return self._roll(first_offset)
        return seg

    def roll(self) -> LogSegment:
        """Start a new active segment at the log end offset (no-op when the active one is empty)."""
        with self._lock:
            return self._roll()

    def _roll(self, expected_base: int | None = None) -> LogSegment:
        """New active segment at the log end offset (or at `expected_base`, the first offset of a
        follower append beyond it). An empty active segment is reused, or replaced when it cannot
        hold the expected offsets."""
        new_base = max(self.log_end_offset, expected_base or 0)
        active = self._segments[-1]
        if active.size == 0:
            if active.base_offset == new_base:
                return active
            self._segments.pop()
            self._bases.pop()
            active.delete_files()
        else:
            active.on_become_inactive()
        for path in all_segment_paths(self.dir, new_base):
            # A leftover from a crash between roll steps (an empty segment never loaded).
            if os.path.exists(path):
                os.unlink(path)
        segment = self._new_segment(new_base)
        self._segments.append(segment)
        self._bases.append(new_base)
        self._dir_dirty = True
        self._roll_flush_offset = new_base  # Kafka flushes the rolled segment in the background
        self._roll_jitter_ms = self._new_jitter()
        self.generation += 1
        return segment

    # -- reads -------------------------------------------------------------------------------------

    def read(
        self,
        offset: int,
        max_bytes: int,
        upper_bound: int | None = None,
        min_one_message: bool = True,
    ) -> FetchDataInfo:
        """Whole batches from the one holding `offset`, at most `max_bytes` (but at least one batch
        when `min_one_message`), none at or beyond `upper_bound` (e.g. high watermark or last
        stable offset). OFFSET_OUT_OF_RANGE outside [log start, log end]."""
        with self._lock:
            segments = tuple(self._segments)
            bases = tuple(self._bases)
            start, end = self.log_start_offset, self.log_end_offset
            active_size = segments[-1].size
        if offset < start or offset > end:
            raise KafkaError(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {offset} is outside [{start}, {end}] of {self.name}",
            )
        bound = end if upper_bound is None else min(upper_bound, end)
        empty = FetchDataInfo(EMPTY_SLICE, offset, start, end)
        if offset >= bound:
            return empty
        i = max(0, bisect.bisect_right(bases, offset) - 1)
        for seg in segments[i:]:
            size = active_size if seg is segments[-1] else seg.size
            found = seg.find_batch(offset, size)
            if found is None:
                continue
            pos, header = found
            if header.last_offset >= bound or (not min_one_message and header.size > max_bytes):
                return empty
            stop, next_offset = seg.slice_end(pos, header, max_bytes, bound, size)
            return FetchDataInfo(seg.slice(pos, stop - pos), offset, start, end, next_offset)
        return empty

    # -- aborted transactions ------------------------------------------------------------------------

    def update_txn_index(self, segment_base_offset: int, txn: AbortedTxn) -> None:
        """Record an aborted transaction in the index of the segment holding its ABORT marker."""
        with self._lock:
            i = bisect.bisect_right(self._bases, segment_base_offset) - 1
            segment = self._segments[max(i, 0)]
        segment.txn_index.append(txn)

    def collect_aborted_txns(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions overlapping [fetch_offset, upper_bound), from the segment holding
        `fetch_offset` onwards (Kafka's collectAbortedTransactions)."""
        with self._lock:
            segments = tuple(self._segments)
            bases = tuple(self._bases)
        out: list[AbortedTxn] = []
        for seg in segments[max(0, bisect.bisect_right(bases, fetch_offset) - 1):]:
            found, complete = seg.txn_index.collect(fetch_offset, upper_bound)
            out += found
            if complete:
                break
        return out

    def read_bytes(self, offset: int, max_bytes: int, upper_bound: int | None = None) -> bytes:
        """`read` materialised (the path when sendfile is not possible)."""
        return self.read(offset, max_bytes, upper_bound).records.read()

    # -- offset lookups (ListOffsets) --------------------------------------------------------------

    def offset_for_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """The first record with timestamp >= `timestamp` at or after the log start, or None."""
        with self._lock:
            segments = tuple(self._segments)
            start = self.log_start_offset
        for seg in segments:
            if seg.size == 0 or seg.largest_timestamp() < timestamp:
                continue
            _, ts_offset = seg.time_index.lookup(timestamp)
            _, position = seg.offset_index.lookup(max(ts_offset, start))
            for pos, header in seg.iter_batches_from(position):
                if header.max_timestamp < timestamp or header.last_offset < start:
                    continue
                _, records = decode_batch(seg.read_batch_bytes(pos, header.size), verify_crc=False)
                for record in records:
                    if record.timestamp >= timestamp and record.offset >= start:
                        return TimestampAndOffset(record.timestamp, record.offset, _epoch(header))
            return None
        return None

    def max_timestamp_and_offset(self) -> TimestampAndOffset | None:
        """ListOffsets MAX_TIMESTAMP: the first record carrying the largest timestamp, as Kafka finds it."""
        with self._lock:
            segments = tuple(self._segments)
        best = None
        for seg in segments:
            if best is None or seg.max_timestamp > best.max_timestamp:
                best = seg
        if best is None or best.max_timestamp < 0:
            return None
        target, target_offset = best.max_timestamp, best.offset_of_max_timestamp
        _, position = best.offset_index.lookup(target_offset)
        for pos, header in best.iter_batches_from(position):
            if header.max_timestamp != target:
                continue
            _, records = decode_batch(best.read_batch_bytes(pos, header.size), verify_crc=False)
            for record in records:
                if record.timestamp == target:
                    return TimestampAndOffset(target, record.offset, _epoch(header))
            return None
        return None

    # -- flushing ----------------------------------------------------------------------------------

    def new_directory(self) -> None:
        """The log's directory was just created: its first flush makes it and its entry in the
        log dir durable."""
        self._dir_dirty = self._parent_dirty = True

    @property
    def parent_dirty(self) -> bool:
        return self._parent_dirty

    def parent_synced(self) -> None:
        """The log dir was fsynced after this log's directory was created (LogManager's flusher
        syncs each log dir once for all its new partitions)."""
        self._parent_dirty = False

    def needs_flush(self, now: int | None = None) -> bool:
        """Whether the flush policy (flush.messages / flush.ms) or a finished roll asks for an fsync."""
        unflushed = self.unflushed_messages
        if unflushed <= 0:
            return self._roll_flush_offset is not None or self._dir_dirty
        if unflushed >= self.config.flush_messages:
            return True
        flush_ms = self.config.flush_ms
        if flush_ms < LONG_MAX and (self.time() if now is None else now) - self._last_flush_ms >= flush_ms:
            return True
        return self._roll_flush_offset is not None

    def flush(self, up_to: int | None = None) -> int:
        """fsync the segments holding [recovery point, up_to) (default: everything written) and the
        directory when files were created; returns the new recovery point. Blocking: run it in a
        worker thread (asyncio.to_thread) from the event loop."""
        with self._lock:
            end = self.log_end_offset
            target = end if up_to is None else min(up_to, end)
            if self._roll_flush_offset is not None and self._roll_flush_offset <= target:
                self._roll_flush_offset = None
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            parent_dirty, self._parent_dirty = self._parent_dirty, False
            rp = self.recovery_point
            segments = [
                seg
                for seg, nxt in zip(self._segments, [*self._bases[1:], None])
                if seg.base_offset < target and (nxt is None or nxt > rp)
            ]
        if target <= self.recovery_point and not dir_dirty:
            return self.recovery_point
        started = time.perf_counter()
        for seg in segments:
            seg.flush()
        if dir_dirty:
            fsync_dir(self.dir)
        if parent_dirty:
            fsync_dir(os.path.dirname(self.dir))
        if self.flush_observer is not None:
            self.flush_observer(time.perf_counter() - started)
        with self._lock:
            # what recovery derived from the batches must be on disk before they are below the recovery point
            self.epoch_cache.write_pending()
            self.recovery_point = max(self.recovery_point, min(target, self.log_end_offset))
            self._last_flush_ms = self.time()
            return self.recovery_point

    def flush_if_needed(self, now: int | None = None) -> bool:
        """The background flusher's step: flush what the policy or a finished roll asks for."""
        if not self.needs_flush(now):
            return False
        unflushed = self.unflushed_messages
        elapsed = (self.time() if now is None else now) - self._last_flush_ms
        if unflushed > 0 and (unflushed >= self.config.flush_messages or elapsed >= self.config.flush_ms):
            self.flush()
        elif self._roll_flush_offset is not None:
            self.flush(self._roll_flush_offset)
        else:
            self.flush(self.recovery_point)  # only the directory needs syncing
        return True

    # -- retention ---------------------------------------------------------------------------------

    def delete_old_segments(self, high_watermark: int | None = None) -> int:
        """Kafka's retention: segments below the log start offset, then by retention.bytes, then by
        retention.ms (only with cleanup.policy containing delete). Returns segments deleted."""
        deleted = self._delete_where(self._breaches_log_start, high_watermark)
        if self.config.delete:
            deleted += self._delete_retention_size(high_watermark)
            deleted += self._delete_where(self._breaches_retention_ms, high_watermark)
        self.delete_pending_files()
        return deleted

    def _breaches_log_start(self, seg: LogSegment, nxt: LogSegment | None) -> bool:
        return nxt is not None and nxt.base_offset <= self.log_start_offset

    def _breaches_retention_ms(self, seg: LogSegment, nxt: LogSegment | None) -> bool:
        retention = self.config.retention_ms
        return retention >= 0 and self.time() - seg.largest_timestamp() > retention

    def _delete_retention_size(self, high_watermark: int | None) -> int:
        retention = self.config.retention_bytes
        if retention < 0:
            return 0
        diff = [self.size - retention]
        if diff[0] < 0:
            return 0

        def breaches(seg: LogSegment, nxt: LogSegment | None) -> bool:
            if diff[0] - seg.size >= 0:
                diff[0] -= seg.size
                return True
            return False

        return self._delete_where(breaches, high_watermark)

    def _delete_where(
        self, predicate: Callable[[LogSegment, LogSegment | None], bool], high_watermark: int | None
    ) -> int:
        with self._lock:
            hw = self.log_end_offset if high_watermark is None else high_watermark
            deletable: list[LogSegment] = []
            segs = self._segments
            for i, seg in enumerate(segs):
                nxt = segs[i + 1] if i + 1 < len(segs) else None
                upper = nxt.base_offset if nxt is not None else self.log_end_offset
                if nxt is None and seg.size == 0:
                    break
                if hw < upper or not predicate(seg, nxt):
                    break
                deletable.append(seg)
            if not deletable:
                return 0
            if len(deletable) == len(segs):
                # Never leave the log without a segment: roll first, the old active one goes too.
                new_active = self._roll()
                if deletable[-1] is new_active:
                    deletable.pop()
            if deletable:
                self._remove_segments(deletable)
            return len(deletable)

    def _remove_segments(self, doomed: list[LogSegment]) -> None:
        """Drop a prefix of segments from the log: advance the log start, rename to .deleted and
        schedule the unlink after file.delete.delay.ms. Caller holds the lock."""
        nxt = self._segments[len(doomed)]
        self._set_log_start_offset(max(self.log_start_offset, nxt.base_offset))
        del self._segments[: len(doomed)]
        del self._bases[: len(doomed)]
        self.generation += 1
        self._schedule_delete(doomed)

    def _schedule_delete(self, doomed: list[LogSegment]) -> None:
        due = self.time() + self.config.file_delete_delay_ms
        for seg in doomed:
            seg.close()
            seg.detach_indexes()
            try:
                seg.change_suffix(DELETED_SUFFIX)
            except FileNotFoundError:
                pass
            self._pending_deletes.append((due, seg))
        self._dir_dirty = True

    def delete_pending_files(self, force: bool = False) -> int:
        """Unlink `.deleted` segment files whose delay has passed. Open slices stay readable."""
        now = self.time()
        with self._lock:
            due = [seg for when, seg in self._pending_deletes if force or when <= now]
            self._pending_deletes = [(w, s) for w, s in self._pending_deletes if not (force or w <= now)]
        for seg in due:
            seg.delete_files()
        return len(due)

    def _set_log_start_offset(self, offset: int) -> None:
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            if self.epoch_cache.truncate_from_start(offset):
                self.epoch_cache.write()

    def delete_records_before(self, offset: int, high_watermark: int | None = None) -> int:
        """DeleteRecords: raise the log start offset to `offset` (-1: the high watermark) and drop the
        segments wholly below it. Returns the new log start offset."""
        with self._lock:
            hw = self.log_end_offset if high_watermark is None else high_watermark
            if offset == -1:
                offset = hw
            if offset < 0 or offset > hw:
                raise KafkaError(
                    ErrorCode.OFFSET_OUT_OF_RANGE,
                    f"cannot move the log start of {self.name} to {offset}: high watermark is {hw}",
                )
            self._set_log_start_offset(offset)
        self._delete_where(self._breaches_log_start, high_watermark)
        return self.log_start_offset

    # -- truncation --------------------------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after `offset` (a batch containing it goes entirely)."""
        with self._lock:
            if offset >= self.log_end_offset:
                # Nothing to remove, but the epoch cache may end with an epoch this replica began
                # as leader at its log end without appending to it, which the leader's history
                # does not have: as Kafka's truncateTo, it goes (a follower told to truncate to
                # its own end fetched with that epoch, was told to truncate again, forever).
                if self.epoch_cache.truncate_from_end(self.log_end_offset):
                    self.epoch_cache.write()
                return
            if offset <= self._segments[0].base_offset:
                self._truncate_fully(max(offset, 0))
                return
            keep = [s for s in self._segments if s.base_offset < offset]
            doomed = self._segments[len(keep) :]
            if doomed:
                for seg in doomed:
                    seg.close()
                self._schedule_delete(doomed)
                self._segments = keep
                self._bases = [s.base_offset for s in keep]
            self._segments[-1].truncate_to(offset)
            self._after_truncation()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        with self._lock:
            self._truncate_fully(offset)

    def _truncate_fully(self, offset: int) -> None:
        doomed = list(self._segments)
        self._schedule_delete(doomed)
        for path in all_segment_paths(self.dir, offset):
            if os.path.exists(path):
                os.unlink(path)
        seg = self._new_segment(offset)
        self._segments = [seg]
        self._bases = [offset]
        self.log_start_offset = offset
        self.epoch_cache.clear()
        self.epoch_cache.write()
        self._after_truncation()

    def _after_truncation(self) -> None:
        end = self.log_end_offset
        self.recovery_point = min(self.recovery_point, end)
        if self.cleaner_checkpoint is not None and self.cleaner_checkpoint > end:
            self.cleaner_checkpoint = None
        if self.epoch_cache.truncate_from_end(end):
            self.epoch_cache.write()
        self.log_start_offset = min(self.log_start_offset, end)
        self.generation += 1
        self._dir_dirty = True

    # -- cleaner support ---------------------------------------------------------------------------

    def replace_segments(self, new: LogSegment, old: list[LogSegment]) -> bool:
        """Swap a cleaned segment (files suffixed `.cleaned`) in for `old`, Kafka's way: .cleaned ->
        .swap, old -> .deleted, .swap -> live. False (and the new files removed) when the log changed
        under the cleaner so that `old` is no longer a run of its segments."""
        with self._lock:
            try:
                i = next(k for k, s in enumerate(self._segments) if s is old[0])
            except StopIteration:
                i = -1
            if i < 0 or self._segments[i : i + len(old)] != old or i + len(old) >= len(self._segments):
                new.delete_files()
                return False
            new.flush()  # a no-op when the cleaner already synced it
            new.change_suffix(".swap")
            fsync_dir(self.dir)
            self._schedule_delete(old)
            new.change_suffix("")
            fsync_dir(self.dir)
            self._segments[i : i + len(old)] = [new]
            self._bases = [s.base_offset for s in self._segments]
            self.generation += 1
            return True

    # -- leader epochs -----------------------------------------------------------------------------

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """OffsetForLeaderEpoch: (epoch, end offset)."""
        with self._lock:
            return self.epoch_cache.end_offset_for(epoch, self.log_end_offset)

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Clean close: final index entries, everything fsynced, recovery point = log end offset."""
        if self.closed:
            return
        with self._lock:
            for seg in self._segments:
                seg.close()
        self.flush()
        with self._lock:
            self.epoch_cache.write_pending()
            for seg in self._segments:
                seg.flush_indexes()
                seg.release_handles()
            self.delete_pending_files(force=True)
            self.closed = True

    def release_handles(self) -> None:
        """Give every open file back to the pool (they reopen on demand)."""
        with self._lock:
            for seg in self._segments:
                seg.release_handles()

    def close_handles(self) -> None:
        """Release write handles without flushing (the directory is about to be deleted)."""
        with self._lock:
            for seg in self._segments:
                seg.close()
            self.closed = True

    def abandon(self) -> None:
        """Let go of every file as a killed process does: nothing more is written or fsynced (what
        reached the OS stays), so the next start finds the state `kill -9` leaves behind."""
        with self._lock:
            for seg in self._segments:
                seg.abandon()
            self.closed = True


def _epoch(header: BatchHeader) -> int:
    return header.partition_leader_epoch if header.partition_leader_epoch >= 0 else -1
