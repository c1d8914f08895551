"""Open files of the storage engine: opened on demand, kept in one bounded LRU pool, closed when idle.

A broker with tens of thousands of partitions cannot keep every segment's log, index and time
index open (three descriptors per partition would exceed the usual limits), and it never needs
to: only the partitions written or read right now need theirs. So every file the engine keeps
open across calls is a `PooledFile`: a path and open flags, plus an open `FileHandle` while it is
in use. The pool (`OPEN_FILES`, one per process: the descriptor limit is per process) keeps at
most `capacity` handles, dropping the least recently used one when a new file opens, and
`close_idle()` (run periodically by the broker) drops those not used since its previous run.

Dropping a handle never closes a descriptor under a reader: a `FileHandle` closes its
descriptor when the last reference to it goes, so a FileSlice handed to the network, a scan in
the cleaner thread or an fsync in a flush thread keeps the file open for as long as it holds
the handle. Code using a descriptor therefore keeps the handle in a local variable for the
duration of the call (`h = pooled.handle(); os.pwrite(h.fd, ...)`), never `pooled.handle().fd`
alone. A dropped file is reopened by path at its next use, so a file renamed while open must be
told its new path (`rename`). Data written through a handle that was since dropped is in the
page cache: an fsync through any later handle of the same file makes it durable.

Adding a file type (transaction index, producer-state snapshot, ...): hold a `PooledFile`, call
`handle()` at each use, `close()` when the file leaves the log (deletion) or after a bulk
rebuild at start-up (recovery must not leave thousands of files open), `rename()` on a suffix
change. Files read once (checkpoints, snapshots at load) need no pool: open, read, close.

When the process runs out of descriptors anyway (EMFILE), the pool drops the oldest half of its
handles and retries once; if that fails too, the open raises KafkaError(KAFKA_STORAGE_ERROR)
with a message naming the limit (and logs it), and the broker goes on serving what is open.
"""

from __future__ import annotations

import errno
import logging
import os
import resource
import threading
from collections import OrderedDict

from protocol.errors import ErrorCode, KafkaError

log = logging.getLogger("broker.log.handles")

# Without a limit from the configuration: a quarter of the soft descriptor limit (the rest is for
# connections, sockets of clients, and files opened briefly), at least MIN_CAPACITY.
MIN_CAPACITY = 16


def descriptor_limit() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY else 1 << 20


