"""The nemesis' schedule is a pure function of the seed: the same steps for the same seed,
others for another, every fault kind once before any twice, all healed within the run."""

from __future__ import annotations

from tests.chaos.nemesis import ETCD, PARTITION_FAULTS, Fault, schedule

ALL = tuple(Fault)


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert schedule(7, 60, ALL, [1, 2, 3], 3) == schedule(7, 60, ALL, [1, 2, 3], 3)
    assert schedule(7, 60, ALL, [1, 2, 3], 3) != schedule(8, 60, ALL, [1, 2, 3], 3)


def test_faults_one_at_a_time_all_healed_within_the_run() -> None:
    for seed in range(20):
        steps = schedule(seed, 40, ALL, [1, 2, 3], 3)
        assert steps and steps[0].at == 1.0
        for a, b in zip(steps, steps[1:]):
            assert a.at + a.hold < b.at
        assert steps[-1].at + steps[-1].hold <= 40
        assert {s.fault for s in steps[:len(ALL)]} == set(ALL)


def test_targets_fit_the_fault() -> None:
    steps = schedule(3, 200, ALL, [4, 5], 2)
    for step in steps:
        if step.fault in (Fault.ETCD_KILL, Fault.ETCD_PAUSE):
            assert step.target == ETCD
        elif step.fault in PARTITION_FAULTS:
            assert step.target in (0, 1)
        else:
            assert step.target in (4, 5)
    assert {s.target for s in steps if s.fault is Fault.KILL} == {4, 5}


def test_only_the_faults_asked_for() -> None:
    steps = schedule(1, 100, [Fault.PAUSE], [1, 2, 3], 3)
    assert len(steps) > 5 and {s.fault for s in steps} == {Fault.PAUSE}
    assert schedule(1, 100, [], [1, 2, 3], 3) == []


def test_etcd_faults_hit_one_member_of_several() -> None:
    steps = schedule(5, 400, [Fault.ETCD_KILL, Fault.ETCD_PAUSE], [1, 2, 3], 3, etcd_members=3)
    assert {s.target for s in steps} == {ETCD, ETCD - 1, ETCD - 2}
    assert all(s.target == ETCD for s in schedule(5, 400, [Fault.ETCD_KILL], [1, 2, 3], 3))
