"""The controller's view of the brokers: registration, heartbeats, fencing (Kafka's
ClusterControlManager and BrokerHeartbeatManager), as pure functions of the metadata image.

A broker registers (BrokerRegistration) and is given a broker epoch: the offset its
RegisterBrokerRecord takes in the metadata log. It starts fenced: not offered as a leader or a
coordinator, not listed in Metadata. Its heartbeats (BrokerHeartbeat, every
`broker.heartbeat.interval.ms`) say how far it has replayed the metadata log; once that reaches
its registration it is caught up and unfenced. A broker whose heartbeats stop for
`broker.session.timeout.ms` is fenced again. A broker that asks to shut down (WantShutDown) shuts
down in two steps, as Kafka's controlled shutdown: its first such heartbeat marks it in controlled
shutdown and moves its leaderships away (it leaves every ISR where others remain), while it goes on
serving as a follower; it is told it may go (ShouldShutDown), and fenced, once every live broker
has replayed those changes, so that the new leaders lead before the old one stops. Two
processes with the same node.id: while the registered one's session lasts, a registration with
another incarnation id is refused.

Leadership and ISRs follow the brokers' states (elections.py, as Kafka's ReplicationControlManager):
a fenced or shutting-down broker leaves every ISR where others remain and leads nothing, each
partition it led electing another in-sync replica (or none, -1, until one is back); an unfenced
broker leads the leaderless partitions it may lead; a new incarnation of a broker (a restart) is
taken as an unclean shutdown and leaves ISRs and eligible leader replicas (KIP-966). Every change
is a PartitionChangeRecord.

The time of each broker's last heartbeat is the active controller's memory, not the log: a new
controller gives every registered broker a fresh session (Kafka's BrokerHeartbeatManager does the
same when it becomes active).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from broker.cluster.elections import Changes, Policy
from broker.metadata.image import FENCE, UNFENCE, MetadataImage
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

DEFAULT_POLICY = Policy()


@dataclass
class Heartbeats:
    """When each broker was last heard of (ms), on the active controller's clock, how far each
    has replayed the metadata log, and where the records of each controlled shutdown end."""

    last: dict[int, int] = field(default_factory=dict)
    offsets: dict[int, int] = field(default_factory=dict)  # a broker's CurrentMetadataOffset
    shutdown_offsets: dict[int, int] = field(default_factory=dict)

    def touch(self, node_id: int, now: int, metadata_offset: int | None = None) -> None:
        self.last[node_id] = now
        if metadata_offset is not None:
            self.offsets[node_id] = metadata_offset

    def lowest_active_offset(self, image: MetadataImage) -> int:
        """How far every unfenced broker has replayed the log (Kafka's lowestActiveOffset); one
        not heard of yet by this controller counts as nowhere."""
        live = [n for n, b in image.brokers.items() if not b.fenced]
        return min((self.offsets.get(n, -1) for n in live), default=image.records)

    def expired(self, image: MetadataImage, now: int, session_timeout_ms: int) -> list[int]:
        """The unfenced brokers not heard of for longer than the session timeout."""
        return sorted(n for n, b in image.brokers.items()
                      if not b.fenced and now - self.last.get(n, now) > session_timeout_ms)

    def has_session(self, node_id: int, now: int, session_timeout_ms: int) -> bool:
        last = self.last.get(node_id)
        return last is not None and now - last <= session_timeout_ms

    def start_all(self, image: MetadataImage, now: int) -> None:
        """A new active controller: every registered broker has a fresh session."""
        self.last = {n: now for n in image.brokers}


@dataclass
class Outcome:
    records: list[Any]
    response: Any


def register(image: MetadataImage, heartbeats: Heartbeats, request: Any, cluster_id: str, next_offset: int,
             now: int, session_timeout_ms: int, supported: dict[str, tuple[int, int]],
             policy: Policy = DEFAULT_POLICY) -> Outcome:
    """BrokerRegistration: the RegisterBrokerRecord (the broker fenced, its epoch the record's
    offset), or KafkaError with Kafka's code and message."""
    if request.cluster_id != cluster_id:
        raise KafkaError(ErrorCode.INCONSISTENT_CLUSTER_ID,
                         "Expected cluster ID %s, but got cluster ID %s" % (cluster_id, request.cluster_id))
    existing = image.brokers.get(request.broker_id)
    if existing is not None and existing.incarnation_id != request.incarnation_id \
            and heartbeats.has_session(request.broker_id, now, session_timeout_ms):
        raise KafkaError(ErrorCode.DUPLICATE_BROKER_REGISTRATION, "Another broker is registered with that broker id.")
    offered = {f.name: (f.min_supported_version, f.max_supported_version) for f in request.features or ()}
    for name, level in sorted(image.features.items()):
        lo, hi = offered.get(name, (0, 0))
        if level and not lo <= level <= hi:
            raise KafkaError(ErrorCode.UNSUPPORTED_VERSION, "Unable to register because the broker does not support "
                             "finalized version %d of %s. The broker wants a version between %d and %d, inclusive."
                             % (level, name, lo, hi))
    record = M.RegisterBrokerRecord(
        broker_id=request.broker_id, incarnation_id=request.incarnation_id, broker_epoch=next_offset,
        end_points=[M.RegisterBrokerRecord.BrokerEndpoint(name=li.name, host=li.host, port=li.port,
                                                          security_protocol=li.security_protocol)
                    for li in request.listeners or ()],
        features=[M.RegisterBrokerRecord.BrokerFeature(name=n, min_supported_version=lo, max_supported_version=hi)
                  for n, (lo, hi) in sorted(offered.items())],
        rack=request.rack, fenced=True, in_controlled_shutdown=False, log_dirs=list(request.log_dirs or ()))
    heartbeats.touch(request.broker_id, now)
    records: list[Any] = []
    if existing is not None and existing.incarnation_id != request.incarnation_id:
        changes = Changes(image, policy)
        if not existing.fenced:  # its old incarnation's session ran out unnoticed: as if fenced
            changes.remove_from_isrs(request.broker_id)
        changes.unclean_shutdown(request.broker_id)
        records = changes.records
    records.append(record)  # the broker epoch: the offset of the first record written for it, as Kafka's
    return Outcome(records, M.BrokerRegistrationResponse(error_code=0, broker_epoch=next_offset))


def heartbeat(image: MetadataImage, heartbeats: Heartbeats, request: Any, now: int,
              policy: Policy = DEFAULT_POLICY) -> Outcome:
    """BrokerHeartbeat: the broker's next state (Kafka's calculateNextBrokerState) as records."""
    found = image.brokers.get(request.broker_id)
    if found is None:
        raise KafkaError(ErrorCode.BROKER_ID_NOT_REGISTERED,
                         "Broker %d is not registered." % request.broker_id)
    if found.epoch != request.broker_epoch:
        raise KafkaError(ErrorCode.STALE_BROKER_EPOCH, "Expected broker epoch %d, but got broker epoch %d"
                         % (found.epoch, request.broker_epoch))
    heartbeats.touch(request.broker_id, now, request.current_metadata_offset)
    caught_up = request.current_metadata_offset >= found.epoch
    records: list[Any] = []
    fenced = found.fenced
    shut_down = False
    if request.want_shut_down:
        if fenced:  # it leads nothing and is in no ISR: it may go at once
            shut_down = True
        elif not found.in_controlled_shutdown:  # the first step: its leaderships move
            records.append(M.BrokerRegistrationChangeRecord(broker_id=found.node_id, broker_epoch=found.epoch,
                                                            fenced=0, in_controlled_shutdown=1))
            changes = Changes(image, policy)
            changes.remove_from_isrs(found.node_id)
            records += changes.records
            heartbeats.shutdown_offsets[found.node_id] = image.records + len(records)
        elif heartbeats.lowest_active_offset(image) >= heartbeats.shutdown_offsets.get(found.node_id, image.records):
            # the second: every live broker knows the new leaders (Kafka's SHUTDOWN_NOW)
            records += fence(image, [found.node_id], policy)
            heartbeats.shutdown_offsets.pop(found.node_id, None)
            fenced, shut_down = True, True
    elif fenced and caught_up and not request.want_fence:
        records.append(M.BrokerRegistrationChangeRecord(broker_id=found.node_id, broker_epoch=found.epoch,
                                                        fenced=UNFENCE, in_controlled_shutdown=0))
        changes = Changes(image, policy)
        changes.leaderless_with(found.node_id)
        records += changes.records
        fenced = False
    elif not fenced and request.want_fence:
        records += fence(image, [found.node_id], policy)
        fenced = True
    return Outcome(records, M.BrokerHeartbeatResponse(error_code=0, is_caught_up=caught_up, is_fenced=fenced,
                                                      should_shut_down=shut_down))


def fence(image: MetadataImage, node_ids: Iterable[int], policy: Policy = DEFAULT_POLICY) -> list[Any]:
    """Fence brokers (missed heartbeats, or asked), one after the other as Kafka does: each
    leaves the ISRs and its partitions elect again, then its BrokerRegistrationChangeRecord."""
    changes = Changes(image, policy)
    records: list[Any] = []
    for n in node_ids:
        if n not in image.brokers or image.brokers[n].fenced:
            continue
        changes.remove_from_isrs(n)
        records += changes.records
        changes.records = []
        records.append(M.BrokerRegistrationChangeRecord(broker_id=n, broker_epoch=image.brokers[n].epoch,
                                                        fenced=FENCE, in_controlled_shutdown=0))
    return records


def incarnation() -> uuid.UUID:
    """A process's incarnation id: new at every start."""
    return uuid.uuid4()
