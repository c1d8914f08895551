"""The aborted-transaction index of a segment: `<base offset>.txnindex`, Kafka's layout.

Entries of 34 bytes, back to back: int16 version (0), int64 producer id, int64 first offset,
int64 last offset (the ABORT marker's offset), int64 last stable offset at the time of the abort.
A segment's index holds the aborted transactions whose marker is in that segment; a transaction
may start in an earlier one. A read_committed fetch collects the entries overlapping its range
from the segment holding the fetch offset onwards, and stops at the first entry whose last stable
offset reaches the end of the range (nothing later can overlap it).

The file exists only once a transaction was aborted in the segment. Aborts are rare, so the
entries are read once and kept in memory, and the file is opened only to append (and fsync) an
entry: no handle is held between uses.
"""

from __future__ import annotations

import os
import struct
import threading
from typing import NamedTuple

from broker.log.checkpoint import fsync_dir, read_whole

ENTRY = struct.Struct(">hqqqq")
ENTRY_SIZE = ENTRY.size  # 34
VERSION = 0


class AbortedTxn(NamedTuple):
    producer_id: int
    first_offset: int
    last_offset: int
    last_stable_offset: int


class CorruptTxnIndexError(Exception):
    pass


class TransactionIndex:
    __slots__ = ("path", "start_offset", "_entries", "_lock", "_absent")

    def __init__(self, path: str, start_offset: int, exists: bool | None = None) -> None:
        """`exists`: whether the file exists, when the caller knows (the loader lists the directory)."""
        self.path = path
        self.start_offset = start_offset
        self._entries: list[AbortedTxn] | None = None  # loaded on first use
        self._lock = threading.Lock()  # the cleaner thread and the event loop may both read
        self._absent = exists is False  # known to have no file (until an entry is written)

    def __repr__(self) -> str:
        return "TransactionIndex(%s)" % os.path.basename(self.path)

    @property
    def entries(self) -> list[AbortedTxn]:
        entries = self._entries
        if entries is None:
            with self._lock:
                if self._entries is None:
                    self._entries = [] if self._absent else _read(self.path)
                entries = self._entries
        return entries

    def is_empty(self) -> bool:
        return not self.entries

    def append(self, txn: AbortedTxn) -> None:
        entries = self.entries
        if entries and entries[-1].last_offset >= txn.last_offset:
            raise ValueError("aborted transaction at %d does not follow the last one at %d of %s"
                             % (txn.last_offset, entries[-1].last_offset, self.path))
        created = not os.path.exists(self.path)
        self._absent = False
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, ENTRY.pack(VERSION, *txn))
        finally:
            os.close(fd)
        if created:
            fsync_dir(os.path.dirname(self.path) or ".")
        entries.append(txn)

    def collect(self, fetch_offset: int, upper_bound: int) -> tuple[list[AbortedTxn], bool]:
        """The aborted transactions overlapping [fetch_offset, upper_bound), and whether the search
        is complete (no later segment can hold more)."""
        found = []
        for txn in self.entries:
            if txn.last_offset >= fetch_offset and txn.first_offset < upper_bound:
                found.append(txn)
            if txn.last_stable_offset >= upper_bound:
                return found, True
        return found, False

    def truncate_to(self, offset: int) -> None:
        """Drop the entries whose marker is at or after `offset`."""
        entries = self.entries
        keep = [t for t in entries if t.last_offset < offset]
        if len(keep) == len(entries):
            return
        self._rewrite(keep)

    def reset(self) -> None:
        """Forget every entry (the segment is being recovered and its entries rebuilt)."""
        if self._absent:
            return  # no file, so no entries either (writing one clears the flag)
        if self.entries or os.path.exists(self.path):
            self._rewrite([])

    def replace(self, entries: list[AbortedTxn]) -> None:
        """Write exactly `entries` (the cleaner builds a cleaned segment's index)."""
        self._rewrite(list(entries))

    def _rewrite(self, entries: list[AbortedTxn]) -> None:
        self._absent = False  # whatever happens below, ask the file system next time
        if entries:
            data = b"".join(ENTRY.pack(VERSION, *t) for t in entries)
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        else:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
        self._entries = entries

    def flush(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, new_path: str) -> None:
        try:
            os.replace(self.path, new_path)
        except FileNotFoundError:
            pass
        self.path = new_path

    def delete(self) -> None:
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def sanity_check(self) -> None:
        for txn in self.entries:
            if txn.last_offset < self.start_offset:
                raise CorruptTxnIndexError("aborted transaction %r in %s ends before the segment start %d"
                                           % (txn, self.path, self.start_offset))


def _read(path: str) -> list[AbortedTxn]:
    try:
        data = read_whole(path)
    except FileNotFoundError:
        return []
    if len(data) % ENTRY_SIZE:
        # a torn last entry (the broker died while appending it): drop it, as the abort it
        # records is found again when the segment is recovered
        os.truncate(path, len(data) - len(data) % ENTRY_SIZE)
    entries = []
    for pos in range(0, len(data) - ENTRY_SIZE + 1, ENTRY_SIZE):
        version, *fields = ENTRY.unpack_from(data, pos)
        if version > VERSION:
            raise CorruptTxnIndexError("unknown aborted transaction version %d in %s" % (version, path))
        entries.append(AbortedTxn(*fields))
    return entries
