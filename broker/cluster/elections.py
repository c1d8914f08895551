"""Partition leadership and in-sync replicas on the controller, as Kafka's PartitionChangeBuilder
and ReplicationControlManager decide them: pure functions of a partition's registration
(`Assignment`) that give the PartitionChangeRecord to append, or None when nothing changes.

Who may lead (`acceptable`): a live broker (registered, unfenced, not shutting down); the caller
narrows or widens it (a broker being fenced is never acceptable, one being unfenced is).

- ONLINE election (a leader lost, a broker back): the current leader if it is still valid, else
  the first valid replica in replica order. Valid: in the target ISR, or (KIP-966) in the ELR
  when the ISR is empty. Failing that, with ELR on, the last known leader when ISR and ELR are
  both empty (its log is the newest there is), marked as an unclean election.
- UNCLEAN (unclean.leader.election.enable, topic or broker level): as ONLINE, then any acceptable
  replica; an unclean leader gets the ISR to itself and leader recovery state RECOVERING.
- PREFERRED (ElectLeaders, auto.leader.rebalance.enable): the first replica if valid, else the
  current leader, else another valid replica.

The ISR never becomes empty without ELR (its last member stays, leaderless, until it returns);
with ELR on and the ISR below min.insync.replicas, members leaving it go to the ELR (but not a
broker that shut down uncleanly), and an empty ISR remembers its last leader (LastKnownElr).
The leader epoch moves only when the leader field is set; the partition epoch with every record.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import Any

from broker.metadata import features
from broker.metadata.image import NO_LEADER_CHANGE, Assignment, BrokerRegistration, MetadataImage, TopicInfo
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

NO_LEADER = -1
RECOVERED, RECOVERING, NO_RECOVERY_CHANGE = 0, 1, -1  # LeaderRecoveryState (KIP-704)


class Election(enum.Enum):
    PREFERRED = "preferred"
    ONLINE = "online"
    UNCLEAN = "unclean"


def live(brokers: dict[int, BrokerRegistration], node: int) -> bool:
    """Kafka's ClusterControlManager.isActive: registered, unfenced, not in controlled shutdown."""
    b = brokers.get(node)
    return b is not None and not b.fenced and not b.in_controlled_shutdown


