"""The nemesis: faults done to the processes of a tests/cluster/harness.py ProcessCluster on a
schedule drawn from the run's seed. `schedule` is pure (the same seed, duration, faults and
cluster give the same steps); `Nemesis` carries them out in a thread, one fault at a time,
writing each start and heal into the history, and heals whatever is still broken when asked to
stop. It touches only the processes the cluster started, by PID.

The faults (`Fault`), each held for `hold` seconds then healed:
- kill: kill -9 of a broker node; healed by starting it again on its port and log directory.
- kill_leader: kill -9 of the node leading a partition of the workload's topics, looked up when
  the step begins (the schedule names the partition; with replication factor 1 it is a kill).
- pause: SIGSTOP of a broker node; healed by SIGCONT (a hold past broker.session.timeout.ms gets
  it fenced, and its leases in etcd run out).
- etcd_kill: kill -9 of an etcd member (the only one, or one drawn from the seed when etcd has
  several); healed by starting it again on its data directory.
- etcd_pause: SIGSTOP of an etcd member; healed by SIGCONT.
- isolate: a network partition (the run's brokers and etcd each in a network namespace of
  tests/chaos/network.py): a broker node cut off from the other brokers and from etcd, both ways,
  while the clients still reach it (the old leader of a split brain: it must not acknowledge what
  it cannot replicate); healed by removing the drops.
- isolate_leader: the same, of the node leading a partition of the workload.
- cut: a broker node's link down: it reaches nobody, clients included; healed by bringing it up.
- reassign: a partition of the workload reassigned away from its leader (AlterPartitionReassignments
  to the controller): its other replicas, or with one replica another node, which must copy the
  log and take over; healed by reassigning it back to its replicas before (the node that left
  copies it again).
"""

from __future__ import annotations

import os
import random
import signal
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Protocol

from broker.testing.etcd import EtcdMember
from tests.chaos.history import History, Kind
from tests.cluster.harness import ETCD_MEMBER, ProcessCluster, member_name


class Fault(StrEnum):
    KILL = "kill"
    KILL_LEADER = "kill_leader"
    PAUSE = "pause"
    ETCD_KILL = "etcd_kill"
    ETCD_PAUSE = "etcd_pause"
    ISOLATE = "isolate"
    ISOLATE_LEADER = "isolate_leader"
    CUT = "cut"
    REASSIGN = "reassign"


NETWORK_FAULTS = frozenset({Fault.ISOLATE, Fault.ISOLATE_LEADER, Fault.CUT})  # the run needs its own network
LEADER_FAULTS = frozenset({Fault.KILL_LEADER, Fault.ISOLATE_LEADER})  # done to a partition's leader
PARTITION_FAULTS = LEADER_FAULTS | {Fault.REASSIGN}  # their target is a partition


class Reassigner(Protocol):
    """How the nemesis reassigns a workload partition (tests/chaos/runner.py sends the requests)."""

    def replicas(self, partition: int) -> tuple[int, list[int]]:
        """The partition's leader (-1: none) and replicas, as the metadata has them now."""

    def reassign(self, partition: int, replicas: list[int]) -> None:
        """AlterPartitionReassignments; raises when it is refused."""


ETCD = 0  # the target of an etcd fault: member 0; member i of several is ETCD - i


def is_etcd(target: int) -> bool:
    return target <= ETCD  # broker node ids are 1 and up
# seconds a fault is held, by kind: short enough that a run of a few seconds sees several faults,
# long enough that a pause sometimes outlives the cluster's 3 s broker session (FAST)
HOLDS: dict[Fault, tuple[float, float]] = {
    Fault.KILL: (0.2, 3.0),
    Fault.KILL_LEADER: (0.2, 3.0),
    Fault.PAUSE: (0.5, 4.5),
    Fault.ETCD_KILL: (0.2, 3.0),
    Fault.ETCD_PAUSE: (0.5, 3.0),
    Fault.ISOLATE: (1.0, 5.0),
    Fault.ISOLATE_LEADER: (1.0, 5.0),
    Fault.CUT: (1.0, 5.0),
    Fault.REASSIGN: (1.0, 5.0),
}
QUIET = (0.5, 2.5)  # seconds between a heal and the next fault


