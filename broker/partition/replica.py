"""The leader's view of its followers (Kafka's Replica and the ISR rules of its Partition), pure:
time comes in as arguments, nothing here awaits or does I/O.

- `ReplicaState`: one follower as its Fetch requests show it: its log end (the fetch offset), its
  log start, the broker epoch it fetched with (KIP-903) and its last caught-up time: the latest
  time t at which its fetch offset had reached the leader's log end of time t. A follower whose
  fetches keep landing just behind a busy leader still counts as caught up, since a fetch that
  reaches the leader's end offset *of the previous fetch* proves it was caught up then.
- `IsrState`: the ISR the controller committed, and the change sent to it (AlterPartition) and not
  answered yet. One change at a time; while an expansion is in flight its new member already
  counts for the high watermark and acks=all (KIP-497's "maximal ISR": a larger ISR only makes
  them stricter), while a shrink in flight does not count yet (it could fail).
- `high_watermark_candidate`: the smallest log end offset over the maximal ISR and the followers
  caught up and allowed to join it (so that a joining follower is not left behind for ever).
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from protocol.errors import ErrorCode, KafkaError

UNKNOWN_OFFSET = -1


@dataclass(frozen=True)
class BrokerStatus:
    """What the metadata says of a follower's broker: its epoch while it is registered and
    unfenced (None: not alive), and whether it is in controlled shutdown."""

    epoch: int | None
    fenced: bool = False
    shutting_down: bool = False


# the status of a broker by id (None: not registered); no provider: every replica is eligible
BrokerStatuses = Callable[[int], BrokerStatus | None]


@dataclass
class ReplicaState:
    broker_id: int
    log_start_offset: int = UNKNOWN_OFFSET
    log_end_offset: int = UNKNOWN_OFFSET  # the follower's last fetch offset
    last_fetch_leader_log_end_offset: int = 0  # the leader's log end when that fetch came
    last_fetch_time_ms: int = 0
    last_caught_up_time_ms: int = 0
    broker_epoch: int | None = None  # from its last Fetch (-1: the follower did not say)

    def update_fetch_state(self, fetch_offset: int, log_start_offset: int, now_ms: int, leader_end_offset: int,
                           broker_epoch: int, alive_epoch: int | None) -> None:
        """A Fetch from this follower at `fetch_offset`, when the leader's log ended at
        `leader_end_offset`. A broker epoch older than the one the metadata knows is a fetch from
        a previous life of that broker (KIP-903): refused, nothing recorded."""
        if broker_epoch != -1 and alive_epoch is not None and alive_epoch > broker_epoch:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "Received stale fetch state update. broker "
                             "epoch=%d vs expected=%d" % (broker_epoch, alive_epoch))
        if fetch_offset >= leader_end_offset:
            caught_up = max(self.last_caught_up_time_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end_offset:
            caught_up = max(self.last_caught_up_time_ms, self.last_fetch_time_ms)
        else:
            caught_up = self.last_caught_up_time_ms
        self.log_start_offset = log_start_offset
        self.log_end_offset = fetch_offset
        self.last_fetch_leader_log_end_offset = max(leader_end_offset, self.last_fetch_leader_log_end_offset)
        self.last_fetch_time_ms = now_ms
        self.last_caught_up_time_ms = caught_up
        self.broker_epoch = broker_epoch

    def is_caught_up(self, leader_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        """At the leader's log end, or caught up within the last `max_lag_ms`
        (replica.lag.time.max.ms)."""
        return leader_end_offset == self.log_end_offset or now_ms - self.last_caught_up_time_ms <= max_lag_ms

    def reset(self, now_ms: int, leader_end_offset: int, new_leader: bool, in_sync: bool) -> None:
        """This node became the leader (`new_leader`) or starts a new leader epoch: an in-sync
        follower counts as caught up now, the others not until they fetch (so that a follower
        no longer in the ISR does not hold the high watermark back)."""
        self.last_caught_up_time_ms = now_ms if in_sync else 0
        if new_leader:
            self.log_start_offset = self.log_end_offset = UNKNOWN_OFFSET
            self.last_fetch_leader_log_end_offset = UNKNOWN_OFFSET
            self.last_fetch_time_ms = 0
            self.broker_epoch = None
        else:
            self.last_fetch_leader_log_end_offset = leader_end_offset
            self.last_fetch_time_ms = now_ms if in_sync else 0


class IsrChange(enum.Enum):
    """The ISR change in flight to the controller, if any."""

    NONE = "committed"
    EXPAND = "pending expand"
    SHRINK = "pending shrink"


@dataclass(frozen=True)
class IsrState:
    isr: tuple[int, ...]  # as the controller committed it
    change: IsrChange = IsrChange.NONE
    sent_isr: tuple[int, ...] = ()  # the ISR asked for, while a change is in flight

    @property
    def in_flight(self) -> bool:
        return self.change is not IsrChange.NONE

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The ISR the high watermark and acks=all wait for: with an expansion in flight, its new
        member too."""
        if self.change is IsrChange.EXPAND:
            return frozenset(self.isr) | frozenset(self.sent_isr)
        return frozenset(self.isr)

    def expand(self, replica_id: int) -> IsrState:
        assert not self.in_flight
        return IsrState(self.isr, IsrChange.EXPAND, tuple(sorted(set(self.isr) | {replica_id})))

    def shrink(self, out_of_sync: Iterable[int]) -> IsrState:
        assert not self.in_flight
        removed = set(out_of_sync)
        return IsrState(self.isr, IsrChange.SHRINK, tuple(r for r in self.isr if r not in removed))

    def committed(self) -> IsrState:
        """The change was refused (OPERATION_NOT_ATTEMPTED, INELIGIBLE_REPLICA): back to the ISR
        last committed."""
        return IsrState(self.isr)


