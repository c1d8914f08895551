"""One log segment: `<base>.log` (record batches back to back) with its `.index` and `.timeindex`.

The segment's files are opened on demand through the process's pool of open files
(broker/log/handles.py), which closes the least recently used and the idle ones: a broker with
many partitions holds descriptors only for those in use. Readers get slices of the file
(`FileSlice`) that hold its open handle, so a segment deleted by retention or replaced by the
cleaner stays readable through slices already handed out (an open descriptor survives unlink on
Linux; a handle's descriptor closes when its last holder lets go, never under a reader).

Indexes are loaded lazily (on first lookup) and sanity-checked then; a failed check rebuilds
them from the batch headers. `recover()` is the crash path: every batch is checked (length,
magic, CRC-32C) and the file is truncated at the first invalid byte.
"""

from __future__ import annotations

import mmap
import os
import threading
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass

from broker.log.handles import FileHandle, PooledFile
from broker.log.index import CorruptIndexError, OffsetIndex, TimeIndex
from broker.log.txn_index import TransactionIndex
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import (
    LOG_OVERHEAD,
    RECORD_BATCH_OVERHEAD,
    BatchHeader,
    parse_batch_header,
    validate_batch,
)

INT32_MAX = (1 << 31) - 1
Buffer = bytes | bytearray | memoryview
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIME_INDEX_SUFFIX = ".timeindex"
TXN_INDEX_SUFFIX = ".txnindex"
DELETED_SUFFIX = ".deleted"
CLEANED_SUFFIX = ".cleaned"
SWAP_SUFFIX = ".swap"

_HEADER_CHUNK = 64 * 1024
# recover() reads a file up to this size with one pread; a larger one is mapped. Mapping costs a
# few syscalls, page faults and a TLB flush at unmap: most of the scan of a small file.
_READ_WHOLE_BYTES = 1 << 20
# (offset index listed, time index listed): one shared tuple of each kind, not one per segment
_LISTED = {(a, b): (a, b) for a in (False, True) for b in (False, True)}


def filename_prefix(offset: int) -> str:
    return f"{offset:020d}"


def segment_paths(directory: str, base_offset: int, suffix: str = "") -> tuple[str, str, str]:
    prefix = os.path.join(directory, filename_prefix(base_offset))
    return prefix + LOG_SUFFIX + suffix, prefix + INDEX_SUFFIX + suffix, prefix + TIME_INDEX_SUFFIX + suffix


def txn_index_path(directory: str, base_offset: int, suffix: str = "") -> str:
    return os.path.join(directory, filename_prefix(base_offset)) + TXN_INDEX_SUFFIX + suffix


def all_segment_paths(directory: str, base_offset: int, suffix: str = "") -> tuple[str, ...]:
    """The log, its indexes and its aborted-transaction index."""
    return (*segment_paths(directory, base_offset, suffix), txn_index_path(directory, base_offset, suffix))


@dataclass(frozen=True)
class FileSlice:
    """A byte range of a segment file: whole record batches, ready for os.sendfile or `read()`."""

    file: FileHandle | None
    position: int
    length: int

    def fileno(self) -> int:
        if self.file is None:
            raise ValueError("empty slice has no file")
        return self.file.fd

    def read(self) -> bytes:
        if not self.length or self.file is None:
            return b""
        return read_exact(self.file.fd, self.position, self.length)

    def batches(self) -> Iterator[tuple[int, BatchHeader]]:
        """(position in the slice, header) of its whole batches, from the file: the headers are
        parsed, the records are left where they are."""
        if not self.length or self.file is None:
            return
        start = self.position
        for pos, header in walk_headers(self.file, start, start + self.length):
            yield pos - start, header

    def sub(self, start: int, end: int) -> FileSlice:
        """The bytes [start, end) of this slice (positions as `batches` gives them)."""
        if start == 0 and end == self.length:
            return self
        return FileSlice(self.file, self.position + start, end - start)

    def __len__(self) -> int:
        return self.length


EMPTY_SLICE = FileSlice(None, 0, 0)


def read_exact(fd: int, position: int, length: int) -> bytes:
    data = os.pread(fd, length, position)
    if len(data) == length:
        return data
    parts = [data]
    got = len(data)
    while got < length:
        more = os.pread(fd, length - got, position + got)
        if not more:
            raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, f"short read at {position + got}")
        parts.append(more)
        got += len(more)
    return b"".join(parts)


def write_all(fd: int, data: Buffer, position: int) -> None:
    view = memoryview(data)
    n = os.pwrite(fd, view, position)
    while n < len(view):  # a short write (rare): the rest
        view = view[n:]
        position += n
        n = os.pwrite(fd, view, position)


