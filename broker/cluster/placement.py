"""Where the replicas of new partitions go: Kafka's striped placement over the registered brokers.

Goals, in Kafka's order (its StripedReplicaPlacer): spread each partition's replicas over racks
(`broker.rack`; brokers without one form one rack), spread them over brokers, prefer unfenced
brokers. Constraints: at most one replica per broker, and the first replica (the preferred
leader) on an unfenced broker.

How: racks in name order (no rack first) and, in each, its unfenced and fenced brokers in id
order, each list starting at a random offset. Partition after partition, replicas are taken
from the racks round robin starting one rack further each time (the "stripes"), and within a
rack round robin; a rack's fenced brokers only once its unfenced ones are used up in this
round. After as many partitions as there are unfenced brokers, racks and brokers are shuffled
so that the same replica sets do not repeat. The random generator is injected: the same seed
places the same way.
"""

from __future__ import annotations

import random as _random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from protocol.errors import ErrorCode, KafkaError


@dataclass(frozen=True)
class UsableBroker:
    node_id: int
    rack: str | None
    fenced: bool


class _Brokers:
    """One rack's fenced or unfenced brokers, taken round robin once per round (`epoch`)."""

    def __init__(self) -> None:
        self.ids: list[int] = []
        self.index = 0
        self.offset = 0
        self.epoch = 0

    def start(self, rnd: _random.Random) -> None:
        if self.ids:
            self.ids.sort()
            self.offset = rnd.randrange(len(self.ids))

    def next(self, epoch: int) -> int:
        if not self.ids:
            return -1
        if self.epoch != epoch:  # a new round: from the next broker on
            self.epoch = epoch
            self.index = 0
            self.offset = (self.offset + 1) % len(self.ids)
        if self.index >= len(self.ids):
            return -1
        broker = self.ids[(self.index + self.offset) % len(self.ids)]
        self.index += 1
        return broker


class _Rack:
    def __init__(self) -> None:
        self.unfenced = _Brokers()
        self.fenced = _Brokers()

    def next(self, epoch: int) -> int:
        found = self.unfenced.next(epoch)
        return found if found >= 0 else self.fenced.next(epoch)


def invalid_replication_factor(message: str) -> KafkaError:
    return KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, message)


class StripedPlacer:
    """Places the partitions of one request (a topic, or the new partitions of one)."""

    def __init__(self, brokers: Iterable[UsableBroker], rnd: _random.Random) -> None:
        self.rnd = rnd
        self.racks: dict[str | None, _Rack] = {}
        self.total = self.unfenced = 0
        for b in brokers:
            rack = self.racks.setdefault(b.rack, _Rack())
            (rack.fenced if b.fenced else rack.unfenced).ids.append(b.node_id)
            self.total += 1
            self.unfenced += 0 if b.fenced else 1
        for rack in self.racks.values():
            rack.unfenced.start(rnd)
            rack.fenced.start(rnd)
        self.names: list[str | None] = sorted(self.racks, key=lambda n: (n is not None, n or ""))
        self.offset = rnd.randrange(len(self.names)) if self.names else 0
        self.epoch = 0

    def check(self, factor: int) -> None:
        """Kafka's refusals, in its order."""
        if factor <= 0:
            raise invalid_replication_factor(
                "Invalid replication factor %d: the replication factor must be positive." % factor)
        if self.unfenced == 0:
            raise invalid_replication_factor("All brokers are currently fenced.")
        if factor > self.total:
            raise invalid_replication_factor(
                "The target replication factor of %d cannot be reached because only %d broker(s) are registered."
                % (factor, self.total))

    def place(self, factor: int) -> list[int]:
        """The replicas of the next partition, its preferred leader first."""
        self.check(factor)
        if self.epoch == self.unfenced and self.unfenced > 1:
            self._shuffle()
            self.epoch = 0
        if self.offset == len(self.names):
            self.offset = 0
        replicas: list[int] = []
        first = self.offset
        while True:  # the leader: the first unfenced broker from the rack at the offset on
            found = self.racks[self.names[first]].unfenced.next(self.epoch)
            if found >= 0:
                replicas.append(found)
                break
            first = (first + 1) % len(self.names)
        index = self.offset
        for _ in range(1, factor):
            found = -1
            while found < 0:
                if index == first:
                    first = -1  # the leader's rack gave its replica this round: skip it once
                else:
                    found = self.racks[self.names[index]].next(self.epoch)
                index = (index + 1) % len(self.names)
            replicas.append(found)
        self.epoch += 1
        self.offset += 1
        return replicas

    def _shuffle(self) -> None:
        self.rnd.shuffle(self.names)
        for rack in self.racks.values():
            self.rnd.shuffle(rack.unfenced.ids)
            self.rnd.shuffle(rack.fenced.ids)


def place_partitions(brokers: Sequence[UsableBroker], partitions: int, factor: int,
                     rnd: _random.Random | None = None) -> list[list[int]]:
    """Replicas for `partitions` new partitions of `factor` replicas each (KafkaError
    INVALID_REPLICATION_FACTOR when the brokers cannot hold them)."""
    placer = StripedPlacer(brokers, rnd or _random.Random())
    placer.check(factor)
    return [placer.place(factor) for _ in range(partitions)]
