"""Sparse offset and time indexes in Kafka's file formats.

`.index`     8-byte entries: relative offset int32, file position int32 (big endian).
`.timeindex` 12-byte entries: timestamp int64, relative offset int32 (big endian).

Entries are kept in memory as the file's own bytes (a bytearray) and appended to the file with
pwrite (rebuilds write the whole file once), so the file is always exactly `entries * entry_size`
bytes: what Kafka leaves on disk after it trims its preallocated index on roll or clean shutdown.
We do not preallocate: there is no mmap to size up front, nothing to trim, and a torn tail after a
crash is caught by the sanity check on load. segment.index.bytes still bounds the entries (the
segment rolls when an index is full), as in Kafka.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Callable, Iterable

from broker.log.checkpoint import read_whole
from broker.log.handles import FileHandle, PooledFile

_OFFSET_ENTRY = struct.Struct(">ii")
_TIME_ENTRY = struct.Struct(">qi")


class CorruptIndexError(Exception):
    """An index that fails its sanity check; the segment rebuilds it from the log."""


class _Index:
    __slots__ = ("path", "base_offset", "max_entries", "_buf", "_file", "_dirty", "_stale", "_deferred", "_detached",
                 "_last")
    entry: struct.Struct  # the subclasses' entry layout (a class attribute)

    def __init__(self, path: str, base_offset: int, max_index_bytes: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.max_entries = 1
        self.set_max_size(max_index_bytes)
        self._buf = bytearray()
        self._file = PooledFile(path, os.O_RDWR | os.O_CREAT)  # opened at the first write (handles.py)
        self._dirty = False  # written since the last fsync
        self._stale = False  # the file does not hold the entries yet (a rebuild at start-up): write_pending()
        self._deferred = False  # entries kept in memory until finish_deferred() (bulk rebuilds)
        self._detached = False  # the segment is being deleted: never touch the file again
        self._last: tuple[int, int] = self._empty_last()  # decoded last entry (hot path)

    def _empty_last(self) -> tuple[int, int]:
        raise NotImplementedError

    def set_max_size(self, max_index_bytes: int) -> None:
        """segment.index.bytes: the segment rolls when its index holds this many bytes (as Kafka,
        both indexes get the same byte budget, so the time index holds fewer entries)."""
        self.max_entries = max(1, max_index_bytes // self.entry.size)

    def _changed(self) -> None:
        """Refresh the cached last entry after the entries were replaced or truncated."""
        n = len(self._buf) // self.entry.size
        self._last = self.entry_at(n - 1) if n else self._empty_last()

    def entry_at(self, n: int) -> tuple[int, int]:
        raise NotImplementedError

    # -- file handling -----------------------------------------------------------------------

    def load(self) -> None:
        """Read the file (missing means empty); raise CorruptIndexError when its size is not whole entries."""
        try:
            data = read_whole(self.path)
        except FileNotFoundError:
            data = b""
        if len(data) % self.entry.size:
            raise CorruptIndexError(f"{self.path}: size {len(data)} is not a multiple of {self.entry.size}")
        self._buf = bytearray(data)
        self._stale = False
        self._changed()

    def _writer(self) -> FileHandle:
        """The file's handle for a write (keep it while its fd is in use)."""
        return self._file.handle()

    def rewrite(self, entries: Iterable[tuple[int, int]]) -> None:
        """Replace every entry."""
        pack = self.entry.pack
        self.rewrite_raw(b"".join(pack(*self._encode(a, b)) for a, b in entries))

    def detach(self) -> None:
        """From now on changes stay in memory (a reader may still lazily load a deleted segment)."""
        self.close()
        self._detached = True
        self._stale = False

    def _append_raw(self, raw: bytes) -> None:
        if self._stale:
            self._buf += raw
            self.write_pending()
            return
        if not (self._deferred or self._detached):
            handle = self._writer()
            os.pwrite(handle.fd, raw, len(self._buf))
            self._dirty = True
        self._buf += raw

    def start_deferred(self) -> None:
        """Rebuild mode: start empty and keep new entries in memory (one write at the end)."""
        self._buf = bytearray()
        self._changed()
        self._deferred = True

    def finish_deferred(self, exists: bool | None = None) -> None:
        """End of a rebuild: the entries are complete in memory. The file is written later (the
        next append, truncation or flush: `write_pending`), and only when it does not hold them
        already. A start-up after a crash rebuilds the indexes of thousands of segments, mostly to
        what they were; writing them all would cost it its time (a second crash meanwhile finds
        the segment past the recovery point, and rebuilds it again). `exists`: whether the file
        exists, when the caller knows (it just listed the directory)."""
        self._deferred = False
        self._changed()
        if self._detached:
            return
        if exists if exists is not None else os.path.exists(self.path):
            self._stale = True
        else:
            self.rewrite_raw(bytes(self._buf))  # a segment has its index files at all times

    def write_pending(self) -> None:
        """Write the entries of a rebuild, unless the file holds them already (as it mostly does)."""
        if not self._stale:
            return
        try:
            with open(self.path, "rb") as f:
                same = f.read(len(self._buf) + 1) == self._buf
        except FileNotFoundError:
            same = False
        if same:
            self._stale = False
        else:
            self.rewrite_raw(bytes(self._buf))

    def rewrite_raw(self, data: bytes) -> None:
        self._buf = bytearray(data)
        self._stale = False
        self._changed()
        if self._detached:
            return
        handle = self._writer()
        # Write, then cut to size (not the other way round: ext4 flushes a file truncated to
        # zero and rewritten when it is closed).
        if data:
            os.pwrite(handle.fd, data, 0)
        os.ftruncate(handle.fd, len(data))
        self._dirty = True

    def _truncate_entries(self, n: int) -> None:
        size = n * self.entry.size
        if size < len(self._buf):
            del self._buf[size:]
            self._changed()
            if self._stale:
                self.write_pending()
            elif not self._detached:
                handle = self._writer()
                os.ftruncate(handle.fd, size)
                self._dirty = True

    def flush(self) -> None:
        """fsync when written since the last flush (through the open handle, or the path when the
        handle was dropped: an fsync of any descriptor of the file makes its writes durable)."""
        self.write_pending()
        if not self._dirty:
            return
        self._dirty = False
        try:
            self._file.fsync()
        except FileNotFoundError:
            pass  # renamed or deleted meanwhile: nothing left to make durable

    def close(self) -> None:
        """Release the write handle (the entries stay readable in memory)."""
        self._file.close()

    @property
    def is_open(self) -> bool:
        return self._file.is_open

    def rename(self, path: str) -> None:
        if os.path.exists(self.path):
            os.replace(self.path, path)
        self.path = path
        self._file.rename(path)

    # -- entries -----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._buf) // self.entry.size

    @property
    def entries(self) -> int:
        return len(self)

    @property
    def size_in_bytes(self) -> int:
        return len(self._buf)

    def _encode(self, a: int, b: int) -> tuple[int, int]:
        raise NotImplementedError

    def _raw(self, n: int) -> tuple[int, int]:
        return self.entry.unpack_from(self._buf, n * self.entry.size)  # type: ignore[return-value]

    def _largest_lower_bound(self, target: int, key: Callable[[int], int]) -> int:
        """Slot of the last entry whose key is <= target, or -1."""
        lo, hi = 0, len(self) - 1
        if hi < 0 or key(0) > target:
            return -1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if key(mid) <= target:
                lo = mid
            else:
                hi = mid - 1
        return lo