@dataclass
class Change:
    """What is asked of one partition; `build` says what record (if any) it makes."""

    partition: Assignment
    topic_id: uuid.UUID
    index: int
    acceptable: Callable[[int], bool]
    min_isr: int
    elr_enabled: bool
    election: Election = Election.ONLINE
    target_isr: list[int] | None = None  # None: the current ISR
    unclean_shutdown: Collection[int] = ()
    target_recovery: int | None = None  # the leader recovery state asked (AlterPartition)
    # a reassignment started or reverted (None: the partition's own)
    target_replicas: list[int] | None = None
    target_adding: list[int] | None = None
    target_removing: list[int] | None = None

    def build(self) -> Any:
        p = self.partition
        isr = list(p.isr) if self.target_isr is None else list(self.target_isr)
        replicas = list(p.replicas) if self.target_replicas is None else list(self.target_replicas)
        adding = list(p.adding_replicas) if self.target_adding is None else list(self.target_adding)
        removing = list(p.removing_replicas) if self.target_removing is None else list(self.target_removing)
        completed = complete_reassignment(replicas, adding, removing, isr)
        if completed is not None:
            replicas, isr = completed
            adding, removing = [], []
        elr = list(p.elr)
        if self.elr_enabled:  # below min.insync.replicas, who leaves the ISR stays eligible
            if len(isr) >= self.min_isr:
                elr = []
            else:
                elr = [r for r in sorted(set(elr) | set(p.isr)) if r not in isr and r not in self.unclean_shutdown]
        elr = [r for r in elr if r in replicas]  # not a replica reassigned away
        record = M.PartitionChangeRecord(topic_id=self.topic_id, partition_id=self.index)
        # the election
        leader, unclean = self._elect(replicas, isr, elr)
        if leader == p.leader and not set(p.replicas) <= set(replicas):
            record.leader = leader  # replicas leave: the leader epoch moves (fences them)
        if leader != p.leader:
            if leader in elr:
                isr = [leader]
                elr = [r for r in elr if r != leader]
            record.leader = leader
            if unclean:  # may lose records: the ISR is the new leader alone, recovering
                record.isr = [leader]
                if p.leader_recovery_state != RECOVERING:
                    record.leader_recovery_state = RECOVERING
        if record.isr is not None or not self.elr_enabled:  # unclean, or no ELR: none eligible
            elr = []
        if elr != list(p.elr):
            record.eligible_leader_replicas = elr
        if record.isr is None and (isr or self.elr_enabled) and isr != list(p.isr):
            record.isr = isr
        # the last known leader (ELR on): remembered when the ISR empties, forgotten with a leader
        if self.elr_enabled:
            if record.isr is not None and not record.isr and p.last_known_elr != [p.leader]:
                record.last_known_elr = [p.leader]
            elif (record.leader >= 0 or (p.leader != NO_LEADER and record.leader != NO_LEADER)) \
                    and p.last_known_elr:
                record.last_known_elr = []
        if replicas != list(p.replicas):
            record.replicas = replicas
        if adding != list(p.adding_replicas):
            record.adding_replicas = adding
        if removing != list(p.removing_replicas):
            record.removing_replicas = removing
        if self.target_recovery is not None and self.target_recovery != p.leader_recovery_state \
                and record.leader_recovery_state == NO_RECOVERY_CHANGE:
            record.leader_recovery_state = self.target_recovery
        return None if is_no_op(record) else record

    def _valid(self, replica: int, isr: list[int], elr: list[int]) -> bool:
        return (replica in isr or (not isr and replica in elr)) and self.acceptable(replica)

    def _elect(self, replicas: list[int], isr: list[int], elr: list[int]) -> tuple[int, bool]:
        p = self.partition
        if self.election is Election.PREFERRED:
            if replicas and self._valid(replicas[0], isr, elr):
                return replicas[0], False
            if self._valid(p.leader, isr, elr):
                return p.leader, False
            found = next((r for r in replicas[1:] if self._valid(r, isr, elr)), None)
        else:
            if self._valid(p.leader, isr, elr):
                return p.leader, False
            found = next((r for r in replicas if self._valid(r, isr, elr)), None)
        if found is not None:
            return found, False
        if self._last_known_leader(isr, elr):
            return p.last_known_elr[0], True
        if self.election is Election.UNCLEAN:
            found = next((r for r in replicas if self.acceptable(r)), None)
            if found is not None:
                return found, True
        return NO_LEADER, False

    def _last_known_leader(self, isr: list[int], elr: list[int]) -> bool:
        """KIP-966: with ISR and ELR empty, the last leader (alone in LastKnownElr) may lead again,
        once it is acceptable."""
        p = self.partition
        return (self.elr_enabled and not isr and not elr and len(p.last_known_elr) == 1
                and self.acceptable(p.last_known_elr[0]))


def complete_reassignment(replicas: list[int], adding: list[int], removing: list[int], isr: list[int]
                          ) -> tuple[list[int], list[int]] | None:
    """A reassignment in progress is done once every replica it keeps is in the ISR (and one
    stays in it): the replicas and ISR it leaves (Kafka's maybeCompleteReassignment)."""
    if not adding and not removing:
        return None
    kept_isr = [r for r in isr if r not in removing]
    kept = [r for r in replicas if r not in removing]
    if not kept_isr or not kept or not set(kept) <= set(kept_isr):
        return None
    return kept, kept_isr


def is_no_op(record: Any) -> bool:
    return (record.isr is None and record.eligible_leader_replicas is None and record.last_known_elr is None
            and record.leader == NO_LEADER_CHANGE and record.replicas is None and record.removing_replicas is None
            and record.adding_replicas is None and record.leader_recovery_state == NO_RECOVERY_CHANGE
            and record.directories is None)


# ---------------------------------------------------------------------------------------------
# AlterPartition (API 56): a partition leader's ISR change, checked as Kafka's
# ReplicationControlManager.validateAlterPartitionData does, in its order