@dataclass(frozen=True)
class Step:
    at: float  # seconds after the run began
    fault: Fault
    target: int  # node id; a partition index for kill_leader; ETCD for etcd faults
    hold: float

    def describe(self) -> str:
        if self.fault in LEADER_FAULTS:
            where = "leader of partition %d" % self.target
        elif self.fault is Fault.REASSIGN:
            where = "partition %d" % self.target
        elif self.target == ETCD:
            where = "etcd"
        elif is_etcd(self.target):
            where = "etcd member %d" % (ETCD - self.target)
        else:
            where = "node %d" % self.target
        return "%6.2f s  %-11s %-22s for %.2f s" % (self.at, self.fault, where, self.hold)


def schedule(seed: int, duration: float, faults: Iterable[Fault], nodes: Sequence[int], partitions: int,
             first: float = 1.0, etcd_members: int = 1) -> list[Step]:
    """The faults of a run: one at a time from `first` seconds on, each healed before the next,
    all healed by `duration`. Every kind comes once (in an order drawn from the seed) before
    any comes again, so a short run still covers them all."""
    kinds = sorted(set(faults))
    rng = random.Random(seed)
    steps: list[Step] = []
    at = first
    order: list[Fault] = []
    while kinds:
        if not order:
            order = rng.sample(kinds, len(kinds))
        fault = order.pop()
        hold = round(rng.uniform(*HOLDS[fault]), 2)
        if fault in PARTITION_FAULTS:
            target = rng.randrange(partitions)
        elif fault in (Fault.ETCD_KILL, Fault.ETCD_PAUSE):
            target = ETCD if etcd_members == 1 else ETCD - rng.randrange(etcd_members)
        else:
            target = rng.choice(list(nodes))
        if at + hold > duration:
            break
        steps.append(Step(round(at, 2), fault, target, hold))
        at += hold + rng.uniform(*QUIET)
    return steps


