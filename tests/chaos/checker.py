"""The checker: pure functions over a history (tests/chaos/history.py), nothing else. Each check
returns the violations it found; `check` runs them all. A check flags only what Kafka promises
never happens, whatever the faults, so a correct broker passes every check under every
nemesis; what a fault may legitimately cost (availability, retries, an outcome left unknown)
is never a violation.

The checks, and the guarantee each one stands for:

- **lost** (durability of acknowledged writes, `acks=all`): a record whose producer got an
  acknowledgement (a delivery report without error), or a record of a transaction whose
  `commit_transaction` returned, is in the final read of its topic, at the partition and offset
  it was acknowledged at. Kafka: a write acknowledged with acks=all is on every in-sync replica
  and survives any failure that leaves one of them (with replication factor 1, the leader's
  disk: kill -9 of the process does not lose it). A final read that could not reach its
  partition's high watermark is a violation too: the run cannot be judged.
- **duplicate** (idempotence, KIP-98): no value appears twice in a partition's final read. An
  idempotent or transactional producer's retries never write a record twice.
- **order** (the log is a sequence): in a partition's final read, and in what one consumer reads
  of one partition while it owns it, offsets strictly increase; no two acknowledgements name
  one offset; one idempotent producer's records acknowledged in a partition have increasing
  offsets in the order they were sent (the ordering guarantee of idempotence with at most five
  requests in flight).
- **reread** (committed offsets are durable, and a consumer starts from them): a group member
  that is assigned a partition after the group's commit of offset c for it was acknowledged
  reads nothing below c (unless a commit with a lower offset may have landed meanwhile: one in
  flight or of unknown outcome). Kafka: a successful OffsetCommit is durable and is what
  OffsetFetch answers until the next commit; a new owner resumes from it, so it never re-reads
  what the group committed past.
- **aborted_read** (read_committed isolation, KIP-98): a consumer with
  `isolation.level=read_committed` never returns a record of an aborted transaction; and no
  transaction is both committed and aborted.
- **share_overlap** (KIP-932: a record is acquired by one member at a time): once member B got
  a record, an acknowledgement of it by member A, sent after that delivery, is refused. A broker
  accepting it had the record held by two members at once.
- **share_after_ack** (KIP-932: acknowledged records are archived): a record whose ACCEPT or
  REJECT the broker confirmed is never delivered again (no poll that began after the
  confirmation returns it).
- **replica_divergence** (log matching, KIP-101/KIP-279): two replicas of a partition hold the
  same batches, byte for byte, over the offsets both hold. A follower appends exactly the
  leader's batches and truncates where its history diverges, so they never disagree.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.history import Event, Kind

READ_COMMITTED = "read_committed"
ARCHIVING_ACKS = ("accept", "reject")  # acknowledgement types after which a record is never delivered again


@dataclass(frozen=True)
class Violation:
    check: str
    message: str
    events: tuple[Event, ...] = field(default=())

    @property
    def at(self) -> float:
        return min((e.t for e in self.events), default=0.0)

    def __str__(self) -> str:
        shown = "".join("\n    " + e.to_json()[:300] for e in self.events[:4])
        return "[%s] %s%s" % (self.check, self.message, shown)


def _tp(e: Event) -> tuple[str, int]:
    return str(e["topic"]), int(e["partition"])


# lost and duplicate ------------------------------------------------------------------------------
def acknowledged(events: Sequence[Event]) -> dict[str, Event]:
    """Value -> the event acknowledging it: an ack outside a transaction, or, for a record of a
    committed transaction, its ack (or its send when no delivery report came)."""
    committed = {e["txn"] for e in events if e.kind is Kind.TXN_COMMIT}
    found: dict[str, Event] = {}
    for e in events:
        txn = e.get("txn")
        if e.kind is Kind.ACK and (txn is None or txn in committed):
            found[e["value"]] = e
        elif e.kind is Kind.SEND and txn is not None and txn in committed:
            found.setdefault(e["value"], e)
    return found


def final_reads(events: Sequence[Event]) -> dict[tuple[str, str], list[Event]]:
    """(topic, isolation) -> the final reader's records of it, in read order."""
    reads: dict[tuple[str, str], list[Event]] = defaultdict(list)
    for e in events:
        if e.kind is Kind.FINAL_READ:
            reads[(e["topic"], e["isolation"])].append(e)
    return reads