def alter_partition_error(partition: Assignment | None, broker_id: int, leader_epoch: int, partition_epoch: int,
                          new_isr: Sequence[tuple[int, int]], recovery: int,
                          brokers: dict[int, BrokerRegistration]) -> ErrorCode | None:
    """The error of one partition of an AlterPartition request (None: the change may be made).
    `new_isr`: (broker id, broker epoch or -1) of the ISR asked for."""
    if partition is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    if leader_epoch > partition.leader_epoch or partition_epoch > partition.partition_epoch:
        return ErrorCode.NOT_CONTROLLER  # the leader knows newer metadata than this controller
    if leader_epoch < partition.leader_epoch:
        return ErrorCode.FENCED_LEADER_EPOCH
    if broker_id != partition.leader:
        return ErrorCode.INVALID_REQUEST
    if partition_epoch < partition.partition_epoch:
        return ErrorCode.INVALID_UPDATE_VERSION
    ids = [b for b, _ in new_isr]
    if len(set(ids)) != len(ids) or any(b not in partition.replicas for b in ids):
        return ErrorCode.INVALID_REQUEST  # duplicates, or not a replica
    if partition.leader not in ids:
        return ErrorCode.INVALID_REQUEST  # the ISR must hold its leader
    if recovery == RECOVERING and len(ids) > 1:
        return ErrorCode.INVALID_REQUEST
    if partition.leader_recovery_state == RECOVERED and recovery == RECOVERING:
        return ErrorCode.INVALID_REQUEST
    for b, epoch in new_isr:
        found = brokers.get(b)
        if found is None or found.in_controlled_shutdown or found.fenced or (epoch != -1 and epoch != found.epoch):
            return ErrorCode.INELIGIBLE_REPLICA
    return None


# ---------------------------------------------------------------------------------------------
# the partitions of a cluster: which to look at, with what policy (ReplicationControlManager)


@dataclass(frozen=True)
class Policy:
    """The controller's settings that elections read (topic configs override them)."""

    controller_id: int = -1  # a broker-level dynamic config of the controller's node applies
    static_min_isr: int = 1  # min.insync.replicas
    static_unclean: bool = False  # unclean.leader.election.enable


MIN_ISR = "min.insync.replicas"
UNCLEAN = "unclean.leader.election.enable"


def effective_config(image: MetadataImage, topic: TopicInfo, name: str, controller_id: int) -> str | None:
    """A topic config as Kafka resolves it: the topic's, the controller node's dynamic one, the
    cluster-wide dynamic one (None: the static config)."""
    for configs in (topic.configs, image.broker_configs.get(str(controller_id), {}), image.broker_configs.get("", {})):
        if name in configs:
            return configs[name]
    return None


def min_isr(image: MetadataImage, topic: TopicInfo, policy: Policy) -> int:
    """min.insync.replicas of the topic, at most its replication factor (getTopicEffectiveMinIsr)."""
    value = effective_config(image, topic, MIN_ISR, policy.controller_id)
    configured = int(value) if value is not None else policy.static_min_isr
    first = topic.assignments.get(0)
    return min(configured, len(first.replicas)) if first is not None else configured


def unclean_enabled(image: MetadataImage, topic: TopicInfo, policy: Policy) -> bool:
    value = effective_config(image, topic, UNCLEAN, policy.controller_id)
    return value.strip().lower() == "true" if value is not None else policy.static_unclean


def elr_enabled(image: MetadataImage) -> bool:
    return image.features.get(features.ELR_VERSION, 0) >= 1


Where = tuple[TopicInfo, int]