class Nemesis:
    """Runs `steps` against `cluster` in a thread. `leader_of(partition)` names the node leading
    a workload partition (-1: none known), for kill_leader; `reassigner` moves its replicas."""

    def __init__(self, cluster: ProcessCluster, history: History, steps: Sequence[Step],
                 leader_of: Callable[[int], int], reassigner: Reassigner | None = None) -> None:
        self.cluster = cluster
        self.history = history
        self.steps = list(steps)
        self.leader_of = leader_of
        self.reassigner = reassigner
        self.reassigned: dict[int, list[int]] = {}  # partition -> its replicas before
        self.stopping = threading.Event()
        self.killed: set[int] = set()  # broker nodes down (ETCD for etcd)
        self.paused: set[int] = set()
        self.parted: set[int] = set()  # broker nodes isolated or cut
        self.done = 0  # steps carried out
        self._thread: threading.Thread | None = None
        self._began = 0.0

    def start(self, began: float) -> None:
        self._began = began
        self._thread = threading.Thread(target=self._run, name="nemesis", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 60.0) -> None:
        """Stop scheduling faults and heal every one still on."""
        self.stopping.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise RuntimeError("the nemesis did not stop within %.0f s" % timeout)
        self.heal_all()

    def _run(self) -> None:
        for step in self.steps:
            if self.stopping.wait(max(0.0, self._began + step.at - time.monotonic())):
                return
            try:
                target = self._begin(step)
                self.stopping.wait(step.hold)
                self._heal(step.fault, target)
                self.done += 1
            except Exception as e:  # a fault that could not be done or healed is in the history, not lost
                self._record("error", step.fault, step.target, "%s: %s" % (type(e).__name__, e))

    def _begin(self, step: Step) -> int:
        target = step.target
        if step.fault in LEADER_FAULTS:
            leader = self.leader_of(step.target)
            target = leader if leader in self.cluster.nodes else sorted(self.cluster.nodes)[
                step.target % len(self.cluster.nodes)]
        if step.fault is Fault.REASSIGN:
            assert self.reassigner is not None, "a reassign fault needs a reassigner"
            leader, before = self.reassigner.replicas(target)
            after = [r for r in before if r != leader] or [next(n for n in sorted(self.cluster.nodes) if n != leader)]
            self._record("start", step.fault, target, {**asdict(step), "from": before, "to": after})
            self.reassigner.reassign(target, after)
            self.reassigned[target] = before
            return target
        self._record("start", step.fault, target, asdict(step))
        if step.fault in (Fault.KILL, Fault.KILL_LEADER):
            self.cluster.node(target).kill()
            self.killed.add(target)
        elif step.fault is Fault.PAUSE:
            self._signal(self._pid(target), signal.SIGSTOP)
            self.paused.add(target)
        elif step.fault is Fault.ETCD_KILL:
            self._etcd(target).kill()
            self.killed.add(target)
        elif step.fault is Fault.ETCD_PAUSE:
            self._etcd(target).pause()
            self.paused.add(target)
        elif step.fault in NETWORK_FAULTS:
            network = self.cluster.network
            assert network is not None, "a network fault needs the cluster in a network of its own"
            member = member_name(target)
            if step.fault is Fault.CUT:
                network.cut(member)
            else:
                others = [member_name(n) for n in self.cluster.nodes if n != target]
                network.isolate(member, [*others, ETCD_MEMBER])
            self.parted.add(target)
        return target

    def _heal(self, fault: Fault, target: int) -> None:
        if fault is Fault.REASSIGN:
            if target not in self.reassigned or self.reassigner is None:
                return
            self.reassigner.reassign(target, self.reassigned.pop(target))
        elif fault in NETWORK_FAULTS:
            if target not in self.parted:
                return
            assert self.cluster.network is not None
            self.cluster.network.heal()  # one fault at a time: whatever is cut is this one's
            self.parted.clear()
        elif target in self.paused and fault in (Fault.PAUSE, Fault.ETCD_PAUSE):
            if is_etcd(target):
                self._etcd(target).resume()
            else:
                self._signal(self._pid(target), signal.SIGCONT)
            self.paused.discard(target)
        elif target in self.killed:
            if is_etcd(target):
                self._etcd(target).start(timeout=30)
            else:
                self.cluster.restart(target)
            self.killed.discard(target)
        else:
            return
        self._record("heal", fault, target, None)

    def heal_all(self) -> None:
        for partition in sorted(self.reassigned):
            try:
                self._heal(Fault.REASSIGN, partition)
            except Exception as e:  # the cluster may not take it yet: the partition keeps its new replicas
                self._record("error", Fault.REASSIGN, partition, "%s: %s" % (type(e).__name__, e))
                self.reassigned.pop(partition, None)
        for target in sorted(self.parted):
            self._heal(Fault.ISOLATE, target)
        for target in sorted(self.paused):
            self._heal(Fault.ETCD_PAUSE if is_etcd(target) else Fault.PAUSE, target)
        for target in sorted(self.killed):
            self._heal(Fault.ETCD_KILL if is_etcd(target) else Fault.KILL, target)

    def _etcd(self, target: int) -> EtcdMember:
        return self.cluster.etcd_members[ETCD - target]

    def _pid(self, node: int) -> int:
        proc = self.cluster.node(node).proc
        assert proc is not None and proc.poll() is None, "node %d is not running" % node
        return proc.pid

    @staticmethod
    def _signal(pid: int, signum: int) -> None:
        os.kill(pid, signum)

    def _record(self, op: str, fault: Fault, target: int, detail: object) -> None:
        self.history.add(Kind.NEMESIS, "nemesis", op=op, fault=str(fault), target=target, detail=detail)


def describe(steps: Iterable[Step]) -> str:
    return "\n".join(s.describe() for s in steps)
