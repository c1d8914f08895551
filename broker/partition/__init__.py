"""Partitions as the broker serves them: the log of each (broker/log), its high watermark and last
stable offset, its producer state and snapshots, the fetches waiting on it, and moves between
log directories.

`partition` holds `Partition` (one partition's single-writer append path and fetch waiters) and
`PartitionManager` (in `manager`); `producer_state` and `producer_snapshot` keep each producer's sequence and
transaction state and its `.snapshot` files; `log_dirs` moves partitions between `log.dirs`.
"""

from broker.partition.manager import PartitionManager
from broker.partition.partition import (
    READ_COMMITTED,
    READ_UNCOMMITTED,
    Partition,
    ProduceResult,
    VerificationState,
)

__all__ = ["READ_COMMITTED", "READ_UNCOMMITTED", "Partition", "PartitionManager", "ProduceResult", "VerificationState"]
