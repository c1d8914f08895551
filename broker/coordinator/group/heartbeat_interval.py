"""When a KIP-848 member should heartbeat next: the HeartbeatIntervalMs of its answer.

Kafka answers every ConsumerGroupHeartbeat at once with the group's heartbeat interval (5 s by
default): a member learns of a change at its next heartbeat. Holding a heartbeat until there is
news would be quicker, but the clients cannot take it: librdkafka keeps one heartbeat in flight
per member, so a held one blocks the next (a new subscription, an acknowledged revocation, a
leave). So every heartbeat is answered at once here too, and while the member waits for
something the coordinator knows is coming, its answer asks it back when that is due instead of a
whole interval later:

- the group's target assignment waits for a timer (the initial-assignment delay of a new group,
  group.consumer.assignment.interval.ms): back just after it is due;
- a regular expression it subscribes to is being resolved (that runs right after this answer):
  back within `QUICK_INTERVAL_MS`;
- it waits for partitions other members still own (UNRELEASED_PARTITIONS): an owner already told
  to revoke acknowledges as soon as its revocation is done (both clients send that heartbeat at
  once), so back within `QUICK_INTERVAL_MS`; an owner not told yet learns it at its own next
  heartbeat (when it last heard from the coordinator plus the interval it was given), so back
  just after the last of those. The member then gets all it waits for in one answer, as it would
  with Kafka, only sooner.

Members with nothing coming get the group's interval, as in Kafka. The clients take any interval:
librdkafka heartbeats again `HeartbeatIntervalMs` after it sent the last one (and times a
heartbeat out after that interval: hence no interval below `MIN_INTERVAL_MS`), the Java client
resets its heartbeat timer to it on every response.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping

from broker.coordinator.group.consumer import ConsumerGroup
from broker.coordinator.group.member import Assignment, ConsumerGroupMember, MemberState

QUICK_INTERVAL_MS = 500  # back soon: something is about to change for the member
MIN_INTERVAL_MS = 100  # librdkafka times a heartbeat out after the interval it was given
SLACK_MS = 100  # after an owner's expected heartbeat: its revocation and acknowledgement
DUE_SLACK_MS = 20  # after a timer is due: its operation has run


@dataclasses.dataclass(frozen=True)
class Heard:
    """The coordinator's last answer to a member: when, and the interval it was given."""

    at_ms: int
    interval_ms: int

    @property
    def next_ms(self) -> int:
        return self.at_ms + self.interval_ms


def owners(group: ConsumerGroup, except_member: str) -> dict[tuple[uuid.UUID, int], tuple[str, bool]]:
    """Who holds each partition among the other members, and whether it was told to revoke it
    (the partition is pending revocation)."""
    held: dict[tuple[uuid.UUID, int], tuple[str, bool]] = {}
    for m in group.members.values():
        if m.member_id == except_member:
            continue
        for told, assignment in ((False, m.assigned), (True, m.pending_revocation)):
            for topic_id, partitions in assignment.items():
                for p in partitions:
                    held[(topic_id, p)] = (m.member_id, told)
    return held


def unreleased_wait_ms(group: ConsumerGroup, member: ConsumerGroupMember, target: Assignment,
                       heard: Mapping[str, Heard], now: int, interval_ms: int) -> int:
    """How long until what `member` waits for (the partitions of its `target` others hold)
    should be free; `interval_ms` when that cannot be told (an owner not heard from since the
    shard loaded)."""
    held = owners(group, member.member_id)
    wait = 0
    for topic_id, partitions in target.items():
        for p in partitions - member.assigned.get(topic_id, frozenset()):
            owner, told = held.get((topic_id, p), ("", True))
            if told:  # free already, or its owner acknowledges the revocation soon
                wait = max(wait, QUICK_INTERVAL_MS)
                continue
            last = heard.get(owner)
            if last is None:
                return interval_ms
            wait = max(wait, last.next_ms - now + SLACK_MS)
    return wait


def next_heartbeat_ms(group: ConsumerGroup, member: ConsumerGroupMember, target: Assignment,
                      heard: Mapping[str, Heard], now: int, interval_ms: int, assignment_due_ms: int | None,
                      resolving_regex: bool) -> int:
    """The HeartbeatIntervalMs of the answer to `member` (as this heartbeat leaves it, towards
    `target`; `interval_ms`: the group's interval).

    heard: the last answer to each member of the group; assignment_due_ms: when a target
    assignment waiting for a timer is computed (None: none waits); resolving_regex: the group's
    regular expressions are being resolved."""
    wanted = interval_ms
    if assignment_due_ms is not None:
        wanted = min(wanted, assignment_due_ms - now + DUE_SLACK_MS)
    if resolving_regex and member.subscribed_topic_regex:
        wanted = min(wanted, QUICK_INTERVAL_MS)
    if member.state is MemberState.UNRELEASED_PARTITIONS:
        wanted = min(wanted, unreleased_wait_ms(group, member, target, heard, now, interval_ms))
    return max(min(MIN_INTERVAL_MS, interval_ms), min(wanted, interval_ms))