class OffsetIndex(_Index):
    """Maps a batch's last offset to the file position where that batch starts (as Kafka 4 writes it)."""

    __slots__ = ()

    entry = _OFFSET_ENTRY

    def _encode(self, a: int, b: int) -> tuple[int, int]:
        return a - self.base_offset, b

    def _empty_last(self) -> tuple[int, int]:
        return self.base_offset, 0

    def entry_at(self, n: int) -> tuple[int, int]:
        rel, pos = self._raw(n)
        return self.base_offset + rel, pos

    @property
    def is_full(self) -> bool:
        return len(self._buf) >= self.max_entries * 8

    @property
    def last_offset(self) -> int:
        return self._last[0]

    def append(self, offset: int, position: int) -> None:
        if self._buf and offset <= self._last[0]:
            raise ValueError(f"index offset {offset} not above last {self._last[0]} in {self.path}")
        self._append_raw(_OFFSET_ENTRY.pack(offset - self.base_offset, position))
        self._last = (offset, position)

    def lookup(self, offset: int) -> tuple[int, int]:
        """(offset, position) of the last entry with offset <= target, else (base offset, 0)."""
        slot = self._largest_lower_bound(offset - self.base_offset, lambda n: self._raw(n)[0])
        return (self.base_offset, 0) if slot < 0 else self.entry_at(slot)

    def lookup_position(self, position: int) -> tuple[int, int]:
        """(offset, position) of the last entry starting at or before `position`, else (base, 0)."""
        slot = self._largest_lower_bound(position, lambda n: self._raw(n)[1])
        return (self.base_offset, 0) if slot < 0 else self.entry_at(slot)

    def truncate_to(self, offset: int) -> None:
        """Drop entries for batches ending at or after `offset`."""
        slot = self._largest_lower_bound(offset - self.base_offset - 1, lambda n: self._raw(n)[0])
        self._truncate_entries(slot + 1)

    def check(self, log_size: int) -> None:
        """Entries strictly increasing in both fields and inside the log; raise CorruptIndexError."""
        prev_rel, prev_pos = -1, -1
        for rel, pos in self.entry.iter_unpack(self._buf):
            if rel <= prev_rel or pos <= prev_pos or pos >= log_size:
                raise CorruptIndexError(
                    f"{self.path}: entry ({rel}, {pos}) out of order or beyond {log_size}"
                )
            prev_rel, prev_pos = rel, pos


