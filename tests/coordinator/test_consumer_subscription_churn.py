"""KIP-848 members changing their subscriptions in quick succession (subscribe, add and drop
topics, unsubscribe, subscribe again with the same member id, as librdkafka does), under random
interleavings with held heartbeats: no partition is ever owned by two clients, no heartbeat gets
an error a client treats as fatal, and the group settles with every subscribed partition owned
once.

The simulated client follows librdkafka 2.16: TopicPartitions only in the heartbeat that
acknowledges a new assignment (null otherwise), the subscription in the next heartbeat after a
change, unsubscribe = revoke everything then leave with epoch -1, and the member id kept for the
life of the consumer."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from broker.coordinator.group.consumer import ConsumerGroup, ConsumerGroupState
from broker.coordinator.result import Deferred
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.coordinator.consumer_harness import CONFIG, ConsumerHarness

E = ErrorCode
REQ = M.ConsumerGroupHeartbeatRequest
TOPICS = ["a", "b", "c"]
N_CLIENTS = 4
# ConsumerGroupHeartbeat errors librdkafka treats as fatal (rdkafka_cgrp.c)
FATAL = {E.INVALID_REQUEST, E.GROUP_MAX_SIZE_REACHED, E.UNSUPPORTED_ASSIGNOR, E.UNSUPPORTED_VERSION,
         E.UNRELEASED_INSTANCE_ID, E.GROUP_AUTHORIZATION_FAILED, E.GROUP_ID_NOT_FOUND}


@dataclasses.dataclass
class Churner:
    """A librdkafka consumer whose application changes its subscription."""

    h: ConsumerHarness
    member_id: str
    topics: list[str] | None = None  # None: not subscribed
    epoch: int = 0
    joined: bool = False
    owned: dict[uuid.UUID, frozenset[int]] = dataclasses.field(default_factory=dict)
    ack: bool = False  # the next heartbeat reports what it owns
    new_subscription: bool = False  # the next heartbeat carries the subscription
    inflight: Deferred[Any] | None = None
    fatal: list[tuple[int, str | None]] = dataclasses.field(default_factory=list)

    def subscribe(self, topics: list[str]) -> None:
        self.topics = sorted(topics)
        self.new_subscription = True

    def unsubscribe(self) -> None:
        """Revoke everything (the application's callback), then leave."""
        self._settle_inflight()
        self.owned = {}
        self.topics = None
        if self.joined:
            response = self.h.hb(self.member_id, -1)
            self._check(response, leaving=True)
        self.joined, self.epoch, self.ack, self.new_subscription, self.inflight = False, 0, False, False, None

    def _settle_inflight(self) -> None:
        """librdkafka sends nothing while a heartbeat is in flight: the leave queues behind it on
        the connection, which releases the held heartbeat first (the server does)."""
        if self.inflight is not None and not self.inflight.done():
            self.h.run(lambda s, now: s.release_heartbeat("g", self.member_id, now))
        if self.inflight is not None:
            self._apply(self.inflight.result())
            self.inflight = None

    def poll(self) -> None:
        if self.topics is None:
            return
        if self.inflight is not None:
            if not self.inflight.done():
                return
            response, self.inflight = self.inflight.result(), None
            self._apply(response)
            return
        if not self.joined:
            request = REQ(group_id="g", member_id=self.member_id, member_epoch=0, rebalance_timeout_ms=300000,
                          subscribed_topic_names=list(self.topics), subscribed_topic_regex="", topic_partitions=[])
        else:
            request = REQ(group_id="g", member_id=self.member_id, member_epoch=self.epoch, rebalance_timeout_ms=-1,
                          subscribed_topic_names=list(self.topics) if self.new_subscription else None,
                          topic_partitions=[REQ.TopicPartitions(topic_id=t, partitions=sorted(ps))
                                            for t, ps in self.owned.items()] if self.ack else None)
        response = self.h.cg_heartbeat(request)
        self.new_subscription = False
        self.ack = False
        if isinstance(response, Deferred):
            if not response.done():
                self.inflight = response
                return
            response = response.result()
        self._apply(response)

    def _check(self, response: Any, leaving: bool = False) -> None:
        if response.error_code in FATAL and not (leaving and response.error_code == E.GROUP_ID_NOT_FOUND):
            self.fatal.append((response.error_code, response.error_message))

    def _apply(self, response: Any) -> None:
        self._check(response)
        if response.error_code:
            if response.error_code in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
                self.owned, self.joined, self.epoch = {}, False, 0
            return
        self.joined = True
        self.epoch = response.member_epoch
        if response.assignment is not None:
            self.owned = {tp.topic_id: frozenset(tp.partitions) for tp in response.assignment.topic_partitions
                          if tp.partitions}
            self.ack = True

    def partitions(self) -> set[tuple[uuid.UUID, int]]:
        return {(t, p) for t, ps in self.owned.items() for p in ps}


def check_exclusive(clients: list[Churner]) -> None:
    owners: dict[tuple[uuid.UUID, int], str] = {}
    for c in clients:
        for tp in c.partitions():
            assert tp not in owners, "%s owned by %s and %s" % (tp, owners[tp], c.member_id)
            owners[tp] = c.member_id
        assert not c.fatal, (c.member_id, c.fatal)


HELD = dataclasses.replace(CONFIG, heartbeat_hold_ms=-1, consumer_unreleased_wait_ms=2000,
                           consumer_initial_assignment_delay_ms=300)
subscription = st.lists(st.sampled_from(TOPICS), min_size=1, max_size=3, unique=True)
action = st.one_of(
    st.tuples(st.just("poll"), st.integers(0, N_CLIENTS - 1), st.just(None)),
    st.tuples(st.just("poll"), st.integers(0, N_CLIENTS - 1), st.just(None)),
    st.tuples(st.just("poll"), st.integers(0, N_CLIENTS - 1), st.just(None)),
    st.tuples(st.just("subscribe"), st.integers(0, N_CLIENTS - 1), subscription),
    st.tuples(st.just("unsubscribe"), st.integers(0, N_CLIENTS - 1), st.just(None)),
    st.tuples(st.just("release"), st.integers(0, N_CLIENTS - 1), st.just(None)),
    st.tuples(st.just("time"), st.sampled_from([0, 100, 1_000, 5_000]), st.just(None)),
)


@settings(max_examples=300, deadline=None)
@given(actions=st.lists(action, max_size=50), held=st.booleans())
def test_rapid_subscription_changes(actions: list[Any], held: bool) -> None:
    h = ConsumerHarness(HELD if held else CONFIG)
    h.allow_held = True
    for name, n in zip(TOPICS, (3, 2, 4), strict=True):
        h.topic(name, n)
    clients = [Churner(h, "member-%d-%s" % (i, "x" * 12)) for i in range(N_CLIENTS)]
    for kind, i, arg in actions:
        c = clients[i] if kind != "time" else None
        if kind == "poll":
            clients[i].poll()
        elif kind == "subscribe":
            clients[i].subscribe(arg)
        elif kind == "unsubscribe":
            clients[i].unsubscribe()
        elif kind == "release" and c is not None and c.inflight is not None and not c.inflight.done():
            # a commit on the member's connection releases its held heartbeat
            h.run(lambda s, now, m=c.member_id: s.release_heartbeat("g", m, now))
        elif kind == "time":
            h.advance(i)
        h.advance(0)
        check_exclusive(clients)

    # Everyone keeps heartbeating: the group settles on the subscriptions in force.
    for _ in range(30):
        h.advance(1_000)
        for c in clients:
            c.poll()
        check_exclusive(clients)
    active = [c for c in clients if c.topics is not None]
    subscribed = {t for c in active for t in c.topics or []}
    expected = {(h.metadata.topic(t).topic_id, p) for t in subscribed for p in range(h.metadata.topic(t).partitions)}
    owned = set().union(*(c.partitions() for c in active)) if active else set()
    assert owned == expected
    for c in active:
        allowed = {h.metadata.topic(t).topic_id for t in c.topics or []}
        assert all(t in allowed for t, _ in c.partitions()), (c.member_id, c.topics, c.owned)
    group = h.shard.groups.get("g")
    if active:
        assert isinstance(group, ConsumerGroup) and group.state is ConsumerGroupState.STABLE