def default_capacity() -> int:
    return max(MIN_CAPACITY, descriptor_limit() // 4)


class FileHandle:
    """An open descriptor, closed when the last reference to it goes."""

    __slots__ = ("fd",)

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def fileno(self) -> int:
        return self.fd

    def __del__(self) -> None:
        try:
            os.close(self.fd)
        except OSError:
            pass


class _Idle:
    """The pool's idle marker: files still before it at the next sweep were not used in between."""

    __slots__ = ()

    def release(self) -> None:
        pass


class FilePool:
    """A bounded LRU of the PooledFiles that hold an open handle."""

    def __init__(self, capacity: int | None = None) -> None:
        self.capacity = capacity if capacity is not None else default_capacity()
        # Insertion order is use order: PooledFile.handle() moves a file to the end. Moves are
        # single C calls (atomic under the GIL); opening and dropping take the lock.
        self._lru: OrderedDict[PooledFile | _Idle, None] = OrderedDict()
        self._lock = threading.Lock()
        self._marker: _Idle | None = None
        self.opened = 0  # files opened, ever (reopens of dropped files included)
        self.dropped = 0  # handles dropped by the LRU bound or as idle

    def __len__(self) -> int:
        return len(self._lru) - (self._marker is not None)

    def configure(self, capacity: int) -> None:
        """Set the bound (<= 0: the default from the descriptor limit); drops handles above it."""
        self.capacity = capacity if capacity > 0 else default_capacity()
        with self._lock:
            self._shrink_to(self.capacity)

    def _shrink_to(self, size: int) -> None:
        lru = self._lru
        while len(lru) - (self._marker is not None) > size:
            victim, _ = lru.popitem(last=False)
            if victim is self._marker:
                lru[victim] = None  # keep the marker; it moves to the end (nothing is before it now)
                continue
            victim.release()
            self.dropped += 1

    def _open(self, pooled: PooledFile, flags: int | None = None) -> FileHandle:
        if flags is None:
            flags = pooled.flags
        try:
            fd = os.open(pooled.path, flags, 0o644)
        except OSError as exc:
            if exc.errno not in (errno.EMFILE, errno.ENFILE):
                raise
            with self._lock:
                self._shrink_to(len(self) // 2)
            try:
                fd = os.open(pooled.path, flags, 0o644)
            except OSError as again:
                if again.errno not in (errno.EMFILE, errno.ENFILE):
                    raise
                message = (
                    "too many open files: the descriptor limit is %d (ulimit -n) and %d log files are held "
                    "open (log.open.files.max=%d); cannot open %s"
                    % (descriptor_limit(), len(self), self.capacity, pooled.path)
                )
                log.error(message)
                raise KafkaError(ErrorCode.KAFKA_STORAGE_ERROR, message) from None
        handle = FileHandle(fd)
        with self._lock:
            pooled._handle = handle
            self._lru[pooled] = None
            self.opened += 1
            self._shrink_to(self.capacity)
        return handle

    def _forget(self, pooled: PooledFile) -> None:
        with self._lock:
            self._lru.pop(pooled, None)
            pooled._handle = None

    def close_idle(self) -> int:
        """Drop the handles not used since the previous call; returns how many."""
        dropped = 0
        with self._lock:
            lru = self._lru
            marker = self._marker
            if marker is not None:
                while lru:
                    victim, _ = lru.popitem(last=False)
                    if victim is marker:
                        break
                    victim.release()
                    dropped += 1
            self._marker = _Idle()
            lru[self._marker] = None
            self.dropped += dropped
        return dropped

    def close_all(self) -> None:
        with self._lock:
            for pooled in list(self._lru):
                pooled.release()
            self._lru.clear()
            self._marker = None


class PooledFile:
    """A file the engine uses again and again: opened on demand through `pool`, dropped by it."""

    __slots__ = ("path", "flags", "pool", "_handle", "__weakref__")

    def __init__(self, path: str, flags: int, pool: FilePool | None = None) -> None:
        self.path = path
        self.flags = flags & ~(os.O_EXCL | os.O_TRUNC)  # a reopen must find the file as it is
        self.pool = pool if pool is not None else OPEN_FILES
        self._handle: FileHandle | None = None

    @classmethod
    def create(cls, path: str, flags: int = os.O_RDWR, pool: FilePool | None = None) -> tuple[PooledFile, FileHandle]:
        """Create the file (it must not exist) and keep it open: a new segment is written at once."""
        pooled = cls(path, flags & ~os.O_CREAT, pool)
        return pooled, pooled.pool._open(pooled, flags | os.O_CREAT | os.O_EXCL)

    def __repr__(self) -> str:
        return "PooledFile(%r, open=%s)" % (self.path, self._handle is not None)

    @property
    def is_open(self) -> bool:
        return self._handle is not None

    def handle(self) -> FileHandle:
        """The open handle (opening the file if it was dropped); keep it while using its fd."""
        handle = self._handle
        if handle is None:
            return self.pool._open(self)
        try:
            self.pool._lru.move_to_end(self)
        except KeyError:
            pass  # dropped by another thread this very moment: this handle stays valid while held
        return handle

    def transient(self) -> FileHandle:
        """The open handle, else one outside the pool, closed when the caller lets go of it: for
        a single use (recovery scans every segment once) that must not churn the pool."""
        handle = self._handle
        if handle is not None:
            return handle
        return FileHandle(os.open(self.path, self.flags))

    def release(self) -> None:
        """Drop the handle (called by the pool, under its lock)."""
        self._handle = None

    def close(self) -> None:
        """Leave the pool now (the descriptor closes once no reader holds the handle)."""
        if self._handle is not None:
            self.pool._forget(self)

    def fsync(self) -> None:
        """Make the file's writes durable: through the open handle, else through a short-lived
        descriptor of the path (the writes of a dropped handle are in the page cache).
        FileNotFoundError when the file is gone."""
        handle = self._handle
        if handle is not None:
            os.fsync(handle.fd)
            return
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rename(self, path: str) -> None:
        """The file was renamed: reopen it under this path from now on (an open handle stays valid)."""
        self.path = path


OPEN_FILES = FilePool()