def check_lost(events: Sequence[Event]) -> list[Violation]:
    out: list[Violation] = []
    ends = {(e["topic"], int(e["partition"]), e["isolation"]): e for e in events if e.kind is Kind.FINAL_END}
    reads = final_reads(events)
    incomplete = [e for e in ends.values() if not e["complete"]]
    for e in incomplete:
        out.append(Violation("lost", "the final read of %s-%d (%s) stopped at %s, below the high watermark %s: "
                             "the run cannot be judged" % (e["topic"], e["partition"], e["isolation"],
                                                           e["position"], e["high_watermark"]), (e,)))
    where: dict[str, dict[str, Event]] = defaultdict(dict)  # topic -> value -> final read
    for (topic, isolation), records in reads.items():
        for r in records:
            # a transactional topic's committed records must be visible to read_committed
            if isolation == READ_COMMITTED or r["value"] not in where[topic]:
                where[topic][r["value"]] = r
    read_topics = {topic for topic, _ in reads} | {e["topic"] for e in ends.values()}
    unread = set()
    for value, ack in acknowledged(events).items():
        topic, partition = _tp(ack)
        if topic not in read_topics:
            unread.add(topic)
            continue
        found = where[topic].get(value)
        if found is None:
            end = [e for (t, p, _), e in ends.items() if t == topic and p == partition]
            if end and all(e["complete"] for e in end):
                out.append(Violation("lost", "acknowledged %s (%s-%d@%s) is not in the final read" % (
                    value, topic, partition, ack.get("offset", "?")), (ack,)))
            elif not end:
                out.append(Violation("lost", "%s-%d was not read at the end: acknowledged %s unchecked" % (
                    topic, partition, value), (ack,)))
        elif ack.kind is Kind.ACK and (int(found["partition"]), int(found["offset"])) != (partition, int(ack["offset"])):
            out.append(Violation("lost", "acknowledged %s at %s-%d@%d, but the log holds it at %d@%d" % (
                value, topic, partition, ack["offset"], found["partition"], found["offset"]), (ack, found)))
    for topic in sorted(unread):
        out.append(Violation("lost", "no final read of topic %s, which has acknowledged records" % topic))
    return out


def check_duplicate(events: Sequence[Event]) -> list[Violation]:
    out = []
    for (topic, isolation), records in final_reads(events).items():
        first: dict[str, Event] = {}
        for r in records:
            seen = first.setdefault(r["value"], r)
            if seen is not r:
                out.append(Violation("duplicate", "%s written twice in %s: %d@%d and %d@%d (%s)" % (
                    r["value"], topic, seen["partition"], seen["offset"], r["partition"], r["offset"], isolation),
                    (seen, r)))
    return out


# order -------------------------------------------------------------------------------------------
def check_order(events: Sequence[Event]) -> list[Violation]:
    out: list[Violation] = []
    # the final read of each partition
    last: dict[tuple[str, int, str], Event] = {}
    for e in events:
        if e.kind is Kind.FINAL_READ:
            key = (e["topic"], int(e["partition"]), e["isolation"])
            before = last.get(key)
            if before is not None and int(e["offset"]) <= int(before["offset"]):
                out.append(Violation("order", "final read of %s-%d: offset %d after %d" % (
                    key[0], key[1], e["offset"], before["offset"]), (before, e)))
            last[key] = e
    # what one consumer reads of a partition while it owns it (an assignment starts afresh)
    previous: dict[tuple[str, str, int], Event] = {}
    for e in events:
        if e.kind in (Kind.ASSIGN, Kind.REVOKE):
            for p in e["partitions"]:
                previous.pop((e.client, e["topic"], int(p)), None)
        elif e.kind is Kind.READ:
            owner = (e.client, str(e["topic"]), int(e["partition"]))
            before = previous.get(owner)
            if before is not None and int(e["offset"]) <= int(before["offset"]):
                out.append(Violation("order", "%s read %s-%d@%d after @%d without a new assignment" % (
                    e.client, owner[1], owner[2], e["offset"], before["offset"]), (before, e)))
            previous[owner] = e
    # acknowledgements: one record per offset; a producer's records in the order it sent them
    at_offset: dict[tuple[str, int, int], Event] = {}
    sent_at: dict[str, float] = {e["value"]: e.t for e in events if e.kind is Kind.SEND}
    per_producer: dict[tuple[str, str, int], list[Event]] = defaultdict(list)
    for e in events:
        if e.kind is not Kind.ACK:
            continue
        topic, partition = _tp(e)
        other = at_offset.setdefault((topic, partition, int(e["offset"])), e)
        if other is not e and other["value"] != e["value"]:
            out.append(Violation("order", "two records acknowledged at %s-%d@%d: %s and %s" % (
                topic, partition, e["offset"], other["value"], e["value"]), (other, e)))
        per_producer[(e.client, topic, partition)].append(e)
    for (client, topic, partition), acks in per_producer.items():
        acks.sort(key=lambda a: (sent_at.get(a["value"], a.t), a.t))
        for a, b in zip(acks, acks[1:]):
            if int(b["offset"]) <= int(a["offset"]):
                out.append(Violation("order", "%s sent %s before %s to %s-%d, acknowledged at @%d and @%d" % (
                    client, a["value"], b["value"], topic, partition, a["offset"], b["offset"]), (a, b)))
                break
    return out