_IOV_MAX = 1024


def write_chunks(fd: int, chunks: list[Buffer], size: int, position: int) -> None:
    """pwritev the chunks back to back (one syscall for the usual few chunks)."""
    if len(chunks) == 1:
        write_all(fd, chunks[0], position)
        return
    if len(chunks) <= _IOV_MAX:
        written = os.pwritev(fd, chunks, position)
        if written == size:
            return
    else:
        written = 0
    # A short write (or too many chunks): finish with plain writes of what is left.
    rest = b"".join(bytes(c) for c in chunks)[written:]
    write_all(fd, rest, position + written)


class LogSegment:
    """A segment's files and the in-memory facts about them. Not thread-safe: the Log serialises writers."""

    def __init__(
        self,
        directory: str,
        base_offset: int,
        *,
        index_interval_bytes: int,
        max_index_bytes: int,
        now_ms: int,
        suffix: str = "",
        create: bool = False,
        size: int | None = None,
        listing: Collection[str] | None = None,
    ) -> None:
        """`size`: the log file's size when the caller knows it (recovery measures it again);
        `listing`: the file names of the directory when the caller just read it (the loader), so
        that which index files exist is known without a syscall each."""
        self.directory = directory
        self.base_offset = base_offset
        self.suffix = suffix
        self.log_path, index_path, time_index_path = segment_paths(directory, base_offset, suffix)
        if create:
            self._file, _ = PooledFile.create(self.log_path, os.O_RDWR)  # written at once: kept open
            self.size = 0
        else:
            self._file = PooledFile(self.log_path, os.O_RDWR)  # opened at its first use
            self.size = os.stat(self.log_path).st_size if size is None else size
        self.index_interval_bytes = index_interval_bytes
        self.offset_index = OffsetIndex(index_path, base_offset, max_index_bytes)
        self.time_index = TimeIndex(time_index_path, base_offset, max_index_bytes)
        txn_path = txn_index_path(directory, base_offset, suffix)
        self.txn_index = TransactionIndex(
            txn_path, base_offset, exists=None if listing is None else os.path.basename(txn_path) in listing)
        # whether the index files exist, from the listing (used by the first rebuild only)
        self._indexes_listed: tuple[bool, bool] | None = None
        if listing is not None:
            self._indexes_listed = _LISTED[(os.path.basename(index_path) in listing,
                                            os.path.basename(time_index_path) in listing)]
        # whether a batch of an idempotent or transactional producer is here (None: not known;
        # recover() finds out), so that rebuilding the producer state can skip the segment
        self.producer_batches: bool | None = None
        self.created_ms = now_ms
        self._loaded = False
        self._load_lock = threading.Lock()  # the cleaner thread and the event loop may both load
        self._next_offset = base_offset
        self._bytes_since_last_index_entry = 0
        self._max_timestamp = -1
        self._offset_of_max_timestamp = base_offset
        self._rolling_timestamp: int | None = None  # maxTimestamp of the first batch
        if create:
            # A new segment starts with empty index files, so a crash right after creation
            # leaves a complete (empty) segment rather than one with missing indexes.
            for path in (index_path, time_index_path):
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
            self._loaded = True

    def __repr__(self) -> str:
        return f"LogSegment(base={self.base_offset}, size={self.size}, suffix={self.suffix!r})"

    # -- lazily loaded facts ---------------------------------------------------------------------

    @property
    def file(self) -> FileHandle:
        """The open log file (opened now if the pool had dropped it); hold it while its fd is used."""
        return self._file.handle()

    @property
    def next_offset(self) -> int:
        """One past the last offset of the last batch (base offset when empty)."""
        self.ensure_loaded()
        return self._next_offset

    @property
    def max_timestamp(self) -> int:
        self.ensure_loaded()
        return self._max_timestamp

    @property
    def offset_of_max_timestamp(self) -> int:
        """Last offset of the first batch that carried the segment's largest timestamp."""
        self.ensure_loaded()
        return self._offset_of_max_timestamp

    def largest_timestamp(self) -> int:
        """Kafka's rule for retention.ms: the largest record timestamp, else the file's mtime."""
        ts = self.max_timestamp
        return ts if ts >= 0 else self.last_modified_ms()

    def last_modified_ms(self) -> int:
        try:
            return os.stat(self.log_path).st_mtime_ns // 1_000_000
        except FileNotFoundError:
            return 0

    def rolling_timestamp(self) -> int:
        """maxTimestamp of the first batch (Kafka's base for segment.ms), -1 when unknown."""
        if self._rolling_timestamp is None:
            if self.size >= RECORD_BATCH_OVERHEAD:
                handle = self.file
                try:
                    self._rolling_timestamp = parse_batch_header(
                        os.pread(handle.fd, RECORD_BATCH_OVERHEAD, 0)
                    ).max_timestamp
                except ProtocolError:
                    self._rolling_timestamp = -1
            else:
                return -1
        return self._rolling_timestamp

    def time_waited_for_roll(self, now_ms: int, message_timestamp: int) -> int:
        ts = self.rolling_timestamp()
        return message_timestamp - ts if ts >= 0 else now_ms - self.created_ms

    def ensure_loaded(self) -> None:
        """Load and sanity-check the indexes (rebuilding them from the log when they fail)."""
        if self._loaded:
            return
        with self._load_lock:
            if not self._loaded:
                self.load_indexes()

    def load_indexes(self, rebuild: bool = True) -> bool:
        """Load and check the indexes; True when they passed. On failure they are rebuilt from the
        batch headers (when `rebuild`), else the caller recovers the segment."""
        listed = self._indexes_listed
        if listed is not None:
            ok = listed[0] and listed[1]
        else:
            ok = os.path.exists(self.offset_index.path) and os.path.exists(self.time_index.path)
        try:
            if ok:
                self.offset_index.load()
                self.time_index.load()
                self.offset_index.check(self.size)
                ok = self._check_tail()
                if ok:
                    self.time_index.check(self._next_offset)
                    ts, off = self.time_index.last_entry
                    if ts > self._max_timestamp:
                        self._max_timestamp, self._offset_of_max_timestamp = ts, off
        except (CorruptIndexError, ProtocolError):
            ok = False
        if ok:
            self._loaded = True
            self._indexes_listed = None
        elif rebuild:
            self.rebuild_indexes()
        return ok

    def _check_tail(self) -> bool:
        """Walk the batches after the last index entry: they must end exactly at the end of the data
        and start within one index interval of that entry (otherwise the index is short)."""
        self._reset_facts()
        last_offset, start = self.offset_index.lookup(1 << 62)
        has_entries = self.offset_index.entries > 0
        expected = self.base_offset
        end = start
        for pos, header in walk_headers(self._file.transient(), start, self.size):
            if pos - start > self.index_interval_bytes or header.base_offset < expected:
                return False
            if pos == start and has_entries and header.last_offset != last_offset:
                return False
            if header.max_timestamp > self._max_timestamp:
                self._max_timestamp = header.max_timestamp
                self._offset_of_max_timestamp = header.last_offset
            expected = self._next_offset = header.next_offset
            end = pos + header.size
        if end != self.size:
            return False
        # Continue the sparse-entry rhythm where the previous writer left it.
        self._bytes_since_last_index_entry = end - start
        return True

    def rebuild_indexes(self) -> None:
        """Rebuild both indexes from the batch headers (no CRC: the data is trusted below the recovery point)."""
        self._start_rebuild()
        end = 0
        try:
            for pos, header in walk_headers(self.file, 0, self.size):
                self._index_batch(header, pos)
                end = pos + header.size
        except ProtocolError:
            pass
        if end != self.size:
            # Bytes we cannot parse below the recovery point: keep them out of reach of readers.
            self.size = end
        self._finish_rebuild()
        # Below the recovery point nothing rebuilds them after a crash: write them now.
        self.offset_index.write_pending()
        self.time_index.write_pending()

    def _start_rebuild(self) -> None:
        self.offset_index.start_deferred()
        self.time_index.start_deferred()
        self._reset_facts()

    def _finish_rebuild(self) -> None:
        self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        listed, self._indexes_listed = self._indexes_listed, None
        self.offset_index.finish_deferred(None if listed is None else listed[0])
        self.time_index.finish_deferred(None if listed is None else listed[1])
        self._loaded = True

    def _reset_facts(self) -> None:
        self._next_offset = self.base_offset
        self._bytes_since_last_index_entry = 0
        self._max_timestamp = -1
        self._offset_of_max_timestamp = self.base_offset
        self._rolling_timestamp = None

    def _index_batch(self, header: BatchHeader, position: int) -> None:
        """Account one batch written at `position`: max timestamp, sparse index entries, next offset."""
        if header.max_timestamp > self._max_timestamp:
            self._max_timestamp = header.max_timestamp
            self._offset_of_max_timestamp = header.last_offset
        if self._bytes_since_last_index_entry > self.index_interval_bytes:
            self.offset_index.append(header.last_offset, position)
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
            self._bytes_since_last_index_entry = 0
        self._bytes_since_last_index_entry += header.size
        self._next_offset = header.next_offset

    # -- crash recovery -------------------------------------------------------------------------

    def recover(
        self, expected_next_offset: int | None = None, on_batch: Callable[[BatchHeader], None] | None = None
    ) -> int:
        """Validate every batch (length, magic, CRC, offsets ascending) and truncate at the first invalid
        byte. Rebuilds the indexes. Returns the number of bytes truncated."""
        self._start_rebuild()
        self.producer_batches = False
        handle = self._file.transient()  # not through the pool: a start-up scans thousands once
        file_size = os.fstat(handle.fd).st_size
        valid = 0
        if file_size:
            expected = max(self.base_offset, expected_next_offset or self.base_offset)
            if file_size <= _READ_WHOLE_BYTES:
                valid = self._scan(read_exact(handle.fd, 0, file_size), file_size, expected, on_batch)
            else:
                with mmap.mmap(handle.fd, file_size, access=mmap.ACCESS_READ) as mm:
                    if hasattr(mmap, "MADV_SEQUENTIAL"):
                        # Aggressive read-ahead: a cold scan takes about half the time.
                        # (MAP_POPULATE was measured too: no better, and it blocks up front.)
                        mm.madvise(mmap.MADV_SEQUENTIAL)
                    with memoryview(mm) as view:
                        valid = self._scan(view, file_size, expected, on_batch)
        truncated = file_size - valid
        if truncated:
            os.ftruncate(handle.fd, valid)
        self.size = valid
        self._finish_rebuild()
        return truncated

    def _scan(
        self, mm: Buffer, file_size: int, expected: int, on_batch: Callable[[BatchHeader], None] | None
    ) -> int:
        pos = 0
        base = self.base_offset
        producer_batches = False
        while file_size - pos >= RECORD_BATCH_OVERHEAD:
            try:
                header = validate_batch(mm, pos)
            except ProtocolError:
                break
            if (
                header.base_offset < expected
                or header.last_offset - base > INT32_MAX
                or header.records_count > header.last_offset_delta + 1
            ):
                break
            self._index_batch(header, pos)
            if on_batch is not None:
                on_batch(header)
            if header.producer_id >= 0:
                producer_batches = True
            expected = header.next_offset
            pos += header.size
        self.producer_batches = producer_batches
        return pos

    # -- writes -----------------------------------------------------------------------------------

    def append(self, chunks: list[Buffer], size: int, headers: list[tuple[int, BatchHeader]]) -> int:
        """Write batches (offsets already assigned) at the end: `chunks` are their bytes (`size` in
        all), `headers` their positions relative to the first byte. Returns the file position."""
        self.ensure_loaded()
        position = self.size
        handle = self._file.handle()
        write_chunks(handle.fd, chunks, size, position)
        self.size = position + size
        for rel, header in headers:
            if self._rolling_timestamp is None and position + rel == 0:
                self._rolling_timestamp = header.max_timestamp
            self._index_batch(header, position + rel)
        return position

    def can_hold_offset(self, offset: int) -> bool:
        return 0 <= offset - self.base_offset <= INT32_MAX

    def on_become_inactive(self) -> None:
        """At roll: record the final max timestamp in the time index and release write handles."""
        self.ensure_loaded()
        self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.offset_index.close()
        self.time_index.close()

    def truncate_to(self, offset: int) -> int:
        """Remove every batch at or after `offset` (which must be a batch boundary or past the end).
        Returns the bytes removed."""
        self.ensure_loaded()
        position = self.find_position(offset)
        if position is None:
            return 0
        removed = self.size - position
        handle = self.file
        os.ftruncate(handle.fd, position)
        self.size = position
        self.offset_index.truncate_to(offset)
        self.time_index.truncate_to(offset)
        self.txn_index.truncate_to(offset)
        # Recompute the in-memory facts from what is left.
        self._reset_facts()
        self._loaded = False
        self.load_indexes()
        return removed

    def flush(self) -> None:
        self._file.fsync()
        self.flush_indexes()

    def flush_indexes(self) -> None:
        self.offset_index.flush()
        self.time_index.flush()
        self.txn_index.flush()

    def close(self) -> None:
        """Clean close: final time index entry, handles released (a reader holding one keeps it)."""
        if self._loaded:
            self.time_index.maybe_append(self._max_timestamp, self._offset_of_max_timestamp)
        self.release_handles()

    def release_handles(self) -> None:
        """Give the open files back to the pool now (reopened on demand at the next use)."""
        self._file.close()
        self.offset_index.close()
        self.time_index.close()

    @property
    def holds_handles(self) -> bool:
        return self._file.is_open or self.offset_index.is_open or self.time_index.is_open

    def abandon(self) -> None:
        """Release the handles without writing anything more (see Log.abandon)."""
        self.release_handles()

    # -- reads ---------------------------------------------------------------------------------------

    def find_batch(self, offset: int, size: int | None = None) -> tuple[int, BatchHeader] | None:
        """The first batch whose last offset is >= `offset` (the one holding it, or the next after a
        gap), looking no further than `size` bytes (a snapshot of the active segment's size)."""
        self.ensure_loaded()
        end = self.size if size is None else size
        _, position = self.offset_index.lookup(offset)
        for pos, header in walk_headers(self.file, position, end):
            if header.last_offset >= offset:
                return pos, header
        return None

    def find_position(self, offset: int) -> int | None:
        found = self.find_batch(offset)
        return None if found is None else found[0]

    def slice_end(self, start: int, first: BatchHeader, max_bytes: int, upper_bound: int,
                  size: int) -> tuple[int, int]:
        """End position of the run of whole batches from `start` that fits `max_bytes` (at least the
        first batch, assumed below the bound) and holds no offset at or beyond `upper_bound`, and
        the offset after that run (the next batch's base offset; -1 when not known)."""
        limit = start + max(max_bytes, first.size)
        end = start + first.size
        if limit >= size and upper_bound >= self._next_offset and size == self.size:
            return size, self._next_offset
        # Jump with the index to the last indexed batch starting before the limit, walk from there.
        idx_offset, idx_pos = self.offset_index.lookup_position(limit)
        walk_from = end
        next_offset = first.next_offset
        if idx_pos >= end and idx_offset < upper_bound:
            walk_from = end = idx_pos
            next_offset = -1
        for pos, header in walk_headers(self.file, walk_from, size):
            if pos + header.size > limit or header.last_offset >= upper_bound:
                next_offset = header.base_offset
                break
            end = pos + header.size
            next_offset = header.next_offset
        return end, next_offset

    def slice(self, position: int, length: int) -> FileSlice:
        return FileSlice(self.file, position, length)

    def iter_batches_from(self, position: int = 0) -> Iterator[tuple[int, BatchHeader]]:
        return walk_headers(self.file, position, self.size)

    def read_batch_bytes(self, position: int, size: int) -> bytes:
        handle = self.file
        return read_exact(handle.fd, position, size)

    # -- file management --------------------------------------------------------------------------

    def change_suffix(self, new_suffix: str) -> None:
        """Rename the segment's files (e.g. "" -> ".deleted", ".cleaned" -> ".swap" -> "")."""
        new_log, new_index, new_time = segment_paths(self.directory, self.base_offset, new_suffix)
        os.replace(self.log_path, new_log)
        self.log_path = new_log
        self._file.rename(new_log)
        self.offset_index.rename(new_index)
        self.time_index.rename(new_time)
        self.txn_index.rename(txn_index_path(self.directory, self.base_offset, new_suffix))
        self.suffix = new_suffix

    def detach_indexes(self) -> None:
        """The segment is leaving the log: its index files must not be written (or recreated) again."""
        self.offset_index.detach()
        self.time_index.detach()

    def delete_files(self) -> None:
        self.detach_indexes()
        self._file.close()
        for path in (self.log_path, self.offset_index.path, self.time_index.path):
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
        self.txn_index.delete()


def walk_headers(file: int | FileHandle, start: int, end: int) -> Iterator[tuple[int, BatchHeader]]:
    """(position, header) of the whole batches in [start, end), reading in chunks. Stops at a
    partial batch; raises ProtocolError at an impossible header (bad magic/length). A FileHandle
    is held until the walk ends."""
    fd = file if isinstance(file, int) else file.fd
    buf = b""
    buf_start = start
    pos = start
    while end - pos >= RECORD_BATCH_OVERHEAD:
        off = pos - buf_start
        if off + RECORD_BATCH_OVERHEAD > len(buf):
            buf = os.pread(fd, min(_HEADER_CHUNK, end - pos), pos)
            buf_start, off = pos, 0
            if len(buf) < RECORD_BATCH_OVERHEAD:
                return
        header = parse_batch_header(buf, off)
        size = header.batch_length + LOG_OVERHEAD
        if pos + size > end:
            return
        yield pos, header
        pos += size
