"""Short fault runs (tests/chaos/runner.py) on a three-node cluster, each on its own cluster and
etcd: the workload under faults a replication factor of one survives (kill -9 and restart of any
node, pauses, etcd killed or paused), several seeds, nothing the checker flags. The cases that
need replication (leader kills with replication factor 3) are here too, expected to fail until
it lands. A failing run prints its seed and schedule; `bench/chaos.py --seed N` replays it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.chaos.checker import acknowledged, check
from tests.chaos.history import Kind, load
from tests.chaos.nemesis import Fault
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
@pytest.mark.skipif(not os.environ.get("CHAOS_REPLICATED"), reason="replication (issue 23) is being built: with "
                    "an ISR of one (< min.insync.replicas 2) nothing is acknowledged and each run waits out its "
                    "producers (50 s); CHAOS_REPLICATED=1 runs it")
@pytest.mark.xfail(reason="replication (issue 23) is being built: a killed leader's partitions wait for it "
                          "and its ISR is itself alone", strict=False)
@pytest.mark.parametrize("seed", [1, 2])
def test_leader_kills_with_three_replicas(tmp_path: Path, seed: int) -> None:
    verdict(RunConfig(seed=seed, duration=15, faults=(Fault.KILL_LEADER, Fault.PAUSE),
                      replication_factor=3,
                      min_insync_replicas=2), tmp_path)