# reread ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Commit:
    t0: float
    t: float
    offset: int
    ok: bool | None  # None: outcome unknown
    event: Event


def _commits(events: Sequence[Event]) -> dict[tuple[str, str, int], list[_Commit]]:
    found: dict[tuple[str, str, int], list[_Commit]] = defaultdict(list)
    for e in events:
        if e.kind is not Kind.COMMIT:
            continue
        failed = {int(p) for p in (e.get("failed") or {})}
        for p, offset in (e.get("offsets") or {}).items():
            ok = e["ok"] if e["ok"] is not True or int(p) not in failed else False
            found[(e["group"], e["topic"], int(p))].append(_Commit(float(e["t0"]), e.t, int(offset), ok, e))
    return found


def committed_floor(commits: Sequence[_Commit], assigned: float, first_read: float) -> _Commit | None:
    """The lowest commit that may be the group's committed offset when a member assigned at
    `assigned` fetched it (before `first_read`): among commits acknowledged before the
    assignment, those no later acknowledged commit follows in real time, and every commit that
    may have landed meanwhile (in flight, or of unknown outcome and begun before the first read).
    None: nothing certainly committed before the assignment, so no floor."""
    done = [c for c in commits if c.ok is True and c.t < assigned]
    if not done:
        return None
    latest = [c for c in done if not any(d.t0 > c.t for d in done)]
    maybe = [c for c in commits if c.ok is not False and c.t0 < first_read and not (c.ok is True and c.t < assigned)]
    return min(latest + maybe, key=lambda c: c.offset)


def check_reread(events: Sequence[Event]) -> list[Violation]:
    out: list[Violation] = []
    commits = _commits(events)
    # (member, topic, partition) -> the open assignment: (its event, reads since)
    owned: dict[tuple[str, str, int], tuple[Event, list[Event]]] = {}
    intervals: list[tuple[Event, list[Event], tuple[str, str, int]]] = []
    for e in events:
        if e.kind in (Kind.ASSIGN, Kind.REVOKE):
            for p in e["partitions"]:
                key = (e.client, e["topic"], int(p))
                if key in owned:
                    intervals.append((*owned.pop(key), key))
                if e.kind is Kind.ASSIGN:
                    owned[key] = (e, [])
        elif e.kind is Kind.READ and e.get("group") is not None:
            key = (e.client, e["topic"], int(e["partition"]))
            if key in owned:
                owned[key][1].append(e)
    intervals.extend((assign, reads, key) for key, (assign, reads) in owned.items())
    for assign, reads, (member, topic, partition) in intervals:
        if not reads:
            continue
        floor = committed_floor(commits.get((assign["group"], topic, partition), []), assign.t, reads[0].t)
        if floor is None:
            continue
        below = [r for r in reads if int(r["offset"]) < floor.offset]
        if below:
            out.append(Violation("reread", "%s (group %s) was assigned %s-%d after offset %d was committed, "
                                 "and read @%d" % (member, assign["group"], topic, partition, floor.offset,
                                                   below[0]["offset"]), (floor.event, assign, below[0])))
    return out


# read_committed ----------------------------------------------------------------------------------
def check_aborted_read(events: Sequence[Event]) -> list[Violation]:
    out = []
    committed = {e["txn"]: e for e in events if e.kind is Kind.TXN_COMMIT}
    aborted = {e["txn"]: e for e in events if e.kind is Kind.TXN_ABORT}
    for txn in sorted(committed.keys() & aborted.keys()):
        out.append(Violation("aborted_read", "transaction %s was both committed and aborted" % txn,
                             (committed[txn], aborted[txn])))
    doomed = {e["value"]: e["txn"] for e in events
              if e.kind is Kind.SEND and e.get("txn") in aborted and e.get("txn") not in committed}
    for e in events:
        if e.kind in (Kind.READ, Kind.FINAL_READ) and e.get("isolation") == READ_COMMITTED and e["value"] in doomed:
            txn = doomed[e["value"]]
            out.append(Violation("aborted_read", "%s read %s of aborted transaction %s under read_committed" % (
                e.client, e["value"], txn), (aborted[txn], e)))
    return out