def isr_eligible(replica: ReplicaState, status: BrokerStatus | None) -> bool:
    """KRaft's rule for a replica joining the ISR: its broker is alive (registered, unfenced), not
    in controlled shutdown, and fetched with the broker epoch the metadata has (or with -1)."""
    if status is None or status.epoch is None or status.fenced or status.shutting_down:
        return False
    return replica.broker_epoch is not None and replica.broker_epoch in (-1, status.epoch)


@dataclass
class Followers:
    """The leader's replica states of its followers, keyed by broker id."""

    local_id: int
    states: dict[int, ReplicaState] = field(default_factory=dict)

    def assign(self, replicas: Iterable[int]) -> None:
        """The partition's replicas changed: a state for each follower, none for the others."""
        wanted = [r for r in replicas if r != self.local_id]
        for r in wanted:
            self.states.setdefault(r, ReplicaState(r))
        for r in [r for r in self.states if r not in wanted]:
            del self.states[r]

    def get(self, broker_id: int) -> ReplicaState | None:
        return self.states.get(broker_id)

    def eligible(self, broker_id: int, statuses: BrokerStatuses | None) -> bool:
        replica = self.states.get(broker_id)
        if replica is None:
            return False
        return statuses is None or isr_eligible(replica, statuses(broker_id))


def high_watermark_candidate(leader_end_offset: int, followers: Followers, isr: IsrState, now_ms: int,
                             max_lag_ms: int, statuses: BrokerStatuses | None) -> int:
    """Kafka's maybeIncrementLeaderHW: the smallest log end offset of the leader and of every
    follower in the maximal ISR or caught up and eligible to join it."""
    hw = leader_end_offset
    maximal = isr.maximal_isr
    for replica in followers.states.values():
        end = replica.log_end_offset
        if end < hw and (replica.broker_id in maximal or (
                replica.is_caught_up(leader_end_offset, now_ms, max_lag_ms)
                and followers.eligible(replica.broker_id, statuses))):
            hw = end
    return hw


def out_of_sync_replicas(isr: IsrState, followers: Followers, leader_end_offset: int, now_ms: int,
                         max_lag_ms: int) -> set[int]:
    """The ISR followers not caught up for `max_lag_ms` (none while a change is in flight)."""
    if isr.in_flight:
        return set()
    out = set()
    for r in isr.isr:
        if r == followers.local_id:
            continue
        replica = followers.get(r)
        if replica is None or not replica.is_caught_up(leader_end_offset, now_ms, max_lag_ms):
            out.add(r)
    return out


def can_join_isr(replica: ReplicaState, isr: IsrState, high_watermark: int, leader_epoch_start_offset: int,
                 followers: Followers, statuses: BrokerStatuses | None) -> bool:
    """Kafka's needsExpandIsr: no change in flight, not in the ISR yet, eligible, and caught up to
    the high watermark within the current leader epoch (else it could become leader without the
    committed records between the epoch's start and the high watermark)."""
    return (not isr.in_flight and replica.broker_id not in isr.isr
            and followers.eligible(replica.broker_id, statuses)
            and replica.log_end_offset >= high_watermark
            and replica.log_end_offset >= leader_epoch_start_offset)


def acks_all_outcome(high_watermark: int, required_offset: int, maximal_isr_size: int,
                     min_isr: int) -> ErrorCode | None:
    """Kafka's checkEnoughReplicasReachOffset for an acks=all produce waiting for
    `required_offset` (its last offset + 1): None while the high watermark is below it; once
    reached, NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR meanwhile fell below
    min.insync.replicas."""
    if high_watermark < required_offset:
        return None
    return ErrorCode.NONE if min_isr <= maximal_isr_size else ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND


@dataclass(frozen=True)
class LeaderAndIsr:
    """A partition's leadership and ISR, as sent in AlterPartition (the ISR with each member's
    broker epoch, -1 where unknown) and as the controller answers it (epochs not given)."""

    leader: int
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int
    isr_broker_epochs: tuple[int, ...] = ()  # aligned with `isr` in a request