class Changes:
    """Partition changes made one after the other against the image: each sees the ones before
    (the image itself changes only when the records are replayed)."""

    def __init__(self, image: MetadataImage, policy: Policy) -> None:
        self.image = image
        self.policy = policy
        self.records: list[Any] = []
        self._changed: dict[tuple[uuid.UUID, int], Assignment] = {}
        self.gone: set[int] = set()  # brokers fenced by these changes: no longer acceptable

    def assignment(self, topic: TopicInfo, index: int) -> Assignment:
        return self._changed.get((topic.topic_id, index)) or topic.assignments[index]

    def partitions(self, keep: Callable[[Assignment], bool]) -> list[Where]:
        return [(t, i) for t in sorted(self.image.topics.values(), key=lambda t: t.name)
                for i in sorted(t.assignments) if keep(self.assignment(t, i))]

    def acceptable(self, remove: int = NO_LEADER, add: int = NO_LEADER) -> Callable[[int], bool]:
        brokers = self.image.brokers
        return lambda r: r != remove and r not in self.gone and (r == add or live(brokers, r))

    def change(self, where: Where, acceptable: Callable[[int], bool], election: Election | None = None,
               target_isr: list[int] | None = None, unclean_shutdown: Collection[int] = (),
               target_recovery: int | None = None, target_replicas: list[int] | None = None,
               target_adding: list[int] | None = None, target_removing: list[int] | None = None) -> Any:
        """Build one partition's change and keep it (None: no change)."""
        topic, index = where
        if election is None:
            election = Election.UNCLEAN if unclean_enabled(self.image, topic, self.policy) else Election.ONLINE
        a = self.assignment(topic, index)
        record = Change(a, topic.topic_id, index, acceptable, min_isr(self.image, topic, self.policy),
                        elr_enabled(self.image), election, target_isr, unclean_shutdown, target_recovery,
                        target_replicas, target_adding, target_removing).build()
        if record is not None:
            merged = replace(a, replicas=list(a.replicas), isr=list(a.isr), elr=list(a.elr),
                             last_known_elr=list(a.last_known_elr), adding_replicas=list(a.adding_replicas),
                             removing_replicas=list(a.removing_replicas))
            merged.merge(record)
            self._changed[(topic.topic_id, index)] = merged
            self.records.append(record)
        return record

    # the broker events -----------------------------------------------------------------------
    def remove_from_isrs(self, node: int) -> None:
        """A broker fenced or shutting down: it leaves every ISR (its last member stays without
        ELR) and leads nothing; its partitions elect another leader (Kafka's
        generateLeaderAndIsrUpdates with brokerToRemove)."""
        acceptable = self.acceptable(remove=node)
        for where in self.partitions(lambda a: node in a.isr):
            a = self.assignment(*where)
            self.change(where, acceptable, target_isr=[r for r in a.isr if r != node])
        self.gone.add(node)

    def unclean_shutdown(self, node: int) -> None:
        """A new incarnation of a broker registers: what it had may be lost, so it leaves ISRs
        and ELRs (handleBrokerUncleanShutdown; only with ELR, as Kafka)."""
        if not elr_enabled(self.image):
            return
        acceptable = self.acceptable(remove=node)
        for where in self.partitions(lambda a: node in a.isr or node in a.elr):
            a = self.assignment(*where)
            self.change(where, acceptable, target_isr=[r for r in a.isr if r != node], unclean_shutdown=[node])

    def leaderless_with(self, node: int) -> None:
        """A broker unfenced: leaderless partitions elect again, it among the candidates."""
        acceptable = self.acceptable(add=node)
        for where in self.partitions(lambda a: a.leader == NO_LEADER):
            self.change(where, acceptable)

    def preferred(self, limit: int) -> None:
        """auto.leader.rebalance.enable: partitions whose leader is not their first replica
        elect it if it is valid (maybeBalancePartitionLeaders), at most `limit` changes."""
        acceptable = self.acceptable()
        for where in self.partitions(lambda a: bool(a.replicas) and a.leader != a.replicas[0]):
            if len(self.records) >= limit:
                return
            self.change(where, acceptable, Election.PREFERRED)

    def unclean_leaderless(self, limit: int) -> None:
        """Leaderless partitions of topics with unclean.leader.election.enable elect any live
        replica (maybeElectUncleanLeaders)."""
        acceptable = self.acceptable()
        for where in self.partitions(lambda a: a.leader == NO_LEADER):
            if len(self.records) >= limit:
                return
            if unclean_enabled(self.image, where[0], self.policy):
                self.change(where, acceptable, Election.UNCLEAN)


