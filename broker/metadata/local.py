"""A node's own metadata files: meta.properties in each log directory (KRaft's v1 format: the
cluster id, the directory id, the node id) and, for a single node, the metadata log on the storage
engine (`__cluster_metadata-0`)."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

from broker.config import read_properties
from broker.log import AppendOrigin, Log
from broker.log.reader import iter_records
from protocol.records import build_batch


def new_base64_uuid() -> str:
    """Kafka's textual ids (cluster id, directory id): a random UUID in URL-safe base64, unpadded."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


def ensure_meta_properties(log_dir: Path, node_id: int, cluster_id: str | None) -> str:
    """Read or write meta.properties (KRaft's v1 format); returns the cluster id."""
    log_dir.mkdir(parents=True, exist_ok=True)
    path = log_dir / "meta.properties"
    if path.exists():
        props = read_properties(path)
        existing = props.get("cluster.id")
        if existing:
            if cluster_id and cluster_id != existing:
                raise SystemExit("cluster.id %s does not match %s in %s" % (cluster_id, existing, path))
            return existing
    cluster_id = cluster_id or new_base64_uuid()
    text = "#\n#%s\ncluster.id=%s\ndirectory.id=%s\nnode.id=%d\nversion=1\n" % (
        time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime()), cluster_id, new_base64_uuid(), node_id,
    )
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)
    return cluster_id


def read_directory_id(log_dir: Path) -> uuid.UUID:
    """The directory.id of a log dir's meta.properties (zero if it has none)."""
    text = read_properties(log_dir / "meta.properties").get("directory.id", "")
    try:
        return uuid.UUID(bytes=base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)))
    except ValueError:
        return uuid.UUID(int=0)


class LogMetadataLog:
    """The metadata log on the storage engine: `__cluster_metadata-0`, fsynced on every change."""

    def __init__(self, log: Log) -> None:
        self.log = log

    def append(self, values: list[bytes]) -> None:
        batch = build_batch([(None, v) for v in values], base_timestamp=None)
        self.log.append(batch, origin=AppendOrigin.COORDINATOR)
        self.log.flush()

    def read_all(self) -> Iterator[bytes]:
        for record in iter_records(self.log):
            if record.value is not None:
                yield record.value
