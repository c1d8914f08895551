"""Errors of cluster mode that the command line reports (imported without the rest of the package)."""


class ClusterStartError(Exception):
    """The node cannot join the cluster: etcd unreachable, another cluster's data, its id in use."""
