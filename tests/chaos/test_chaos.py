"""Short fault runs (tests/chaos/runner.py) on a three-node cluster, each on its own cluster and
etcd: the workload under faults a replication factor of one survives (kill -9 and restart of any
node, pauses, etcd killed or paused), several seeds, nothing the checker flags. Leader kills
and pauses with replication factor 3 and min.insync.replicas 2 too (replication, issue 23), and
network partitions (a leader or any node cut off from the other brokers and etcd, a node's link
down), the brokers and etcd each in a network namespace, and partitions reassigned away from their
leaders and back; and one etcd member of three killed or paused at a time. A failing run prints its seed and
schedule; `bench/chaos.py --seed N` replays it."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.checker import acknowledged, check
from tests.chaos.history import Kind, load
from tests.chaos.nemesis import Fault
from tests.chaos.network import available as network_available
from tests.chaos.runner import SAFE_WITH_ONE_REPLICA, RunConfig, run
from tests.cluster.nodes import need_etcd


def verdict(config: RunConfig, base: Path) -> None:
    need_etcd()
    result = run(config, base)
    print(result.report())
    assert result.faults_done >= 2, "the run did too few faults to mean anything:\n" + result.report()
    assert result.counts.get("acknowledged", 0) > 0, result.report()
    assert not result.stuck and not result.unhealthy and not result.unanswered, result.report()
    assert not result.violations, result.report()
    # the checker is awake on this history: one acknowledged record taken out of the final read is lost
    events = load(result.history_path)
    value = next(iter(acknowledged(events)))
    missing = [e for e in events if not (e.kind is Kind.FINAL_READ and e["value"] == value)]
    assert [v.check for v in check(missing)] == ["lost"]


@pytest.mark.timeout(110)
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_faults_with_one_replica(tmp_path: Path, seed: int) -> None:
    verdict(RunConfig(seed=seed, duration=15, faults=SAFE_WITH_ONE_REPLICA), tmp_path)


@pytest.mark.timeout(110)
@pytest.mark.parametrize("seed", [1, 2])
def test_leader_kills_with_three_replicas(tmp_path: Path, seed: int) -> None:
    verdict(RunConfig(seed=seed, duration=15, faults=(Fault.KILL_LEADER, Fault.PAUSE),
                      replication_factor=3,
                      min_insync_replicas=2), tmp_path)


@pytest.mark.timeout(110)
def test_reassignments_and_leader_kills_with_three_replicas(tmp_path: Path) -> None:
    config = RunConfig(seed=1, duration=15, faults=(Fault.REASSIGN, Fault.KILL_LEADER), replication_factor=3,
                       min_insync_replicas=2)
    verdict(config, tmp_path)
    moved = [e for e in load(tmp_path / "history.jsonl")
             if e.kind is Kind.NEMESIS and e["fault"] == Fault.REASSIGN and e["op"] == "heal"]
    assert moved, "no reassignment was done and undone"


@pytest.mark.timeout(110)
def test_etcd_member_faults_with_three_members(tmp_path: Path) -> None:
    verdict(RunConfig(seed=1, duration=15, faults=(Fault.ETCD_KILL, Fault.ETCD_PAUSE, Fault.KILL_LEADER),
                      replication_factor=3, min_insync_replicas=2, etcd_members=3), tmp_path)


@pytest.mark.timeout(150)
@pytest.mark.skipif(not network_available(), reason="network partitions need root, ip and iptables")
@pytest.mark.parametrize("seed", [1, 2])
def test_network_partitions_with_three_replicas(tmp_path: Path, seed: int) -> None:
    verdict(RunConfig(seed=seed, duration=15, faults=(Fault.ISOLATE_LEADER, Fault.ISOLATE, Fault.CUT, Fault.PAUSE),
                      replication_factor=3, min_insync_replicas=2), tmp_path)
