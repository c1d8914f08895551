"""Checks for consumer-group tests with real clients.

`OwnershipLog` records every (member, partition) ownership interval from the clients' own
assign/revoke callbacks (or from what a poll reports as assigned) and checks the group's core
promise: no partition is owned by two members at the same time, and in the end every partition
is owned by exactly one member. Times are `time.monotonic()`, which on Linux is one clock for
every process of the machine, so callbacks reported by child processes compare with the
parent's.

An eager or cooperative client calls its revoke callback before it rejoins, and a new owner's
assign callback comes after the join it waits for, so callback times respect the real order of
ownership: a correct coordinator never makes two intervals overlap.

Also here: reading a group through raw DescribeGroups frames (the broker's view, independent
of any client), a raw OffsetCommit, librdkafka's serialized group metadata, and
`ChildConsumer`, a confluent-kafka consumer in a child process (so a test can `kill -9` it)
that reports its callbacks as JSON lines on stdout. Run as
`python -m tests.compat.group_checker '<json spec>'` that process is the child itself.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from protocol import messages as M
from tests.harness import ROOT, RawClient, wait_for

TP = tuple[str, int]  # (topic, partition)

DESCRIBE_GROUPS = 15
OFFSET_COMMIT = 8


@dataclass
class Interval:
    member: str
    tp: TP
    start: float
    end: float | None = None  # None: still owned

    def overlaps(self, other: Interval) -> bool:
        inf = float("inf")
        return self.start < (other.end if other.end is not None else inf) and \
            other.start < (self.end if self.end is not None else inf)


@dataclass
class Event:
    at: float
    member: str
    kind: str  # "assign", "revoke", "gone"
    tps: tuple[TP, ...]


class OwnershipLog:
    """Thread-safe record of who owned which partition when."""

    def __init__(self, partitions: Iterable[TP]) -> None:
        self.partitions = frozenset(partitions)
        self._lock = threading.Lock()
        self._open: dict[tuple[str, TP], Interval] = {}
        self.intervals: list[Interval] = []
        self.events: list[Event] = []

    # ----- recording ----------------------------------------------------------------------
    def assigned(self, member: str, tps: Iterable[TP], at: float | None = None) -> None:
        """`tps` are now (also) owned by `member`: an eager assign lists all of them, an
        incremental (cooperative) one only the new ones."""
        at = time.monotonic() if at is None else at
        tps = tuple(sorted(tps))
        with self._lock:
            self.events.append(Event(at, member, "assign", tps))
            for tp in tps:
                if (member, tp) not in self._open:
                    interval = Interval(member, tp, at)
                    self._open[(member, tp)] = interval
                    self.intervals.append(interval)

    def revoked(self, member: str, tps: Iterable[TP], at: float | None = None) -> None:
        at = time.monotonic() if at is None else at
        tps = tuple(sorted(tps))
        with self._lock:
            self.events.append(Event(at, member, "revoke", tps))
            for tp in tps:
                interval = self._open.pop((member, tp), None)
                if interval is not None:
                    interval.end = at

    def owned(self, member: str, tps: Iterable[TP], at: float | None = None) -> None:
        """A poll-based observation: `member` owns exactly `tps` now."""
        at = time.monotonic() if at is None else at
        now = set(tps)
        before = self.owned_by(member)
        if before - now:
            self.revoked(member, before - now, at)
        if now - before:
            self.assigned(member, now - before, at)

    def gone(self, member: str, at: float | None = None) -> None:
        """`member` stopped (closed, killed): whatever it owned, it owns no more."""
        at = time.monotonic() if at is None else at
        with self._lock:
            self.events.append(Event(at, member, "gone", ()))
            for key in [k for k in self._open if k[0] == member]:
                self._open.pop(key).end = at

    # ----- reading ------------------------------------------------------------------------
    def owned_by(self, member: str) -> set[TP]:
        with self._lock:
            return {tp for (m, tp) in self._open if m == member}

    def owners(self) -> dict[TP, set[str]]:
        with self._lock:
            out: dict[TP, set[str]] = {tp: set() for tp in self.partitions}
            for m, tp in self._open:
                out.setdefault(tp, set()).add(m)
            return out

    def assignment(self) -> dict[str, set[TP]]:
        with self._lock:
            out: dict[str, set[TP]] = {}
            for m, tp in self._open:
                out.setdefault(m, set()).add(tp)
            return out

    def events_of(self, member: str, since: float = 0.0) -> list[Event]:
        with self._lock:
            return [e for e in self.events if e.member == member and e.at >= since]

    def settled(self, members: Iterable[str] | None = None) -> bool:
        """Every partition has exactly one owner; if `members` are given, they are the owners
        (each owns something, when there are enough partitions to go round)."""
        owners = self.owners()
        if any(len(o) != 1 for o in owners.values()):
            return False
        if members is None:
            return True
        allowed = set(members)
        holders = set().union(*owners.values())
        if not holders <= allowed:
            return False
        return holders == allowed or len(allowed) > len(self.partitions)

    def check(self) -> None:
        """Fail if a partition was ever owned by two members at once, or if a partition outside
        the topic was handed out."""
        with self._lock:
            intervals = list(self.intervals)
            events = list(self.events)
        by_tp: dict[TP, list[Interval]] = {}
        for i in intervals:
            assert i.tp in self.partitions, "unknown partition %s assigned to %s" % (i.tp, i.member)
            by_tp.setdefault(i.tp, []).append(i)
        for tp, its in by_tp.items():
            its.sort(key=lambda i: i.start)
            for a_index, a in enumerate(its):
                for b in its[a_index + 1:]:
                    if a.member != b.member and a.overlaps(b):
                        raise AssertionError("partition %s owned by %s and %s at once: %r, %r\nevents:\n%s" % (
                            tp, a.member, b.member, a, b, self.format(events)))

    def wait_settled(self, members: Iterable[str] | None = None, timeout: float = 30.0,
                     pump: Any = None) -> dict[str, set[TP]]:
        """Wait (calling `pump()` between looks, e.g. to poll in-process consumers) until every
        partition has one owner; checks the history and returns the assignment."""
        wanted = None if members is None else list(members)

        def done() -> bool:
            if pump is not None:
                pump()
            return self.settled(wanted)

        try:
            wait_for(done, timeout, interval=0.0 if pump is not None else 0.02, what="every partition owned once")
        except TimeoutError:
            raise AssertionError("not settled: owners %s\nevents:\n%s" % (
                self.owners(), self.format(self.events))) from None
        self.check()
        return self.assignment()

    @staticmethod
    def format(events: list[Event]) -> str:
        if not events:
            return "  (none)"
        t0 = events[0].at
        return "\n".join("  %+8.3f %-12s %-6s %s" % (e.at - t0, e.member, e.kind, list(e.tps)) for e in events)


# ----- the broker's view, through raw frames ----------------------------------------------------
def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """A ConsumerProtocolAssignment: int16 version, then [topic string, [int32 partition]]
    (later versions only append user data)."""
    if not data:
        return {}
    pos = 2
    (count,) = struct.unpack_from(">i", data, pos)
    pos += 4
    out: dict[str, list[int]] = {}
    for _ in range(count):
        (n,) = struct.unpack_from(">h", data, pos)
        pos += 2
        topic = data[pos:pos + n].decode()
        pos += n
        (k,) = struct.unpack_from(">i", data, pos)
        pos += 4
        out[topic] = list(struct.unpack_from(">%di" % k, data, pos))
        pos += 4 * k
    return out


def describe_group(port: int, group_id: str) -> Any:
    """DescribeGroups v5 for one group: its DescribedGroup."""
    c = RawClient(port, "group-checker")
    try:
        response = c.call(DESCRIBE_GROUPS, 5, M.DescribeGroupsRequest(groups=[group_id]))
    finally:
        c.close()
    [group] = response.groups
    return group


def broker_assignment(port: int, group_id: str) -> dict[str, set[TP]]:
    """member id -> partitions, as the coordinator holds them."""
    group = describe_group(port, group_id)
    return {
        m.member_id: {(t, p) for t, ps in decode_assignment(bytes(m.member_assignment)).items() for p in ps}
        for m in group.members
    }


def raw_commit(port: int, group_id: str, generation: int, member_id: str, tp: TP, offset: int,
               version: int = 8, group_instance_id: str | None = None) -> int:
    """OffsetCommit of one partition; returns the partition's error code."""
    R = M.OffsetCommitRequest
    request = R(group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id,
                group_instance_id=group_instance_id,
                topics=[R.OffsetCommitRequestTopic(name=tp[0], partitions=[
                    R.OffsetCommitRequestPartition(partition_index=tp[1], committed_offset=offset)])])
    c = RawClient(port, "group-checker")
    try:
        response = c.call(OFFSET_COMMIT, version, request)
    finally:
        c.close()
    [topic] = response.topics
    [partition] = topic.partitions
    return int(partition.error_code)