class TimeIndex(_Index):
    """Maps the largest timestamp seen so far to the last offset of the batch that carried it."""

    __slots__ = ()

    entry = _TIME_ENTRY

    def _encode(self, a: int, b: int) -> tuple[int, int]:
        return a, b - self.base_offset

    def _empty_last(self) -> tuple[int, int]:
        return -1, self.base_offset

    def entry_at(self, n: int) -> tuple[int, int]:
        ts, rel = self._raw(n)
        return ts, self.base_offset + rel

    @property
    def is_full(self) -> bool:
        # Kafka keeps one slot free for the entry written when the segment becomes inactive.
        return len(self._buf) >= (self.max_entries - 1) * 12

    @property
    def last_entry(self) -> tuple[int, int]:
        return self._last

    def maybe_append(self, timestamp: int, offset: int) -> None:
        """Append when the timestamp grows (the same rule as Kafka: equal timestamps add nothing)."""
        last_ts, last_off = self._last
        if self._buf and offset < last_off:
            raise ValueError(f"time index offset {offset} below last {last_off} in {self.path}")
        if timestamp > last_ts:
            self._append_raw(_TIME_ENTRY.pack(timestamp, offset - self.base_offset))
            self._last = (timestamp, offset)

    def lookup(self, timestamp: int) -> tuple[int, int]:
        """(timestamp, offset) of the last entry with timestamp <= target, else (-1, base offset)."""
        slot = self._largest_lower_bound(timestamp, lambda n: self._raw(n)[0])
        return (-1, self.base_offset) if slot < 0 else self.entry_at(slot)

    def truncate_to(self, offset: int) -> None:
        """Drop entries pointing at offsets >= `offset`."""
        slot = self._largest_lower_bound(offset - self.base_offset - 1, lambda n: self._raw(n)[1])
        self._truncate_entries(slot + 1)

    def check(self, next_offset: int) -> None:
        prev_ts, prev_rel = -(1 << 63), -1
        limit = next_offset - self.base_offset
        for ts, rel in self.entry.iter_unpack(self._buf):
            if ts <= prev_ts or rel < prev_rel or rel < 0 or rel >= limit:
                raise CorruptIndexError(f"{self.path}: entry ({ts}, {rel}) out of order or beyond the log")
            prev_ts, prev_rel = ts, rel
