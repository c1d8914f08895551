"""Kafka's checkpoint files and the clean-shutdown marker, written atomically.

Formats (Kafka's CheckpointFile, version 0), text lines:
    0                    <- version
    2                    <- number of entries
    topic partition offset   (recovery-point-offset-checkpoint, log-start-offset-checkpoint,
    ...                       cleaner-offset-checkpoint; one file per log dir)
    epoch startOffset        (leader-epoch-checkpoint; one file per partition dir)

Writes go to `<file>.tmp`, are fsynced, renamed over the file and the directory is fsynced, so a
crash leaves either the old or the new content, never a torn file.
"""

from __future__ import annotations

import base64
import json
import os
import uuid
from collections.abc import Iterable, Mapping

RECOVERY_POINT_CHECKPOINT = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_CHECKPOINT = "log-start-offset-checkpoint"
CLEANER_OFFSET_CHECKPOINT = "cleaner-offset-checkpoint"
LEADER_EPOCH_CHECKPOINT = "leader-epoch-checkpoint"
HIGH_WATERMARK_CHECKPOINT = "replication-offset-checkpoint"
CLEAN_SHUTDOWN_FILE = ".kafka_cleanshutdown"
PARTITION_METADATA_FILE = "partition.metadata"

CHECKPOINT_VERSION = 0


class CheckpointError(Exception):
    """A checkpoint file that cannot be parsed (the caller decides how to fall back)."""


def fsync_dir(path: str) -> None:
    """Make a rename/creation/unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


_READ_CHUNK = 64 * 1024


def read_whole(path: str) -> bytes:
    """A small file's bytes in three syscalls (open, read, close: a short read of a regular file
    is its end), where `open(path, "rb").read()` makes seven. A start-up reads a few such files
    per partition. FileNotFoundError (an OSError) as open's."""
    fd = os.open(path, os.O_RDONLY)
    try:
        data = os.read(fd, _READ_CHUNK)
        if len(data) < _READ_CHUNK:
            return data
        parts = [data]
        while data:
            data = os.read(fd, _READ_CHUNK)
            parts.append(data)
        return b"".join(parts)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync of the directory."""
    tmp = path + ".tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(os.path.dirname(os.path.abspath(path)))


def _render(lines: list[str]) -> bytes:
    body = [str(CHECKPOINT_VERSION), str(len(lines)), *lines]
    return ("\n".join(body) + "\n").encode()


def _parse(path: str, fields: int) -> list[list[str]]:
    try:
        lines = read_whole(path).decode().splitlines()
    except FileNotFoundError:
        return []
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"cannot read {path}: {e}") from e
    if not lines:
        return []
    try:
        version = int(lines[0])
    except ValueError:
        raise CheckpointError(f"malformed version line in {path}: {lines[0]!r}") from None
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(f"unrecognised version {version} in {path}")
    if len(lines) < 2:
        return []
    try:
        expected = int(lines[1])
    except ValueError:
        raise CheckpointError(f"malformed count line in {path}: {lines[1]!r}") from None
    entries = []
    for line in lines[2:]:
        parts = line.split()
        if len(parts) != fields:
            raise CheckpointError(f"malformed line in {path}: {line!r}")
        entries.append(parts)
    if len(entries) != expected:
        raise CheckpointError(f"expected {expected} entries in {path}, found {len(entries)}")
    return entries


def write_offsets(path: str, offsets: Mapping[tuple[str, int], int]) -> None:
    """An offset checkpoint: one `topic partition offset` line per partition."""
    lines = [f"{topic} {partition} {offset}" for (topic, partition), offset in sorted(offsets.items())]
    write_atomic(path, _render(lines))


def read_offsets(path: str) -> dict[tuple[str, int], int]:
    out: dict[tuple[str, int], int] = {}
    for topic, partition, offset in _parse(path, 3):
        try:
            out[(topic, int(partition))] = int(offset)
        except ValueError:
            raise CheckpointError(f"malformed entry in {path}: {topic} {partition} {offset}") from None
    return out


def write_leader_epochs(path: str, entries: Iterable[tuple[int, int]]) -> None:
    """leader-epoch-checkpoint: one `epoch startOffset` line per entry."""
    write_atomic(path, _render([f"{epoch} {start}" for epoch, start in entries]))


def read_leader_epochs(path: str) -> list[tuple[int, int]]:
    out = []
    for epoch, start in _parse(path, 2):
        try:
            out.append((int(epoch), int(start)))
        except ValueError:
            raise CheckpointError(f"malformed entry in {path}: {epoch} {start}") from None
    return out


def write_clean_shutdown(log_dir: str, broker_epoch: int = -1) -> None:
    """The marker Kafka writes on clean shutdown (JSON with version and broker epoch)."""
    data = json.dumps({"version": 0, "brokerEpoch": broker_epoch}, separators=(",", ":")).encode()
    write_atomic(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE), data)


def has_clean_shutdown(log_dir: str) -> bool:
    return os.path.exists(os.path.join(log_dir, CLEAN_SHUTDOWN_FILE))


def remove_clean_shutdown(log_dir: str) -> None:
    """Called once the logs are loaded: from now on a crash must trigger recovery."""
    path = os.path.join(log_dir, CLEAN_SHUTDOWN_FILE)
    try:
        os.unlink(path)
    except FileNotFoundError:
        return
    fsync_dir(log_dir)


def _kafka_uuid_string(topic_id: uuid.UUID) -> str:
    """Kafka's Uuid.toString: URL-safe base64 of the 16 bytes, no padding."""
    return base64.urlsafe_b64encode(topic_id.bytes).decode().rstrip("=")


def write_partition_metadata(directory: str, topic_id: uuid.UUID) -> None:
    """`partition.metadata` (Kafka's PartitionMetadataFile): the topic id of a partition directory."""
    text = f"version: 0\ntopic_id: {_kafka_uuid_string(topic_id)}"
    write_atomic(os.path.join(directory, PARTITION_METADATA_FILE), text.encode())


def read_partition_metadata(directory: str) -> uuid.UUID | None:
    """The topic id recorded in a partition directory, None when absent or unreadable."""
    try:
        with open(os.path.join(directory, PARTITION_METADATA_FILE), encoding="utf-8") as f:
            lines = f.read().splitlines()
        fields = dict(line.split(": ", 1) for line in lines if ": " in line)
        raw = fields["topic_id"].strip()
        return uuid.UUID(bytes=base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
    except (OSError, KeyError, ValueError, UnicodeDecodeError):
        return None