# share groups ------------------------------------------------------------------------------------
def _share_records(events: Sequence[Event]) -> tuple[dict[Any, list[Event]], dict[Any, list[Event]]]:
    """(group, topic, partition, offset) -> deliveries, and -> acknowledgements naming it."""
    deliveries: dict[Any, list[Event]] = defaultdict(list)
    acks: dict[Any, list[Event]] = defaultdict(list)
    for e in events:
        if e.kind is Kind.SHARE_DELIVER:
            deliveries[(e["group"], e["topic"], int(e["partition"]), int(e["offset"]))].append(e)
        elif e.kind is Kind.SHARE_ACK:
            for offset in e["offsets"]:
                acks[(e["group"], e["topic"], int(e["partition"]), int(offset))].append(e)
    return deliveries, acks


def check_share(events: Sequence[Event]) -> list[Violation]:
    out = []
    deliveries, acks = _share_records(events)
    for record, confirmed in acks.items():
        group, topic, partition, offset = record
        delivered = deliveries.get(record, [])
        for ack in confirmed:
            if ack["ok"] is not True:
                continue
            if ack["ack_type"] in ARCHIVING_ACKS:
                later = [d for d in delivered if float(d["t0"]) > ack.t]
                if later:
                    out.append(Violation("share_after_ack", "%s-%d@%d (group %s) delivered to %s after %s's %s "
                                         "was confirmed" % (topic, partition, offset, group, later[0].client,
                                                            ack.client, ack["ack_type"]), (ack, later[0])))
            # the delivery this acknowledgement answers: the member's last one before it
            own = [d for d in delivered if d.client == ack.client and d.t <= float(ack["t0"])]
            if not own:
                continue
            mine = own[-1]
            stolen = [d for d in delivered if d.client != ack.client and mine.t < d.t < float(ack["t0"])]
            if stolen:
                out.append(Violation("share_overlap", "%s-%d@%d (group %s) delivered to %s, then to %s, and "
                                     "%s's acknowledgement sent after that was accepted" % (
                                         topic, partition, offset, group, ack.client, stolen[0].client, ack.client),
                                     (mine, stolen[0], ack)))
    return out


# replicas ----------------------------------------------------------------------------------------
def check_replicas(events: Sequence[Event]) -> list[Violation]:
    out = []
    replicas: dict[tuple[str, int], list[Event]] = defaultdict(list)
    for e in events:
        if e.kind is Kind.REPLICA_LOG:
            replicas[_tp(e)].append(e)
    for (topic, partition), logs in sorted(replicas.items()):
        for i, a in enumerate(logs):
            for b in logs[i + 1:]:
                lo, hi = max(int(a["start"]), int(b["start"])), min(int(a["end"]), int(b["end"]))
                mine = [tuple(x) for x in a["batches"] if lo <= int(x[0]) < hi]
                theirs = [tuple(x) for x in b["batches"] if lo <= int(x[0]) < hi]
                if mine != theirs:
                    at = next((i for i, (x, y) in enumerate(zip(mine, theirs)) if x != y), min(len(mine), len(theirs)))
                    offset = (mine if at < len(mine) else theirs)[at][0]
                    out.append(Violation("replica_divergence", "%s-%d: nodes %s and %s disagree at offset %s "
                                         "(both hold [%d, %d))" % (topic, partition, a["node"], b["node"], offset,
                                                                   lo, hi), (a, b)))
    return out


CHECKS: dict[str, Callable[[Sequence[Event]], list[Violation]]] = {
    "lost": check_lost,
    "duplicate": check_duplicate,
    "order": check_order,
    "reread": check_reread,
    "aborted_read": check_aborted_read,
    "share": check_share,
    "replicas": check_replicas,
}


def check(events: Iterable[Event]) -> list[Violation]:
    """Every check over the history (sorted by time first), violations in time order."""
    ordered = sorted(events, key=lambda e: e.t)
    found = [v for run in CHECKS.values() for v in run(ordered)]
    return sorted(found, key=lambda v: v.at)


def summary(events: Sequence[Event]) -> dict[str, int]:
    """What the history holds, by kind (and acknowledged records): how much the run exercised."""
    counts: dict[str, int] = defaultdict(int)
    for e in events:
        counts[str(e.kind)] += 1
    counts["acknowledged"] = len(acknowledged(events))
    return dict(sorted(counts.items()))
