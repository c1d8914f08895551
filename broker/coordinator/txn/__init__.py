"""The transaction coordinator: transactional ids and their transactions, in `__transaction_state`.

state.py        TransactionState, its transitions as data, TransactionMetadata and its transitions
records.py      __transaction_state record formats (TransactionLogKey / TransactionLogValue)
config.py       settings under Kafka's property names
shard.py        TransactionCoordinatorShard: InitProducerId, AddPartitions, EndTxn, timeouts, replay
coordinator.py  TransactionCoordinator service over the runtime; markers of decided transactions
"""

from broker.coordinator.txn.config import TransactionCoordinatorConfig
from broker.coordinator.txn.coordinator import (
    MarkerWrite,
    MarkerWriter,
    NoMarkers,
    TransactionCoordinator,
    create_transaction_coordinator,
)
from broker.coordinator.txn.shard import ProducerIdAndEpoch, TransactionCoordinatorShard, TxnCompletion
from broker.coordinator.txn.state import TransactionMetadata, TransactionState
from broker.metadata.image import TRANSACTION_STATE_TOPIC

__all__ = [
    "TRANSACTION_STATE_TOPIC",
    "MarkerWrite",
    "MarkerWriter",
    "NoMarkers",
    "ProducerIdAndEpoch",
    "TransactionCoordinator",
    "TransactionCoordinatorConfig",
    "TransactionCoordinatorShard",
    "TransactionMetadata",
    "TransactionState",
    "TxnCompletion",
    "create_transaction_coordinator",
]
