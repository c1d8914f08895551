"""Moving a partition's log to another log dir (AlterReplicaLogDirs), as Kafka's future replica.

The copy goes to `<target>/<topic>-<partition>.<id>-future` in two steps, so that appends go on
while the bulk of the data moves:

1. `copy_bulk` (a worker thread, no lock): every file of the partition directory as it is now.
2. `catch_up` (with the log's lock held, so nothing writes meanwhile): what changed since step 1 -
   the new tail of a segment file (segments only grow), files replaced or rewritten in place
   (a cleaned segment, the active segment's indexes, checkpoints) copied again, files gone
   removed - then everything fsynced and the directory renamed to `<target>/<topic>-<partition>`.

The caller then opens the log at its new place (recovering from the old recovery point, which
rebuilds the indexes of whatever the copy caught mid-write), swaps it in, and deletes the old
directory. As in Kafka the new directory gets its final name before the old one is renamed away:
a crash between the two leaves the partition in both dirs and the next start refuses to guess.
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass, field

from broker.log.checkpoint import fsync_dir

FUTURE_DIR_SUFFIX = "-future"
_SKIPPED_SUFFIXES = (".deleted", ".cleaned", ".swap", ".tmp")


@dataclass
class FileState:
    inode: int
    size: int
    mtime_ns: int


@dataclass
class Copy:
    """A future replica being built: where, and what of each source file it holds."""

    source_dir: str
    future_dir: str
    final_dir: str
    files: dict[str, FileState] = field(default_factory=dict)
    bytes_copied: int = 0


def future_dir_name(topic: str, partition: int) -> str:
    return "%s-%d.%s%s" % (topic, partition, uuid.uuid4().hex, FUTURE_DIR_SUFFIX)


def _state(path: str) -> FileState:
    st = os.stat(path)
    return FileState(st.st_ino, st.st_size, st.st_mtime_ns)


def _source_files(directory: str) -> list[str]:
    return sorted(
        name for name in os.listdir(directory)
        if not name.endswith(_SKIPPED_SUFFIXES) and os.path.isfile(os.path.join(directory, name))
    )


def _copy_range(src: str, dst: str, start: int, end: int, truncate: bool) -> int:
    """Copy bytes [start, end) of src into dst at the same position; returns the bytes copied."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if truncate else 0)
    out = os.open(dst, flags, 0o644)
    try:
        with open(src, "rb") as f:
            f.seek(start)
            os.lseek(out, start, os.SEEK_SET)
            remaining = end - start
            while remaining > 0:
                chunk = f.read(min(remaining, 1 << 20))
                if not chunk:
                    break
                os.write(out, chunk)
                remaining -= len(chunk)
        os.ftruncate(out, end)
        os.fsync(out)
    finally:
        os.close(out)
    return end - start


def start_copy(source_dir: str, target_parent: str, topic: str, partition: int) -> Copy:
    future = os.path.join(target_parent, future_dir_name(topic, partition))
    os.makedirs(future)
    return Copy(source_dir, future, os.path.join(target_parent, "%s-%d" % (topic, partition)))


def copy_bulk(copy: Copy) -> None:
    """Step 1: copy every file as it is now (files vanishing meanwhile are skipped)."""
    for name in _source_files(copy.source_dir):
        src = os.path.join(copy.source_dir, name)
        try:
            state = _state(src)
            copy.bytes_copied += _copy_range(src, os.path.join(copy.future_dir, name), 0, state.size, True)
        except FileNotFoundError:
            continue  # retention or the cleaner removed it: catch_up settles it
        copy.files[name] = state
    fsync_dir(copy.future_dir)


def catch_up(copy: Copy) -> None:
    """Step 2 (the source must not change meanwhile): bring the copy level with the source, make
    it durable and give it its final name."""
    present = set(_source_files(copy.source_dir))
    for name in sorted(present):
        src, dst = os.path.join(copy.source_dir, name), os.path.join(copy.future_dir, name)
        now = _state(src)
        before = copy.files.get(name)
        if before == now:
            continue
        grown = (before is not None and before.inode == now.inode and name.endswith(".log")
                 and now.size >= before.size)
        start = before.size if grown and before is not None else 0
        copy.bytes_copied += _copy_range(src, dst, start, now.size, not grown)
        copy.files[name] = now
    for name in set(copy.files) - present:
        os.unlink(os.path.join(copy.future_dir, name))
        del copy.files[name]
    fsync_dir(copy.future_dir)
    os.rename(copy.future_dir, copy.final_dir)
    fsync_dir(os.path.dirname(copy.final_dir))


def abandon(copy: Copy) -> None:
    """A move that failed or was replaced: its future directory goes."""
    shutil.rmtree(copy.future_dir, ignore_errors=True)