def librdkafka_group_metadata(data: bytes) -> tuple[int, str]:
    """(generation, member id) from confluent-kafka's `consumer_group_metadata()`: librdkafka's
    "CGMDv2:" serialization, generation as a native int32 then NUL-terminated strings."""
    assert data[:7] == b"CGMDv2:", data[:7]
    (generation,) = struct.unpack_from("=i", data, 7)
    _group_id, member_id, _rest = data[11:].split(b"\0", 2)
    return generation, member_id.decode()


# ----- a confluent-kafka consumer in a child process ---------------------------------------------
class ChildConsumer:
    """A subscribed confluent-kafka Consumer in its own process, polling until its stdin closes
    (then it close()s) or it is killed. Its callbacks go to `log` under `name`."""

    def __init__(self, name: str, log: OwnershipLog, conf: dict[str, Any], topics: list[str]) -> None:
        self.name = name
        self.log = log
        spec = json.dumps({"name": name, "conf": conf, "topics": topics})
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.compat.group_checker", spec], cwd=str(ROOT),
                                     env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.member_id = ""
        self.generation = -1
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a line cut short by kill -9
            tps = [(t, p) for t, p in event.get("tps", [])]
            if event["kind"] == "assign":
                self.generation, self.member_id = event["generation"], event["member_id"]
                self.log.assigned(self.name, tps, event["at"])
            elif event["kind"] == "revoke":
                self.log.revoked(self.name, tps, event["at"])

    def kill(self) -> float:
        """kill -9; returns when it happened (the member stops owning anything then)."""
        at = time.monotonic()
        self.proc.kill()
        self.proc.wait(10)
        self.log.gone(self.name, at)
        return at

    def close(self, timeout: float = 30.0) -> int:
        """Let the consumer close() (it leaves the group) and exit."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self._reader.join(5)
        self.log.gone(self.name)
        return int(self.proc.returncode)


def _child_main(spec_json: str) -> None:
    from confluent_kafka import Consumer

    spec = json.loads(spec_json)
    name = spec["name"]
    out_lock = threading.Lock()
    consumer = Consumer(spec["conf"])

    def emit(kind: str, partitions: list[Any] | None = None) -> None:
        generation, member_id = librdkafka_group_metadata(consumer.consumer_group_metadata())
        line = json.dumps({"name": name, "kind": kind, "at": time.monotonic(), "generation": generation,
                           "member_id": member_id,
                           "tps": [(p.topic, p.partition) for p in partitions or []]})
        with out_lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    stop = threading.Event()

    def watch_stdin() -> None:
        sys.stdin.read()
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    consumer.subscribe(spec["topics"],
                       on_assign=lambda c, ps: emit("assign", ps),
                       on_revoke=lambda c, ps: emit("revoke", ps),
                       on_lost=lambda c, ps: emit("revoke", ps))
    while not stop.is_set():
        msg = consumer.poll(0.1)
        error = None if msg is None else msg.error()
        if error is not None and error.fatal():
            raise SystemExit("fatal consumer error: %s" % error)
    consumer.close()


if __name__ == "__main__":
    _child_main(sys.argv[1])
