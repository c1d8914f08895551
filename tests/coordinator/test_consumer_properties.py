"""Properties of KIP-848 groups under random interleavings of simulated clients: no partition is
ever owned by two clients, the coordinator's view agrees, every partition ends up owned once
the clients keep heartbeating, and reloading the shard from its log changes nothing."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from broker.coordinator.group.config import GroupCoordinatorConfig
from broker.coordinator.group.consumer import ConsumerGroup, ConsumerGroupState
from tests.coordinator.consumer_harness import CONFIG, Client, ConsumerHarness

N_CLIENTS = 5

action = st.one_of(
    st.tuples(st.just("poll"), st.integers(0, N_CLIENTS - 1)),
    st.tuples(st.just("poll"), st.integers(0, N_CLIENTS - 1)),
    st.tuples(st.just("poll"), st.integers(0, N_CLIENTS - 1)),
    st.tuples(st.just("leave"), st.integers(0, N_CLIENTS - 1)),
    st.tuples(st.just("crash"), st.integers(0, N_CLIENTS - 1)),
    st.tuples(st.just("time"), st.sampled_from([1_000, 5_000, 20_000])),
    st.tuples(st.just("grow"), st.integers(1, 3)),
    st.tuples(st.just("reload"), st.just(0)),
)


def snapshot(group: ConsumerGroup) -> Any:
    return (
        group.group_epoch, group.assignment_epoch, group.metadata_hash, dict(group.members),
        dict(group.static_members), dict(group.target_assignment),
        {t: dict(ps) for t, ps in group.partition_epochs.items()}, dict(group.resolved_regexes),
    )


def check_invariants(h: ConsumerHarness, clients: list[Client], live: list[bool]) -> None:
    owners: dict[tuple[uuid.UUID, int], str] = {}
    for c, alive in zip(clients, live, strict=True):
        if not alive or not c.session_alive():
            continue
        for tp in c.partitions():
            assert tp not in owners, "%s owned by %s and %s" % (tp, owners[tp], c.member_id)
            owners[tp] = c.member_id
    group = h.shard.groups.get("g")
    if isinstance(group, ConsumerGroup):
        held: dict[tuple[uuid.UUID, int], str] = {}
        for m in group.members.values():
            for assignment in (m.assigned, m.pending_revocation):
                for t, ps in assignment.items():
                    for p in ps:
                        assert (t, p) not in held, "coordinator gives %s to %s and %s" % ((t, p), held[(t, p)], m)
                        held[(t, p)] = m.member_id
        # A client owns only what the coordinator gave it.
        for tp, member_id in owners.items():
            assert held.get(tp) == member_id, (tp, member_id, held.get(tp))


WAITING = dataclasses.replace(CONFIG, heartbeat_hold_ms=-1, consumer_unreleased_wait_ms=2000,
                              consumer_initial_assignment_delay_ms=300)


@pytest.mark.parametrize("config", [CONFIG, WAITING], ids=["answered-at-once", "held-heartbeats"])
@settings(max_examples=100, deadline=None)
@given(actions=st.lists(action, max_size=40), partitions=st.integers(1, 8), statics=st.integers(0, 2))
def test_random_interleavings_keep_ownership_exclusive(config: GroupCoordinatorConfig, actions: list[Any],
                                                       partitions: int, statics: int) -> None:
    h = ConsumerHarness(config)
    h.allow_held = True
    h.topic("t", partitions)
    clients = [Client(h, "m%d" % i, ["t"], instance="i%d" % i if i < statics else None) for i in range(N_CLIENTS)]
    live = [True] * N_CLIENTS
    incarnation = [0] * N_CLIENTS
    for kind, arg in actions:
        if kind == "poll":
            if not live[arg]:  # a crashed client restarts with a new member id
                incarnation[arg] += 1
                old = clients[arg]
                clients[arg] = Client(h, "m%d-%d" % (arg, incarnation[arg]), ["t"], instance=old.instance)
                live[arg] = True
            clients[arg].poll()
        elif kind == "leave":
            if live[arg] and clients[arg].joined:
                clients[arg].leave()
        elif kind == "crash":
            live[arg] = False
            clients[arg].owned = {}
        elif kind == "time":
            h.advance(arg)
        elif kind == "grow":
            partitions += arg
            h.topic("t", partitions)
        elif kind == "reload":
            before = snapshot(h.group()) if isinstance(h.shard.groups.get("g"), ConsumerGroup) else None
            h.shard.on_unloaded()  # held heartbeats are answered NOT_COORDINATOR
            h = h.reload()
            h.allow_held = True
            for c in clients:
                c.h = h
            after = snapshot(h.group()) if isinstance(h.shard.groups.get("g"), ConsumerGroup) else None
            assert before == after
        h.advance(0)  # operations the timers scheduled at once (held heartbeats looking again)
        check_invariants(h, clients, live)

    # Quiesce: crashed members expire, the others keep heartbeating until stable.
    for _ in range(12):
        h.advance(5_000)
        for c, alive in zip(clients, live, strict=True):
            if alive and c.joined:
                c.poll()
        check_invariants(h, clients, live)
    active = [c for c, alive in zip(clients, live, strict=True) if alive and c.joined]
    group = h.shard.groups.get("g")
    if active:
        assert isinstance(group, ConsumerGroup) and group.state is ConsumerGroupState.STABLE
        owned = set().union(*(c.partitions() for c in active))
        assert len(owned) == partitions
        loads = [len(c.partitions()) for c in active]
        assert max(loads) - min(loads) <= 1


def test_reload_keeps_epochs_assignments_and_timers() -> None:
    h = ConsumerHarness()
    h.topic("t", 6)
    h.topic("orders-x", 2)
    clients = [Client(h, "a", ["t"]), Client(h, "b", ["t"], instance="ib")]
    for _ in range(3):
        for c in clients:
            c.poll()
    h.cjoin("r", regex="orders-.*")
    h.advance(0)
    before = snapshot(h.group())
    h2 = h.reload()
    assert snapshot(h2.group()) == before
    timers = h2.timer.keys()
    assert sorted(k for k in timers if k.startswith("session-timeout")) == [
        "session-timeout-g-a", "session-timeout-g-b", "session-timeout-g-r"]
    for c in clients:
        c.h = h2
        r = c.poll()  # members carry on from their epochs (the regex brought epoch 3)
        assert r.error_code == 0 and r.member_epoch >= before[3][c.member_id].member_epoch
    # Deleting the group writes tombstones that, replayed, leave nothing behind.
    clients[0].leave()
    h2.hb("b", -1, instance="ib")  # a static member leaving for good
    h2.hb("r", -1)
    assert h2.run(lambda s, now: s.delete_groups(["g"], now)).response[0].error_code == 0
    assert "g" not in h2.reload().shard.groups
