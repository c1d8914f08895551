"""Drive a TransactionCoordinatorShard without the runtime (tests.coordinator.harness.ShardDriver):
operations run synchronously, records go to an in-memory log, timers fire on a manual clock; the
completions the shard hands over (markers to write) are collected and completed by the test."""

from __future__ import annotations

import itertools
from typing import Any

from broker.coordinator.result import Deferred, Record
from broker.coordinator.txn.config import TransactionCoordinatorConfig
from broker.coordinator.txn.shard import ProducerIdAndEpoch, TransactionCoordinatorShard, TxnCompletion
from broker.coordinator.txn.state import TransactionMetadata
from tests.coordinator.harness import START_MS, ShardDriver


class TxnHarness(ShardDriver):
    shard: TransactionCoordinatorShard

    def __init__(self, config: TransactionCoordinatorConfig | None = None, start_ms: int = START_MS,
                 log: list[Record] | None = None, first_producer_id: int = 1000) -> None:
        super().__init__(start_ms)
        self.config = config or TransactionCoordinatorConfig(num_partitions=1)
        self.pids = itertools.count(first_producer_id)
        self.completions: list[TxnCompletion] = []
        self.shard = TransactionCoordinatorShard(self.timer, self.config, lambda: next(self.pids),
                                                 on_prepared=self.completions.append)
        if log is not None:
            for key, value in log:
                self.shard.replay(key, value)
            self.log = list(log)
        self.shard.on_loaded(self.now)

    def reload(self) -> TxnHarness:
        """A fresh shard loaded from this one's log, at the same time."""
        return TxnHarness(self.config, self.now, self.log, first_producer_id=next(self.pids))

    def meta(self, transactional_id: str) -> TransactionMetadata:
        return self.shard.txns[transactional_id]

    # ----- requests -----------------------------------------------------------------------
    def init(self, tid: str, timeout_ms: int = 60000, expected: tuple[int, int] | None = None) -> Any:
        return self.call(lambda s, now: s.init_producer_id(tid, timeout_ms, expected, now))

    def add(self, tid: str, pid: int, epoch: int, *partitions: tuple[str, int], tv: int = 0) -> Any:
        return self.call(lambda s, now: s.add_partitions(tid, pid, epoch, partitions, tv, now))

    def end(self, tid: str, pid: int, epoch: int, committed: bool, tv: int = 0) -> Any:
        return self.call(lambda s, now: s.end_txn(tid, pid, epoch, committed, tv, now))

    def complete(self, completion: TxnCompletion | None = None) -> Any:
        """The markers of `completion` (default: the oldest pending) are written: complete it."""
        c = completion if completion is not None else self.completions.pop(0)
        if completion is not None:
            self.completions.remove(c)
        meta = self.call(lambda s, now: s.complete_txn(c, now))
        c.finish(meta)
        return meta

    def begin(self, tid: str, *partitions: tuple[str, int]) -> ProducerIdAndEpoch:
        """A producer initialised and a transaction open on `partitions`."""
        r = self.init(tid)
        assert r.error == 0, r
        assert self.add(tid, r.producer_id, r.producer_epoch, *partitions) == 0
        return r


def result_of(response: Any) -> Any:
    """The value of a response that may be a (completed) Deferred."""
    if isinstance(response, Deferred):
        assert response.done(), "the response is still pending"
        return response.result()
    return response
