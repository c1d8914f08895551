"""The transaction coordinator's settings, under Kafka's property names and with Kafka's defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from broker.coordinator.txn.state import TV_2


@dataclass(frozen=True)
class TransactionCoordinatorConfig:
    num_partitions: int = 50  # transaction.state.log.num.partitions
    max_timeout_ms: int = 900000  # transaction.max.timeout.ms
    transactional_id_expiration_ms: int = 604800000  # transactional.id.expiration.ms
    abort_timed_out_interval_ms: int = 10000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    remove_expired_interval_ms: int = 3600000  # transaction.remove.expired.transaction.cleanup.interval.ms
    # The transaction.version the coordinator works with when it is not told the finalized one
    # (tests of the coordinator alone); the broker gives the shards the cluster's finalized level.
    transaction_version: int = TV_2

    @classmethod
    def from_values(cls, values: Mapping[str, Any]) -> TransactionCoordinatorConfig:
        def get(key: str, default: int) -> int:
            value = values.get(key)
            return default if value is None else int(value)

        d = cls()
        return cls(
            num_partitions=get("transaction.state.log.num.partitions", d.num_partitions),
            max_timeout_ms=get("transaction.max.timeout.ms", d.max_timeout_ms),
            transactional_id_expiration_ms=get("transactional.id.expiration.ms", d.transactional_id_expiration_ms),
            abort_timed_out_interval_ms=get("transaction.abort.timed.out.transaction.cleanup.interval.ms",
                                            d.abort_timed_out_interval_ms),
            remove_expired_interval_ms=get("transaction.remove.expired.transaction.cleanup.interval.ms",
                                           d.remove_expired_interval_ms),
            transaction_version=get("transaction.version", d.transaction_version),
        )


CONFIG_KEYS = (
    "transaction.state.log.num.partitions", "transaction.max.timeout.ms", "transactional.id.expiration.ms",
    "transaction.abort.timed.out.transaction.cleanup.interval.ms",
    "transaction.remove.expired.transaction.cleanup.interval.ms",
)
