"""Where a cluster's state lives in etcd (the layout is described in broker/cluster/metadata_log.py),
and the controller's term as the metadata log's writer proves it."""

from __future__ import annotations

from dataclasses import dataclass

from broker.cluster.etcd import Compare

DEFAULT_ROOT = "/kafka"
OFFSET_DIGITS = 20  # offsets in keys are zero-padded so that etcd's byte order is offset order


class NotController(Exception):
    """This node's controller term ended (another epoch, or its lease expired): it must not write."""

    def __init__(self, message: str, epoch: int = -1, holder: int = -1) -> None:
        super().__init__(message)
        self.epoch = epoch  # the current controller epoch, when known
        self.holder = holder  # the current controller's node id, -1 when none or unknown


@dataclass(frozen=True)
class Leadership:
    """A controller term: won by `node_id` with `epoch` in the etcd transaction at `revision`
    (the create revision of the controller key and the mod revision of the epoch counter)."""

    node_id: int
    epoch: int
    revision: int
    lease: int


class ClusterKeys:
    """The keys of one cluster: everything under `<root>/<cluster id>/`."""

    def __init__(self, cluster_id: str, root: str = DEFAULT_ROOT) -> None:
        if not cluster_id or "/" in cluster_id:
            raise ValueError("invalid cluster id %r" % cluster_id)
        self.cluster_id = cluster_id
        self.prefix = ("%s/%s/" % (root.rstrip("/"), cluster_id)).encode()
        self.controller = self.prefix + b"controller"
        self.controller_epoch = self.prefix + b"controller-epoch"
        self.log = self.prefix + b"log/"
        self.log_end = self.prefix + b"log-end"
        self.snapshot = self.prefix + b"snapshot"
        self.snapshot_chunks = self.prefix + b"snapshot/"
        self.nodes = self.prefix + b"nodes/"

    def log_key(self, base_offset: int) -> bytes:
        return self.log + b"%0*d" % (OFFSET_DIGITS, base_offset)

    def chunk_prefix(self, end_offset: int) -> bytes:
        return self.snapshot_chunks + b"%0*d/" % (OFFSET_DIGITS, end_offset)

    def chunk_key(self, end_offset: int, index: int) -> bytes:
        return self.chunk_prefix(end_offset) + b"%06d" % index

    def node_key(self, node_id: int) -> bytes:
        return self.nodes + b"%d" % node_id

    def fence(self, leadership: Leadership) -> list[Compare]:
        """The compares every controller write carries: its epoch is still the current one and its
        controller key (held by its lease) still exists, so a deposed controller writes nothing."""
        return [Compare.mod_revision_is(self.controller_epoch, leadership.revision),
                Compare.create_revision_is(self.controller, leadership.revision)]


def root_cluster_id_key(root: str = DEFAULT_ROOT) -> bytes:
    """The cluster id the first node created, for nodes not told which one to join."""
    return ("%s/cluster-id" % root.rstrip("/")).encode()