PREFERRED_TYPE, UNCLEAN_TYPE = 0, 1  # ElectLeaders' ElectionType


def elect_leader(changes: Changes, topic_name: str, index: int, election_type: int) -> tuple[ErrorCode, str | None]:
    """ElectLeaders for one partition (ReplicationControlManager.electLeader): the error code and
    message of its result; a change is kept in `changes`."""
    topic = changes.image.topics.get(topic_name)
    if topic is None:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such topic as %s" % topic_name
    if index not in topic.assignments:
        return ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "No such partition as %s-%d" % (topic_name, index)
    a = changes.assignment(topic, index)
    has_preferred = bool(a.replicas) and a.leader == a.replicas[0]
    if (election_type == PREFERRED_TYPE and has_preferred) or (election_type == UNCLEAN_TYPE and a.leader >= 0):
        return ErrorCode.ELECTION_NOT_NEEDED, "Leader election not needed for topic partition."
    election = Election.PREFERRED if election_type == PREFERRED_TYPE else Election.UNCLEAN
    if changes.change((topic, index), changes.acceptable(), election) is None:
        # Kafka answers with the errors' default messages here
        if election_type == PREFERRED_TYPE:
            return ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE, "The preferred leader was not available."
        return ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE, "Eligible topic partition leaders are not available."
    return ErrorCode.NONE, None


def alter_partition(changes: Changes, request: Any, version: int) -> Any:
    """AlterPartition v2+ (topic ids) from a partition leader, as Kafka's controller answers it:
    each partition checked (`alter_partition_error`), its change kept in `changes`, and the
    partition as it now is in the answer. KafkaError STALE_BROKER_EPOCH for the whole request
    from a broker not registered at that epoch."""
    image = changes.image
    found = image.brokers.get(request.broker_id)
    if found is None or found.epoch != request.broker_epoch:
        raise KafkaError(ErrorCode.STALE_BROKER_EPOCH, "Expected broker epoch %s, but got broker epoch %d"
                         % (found.epoch if found is not None else "(none)", request.broker_epoch))
    R = M.AlterPartitionResponse
    topics = []
    for t in request.topics:
        topic = image.topics_by_id.get(t.topic_id)
        results = []
        for p in t.partitions:
            if topic is None:
                results.append(R.PartitionData(partition_index=p.partition_index,
                                               error_code=ErrorCode.UNKNOWN_TOPIC_ID))
                continue
            where = (topic, p.partition_index)
            current = changes.assignment(*where) if p.partition_index in topic.assignments else None
            new_isr = [(s.broker_id, s.broker_epoch) for s in p.new_isr_with_epochs] if version >= 3 \
                else [(b, -1) for b in p.new_isr]  # v2: no broker epochs to check
            error = alter_partition_error(current, request.broker_id, p.leader_epoch, p.partition_epoch, new_isr,
                                          p.leader_recovery_state, image.brokers)
            if error is not None:
                results.append(R.PartitionData(partition_index=p.partition_index, error_code=error))
                continue
            record = changes.change(where, changes.acceptable(), target_isr=[b for b, _ in new_isr],
                                    target_recovery=p.leader_recovery_state)
            if record is not None and record.leader not in (NO_LEADER_CHANGE, request.broker_id):
                # the change elected another leader: the requester must learn it from the metadata
                results.append(R.PartitionData(partition_index=p.partition_index,
                                               error_code=ErrorCode.NEW_LEADER_ELECTED))
                continue
            now = changes.assignment(*where)
            results.append(R.PartitionData(partition_index=p.partition_index, error_code=0, leader_id=now.leader,
                                           leader_epoch=now.leader_epoch, isr=list(now.isr),
                                           leader_recovery_state=now.leader_recovery_state,
                                           partition_epoch=now.partition_epoch))
        topics.append(R.TopicData(topic_id=t.topic_id, partitions=results))
    return R(throttle_time_ms=0, error_code=0, topics=topics)
