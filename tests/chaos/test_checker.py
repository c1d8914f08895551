"""The checker on hand-made histories: for each rule a history a correct broker could produce
(no violation) and one that breaks it (the rule's violation, and only it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.chaos.checker import check, summary
from tests.chaos.history import Event, History, Kind, load

T = "t"  # the topic of every hand-made history


def ev(t: float, kind: Kind, client: str, **data: Any) -> Event:
    return Event(float(t), kind, client, data)


def send(t: float, client: str, value: str, partition: int = 0, txn: str | None = None) -> Event:
    return ev(t, Kind.SEND, client, topic=T, partition=partition, value=value, txn=txn)


def ack(t: float, client: str, value: str, offset: int, partition: int = 0, txn: str | None = None) -> Event:
    return ev(t, Kind.ACK, client, topic=T, partition=partition, offset=offset, value=value, txn=txn)


def final(t: float, value: str, offset: int, partition: int = 0, isolation: str = "read_uncommitted") -> Event:
    return ev(t, Kind.FINAL_READ, "final", topic=T, partition=partition, offset=offset, value=value,
              isolation=isolation)


def end(t: float, position: int, partition: int = 0, isolation: str = "read_uncommitted",
        high_watermark: int | None = None) -> Event:
    hw = position if high_watermark is None else high_watermark
    return ev(t, Kind.FINAL_END, "final", topic=T, partition=partition, isolation=isolation, position=position,
              high_watermark=hw, complete=position >= hw)


def read(t: float, client: str, offset: int, value: str, group: str = "g", partition: int = 0,
         isolation: str = "read_committed") -> Event:
    return ev(t, Kind.READ, client, group=group, topic=T, partition=partition, offset=offset, value=value,
              isolation=isolation)


def assign(t: float, client: str, partitions: list[int], group: str = "g") -> Event:
    return ev(t, Kind.ASSIGN, client, group=group, topic=T, partitions=partitions)


def revoke(t: float, client: str, partitions: list[int], group: str = "g") -> Event:
    return ev(t, Kind.REVOKE, client, group=group, topic=T, partitions=partitions)


def commit(t0: float, t: float, client: str, offsets: dict[int, int], ok: bool | None = True,
           group: str = "g") -> Event:
    return ev(t, Kind.COMMIT, client, group=group, topic=T, offsets=offsets, failed={}, t0=t0, ok=ok)


def deliver(t0: float, t: float, client: str, offset: int, group: str = "s") -> Event:
    return ev(t, Kind.SHARE_DELIVER, client, group=group, topic=T, partition=0, offset=offset,
              value="v%d" % offset, delivery_count=1, t0=t0)


def share_ack(t0: float, t: float, client: str, offsets: list[int], ok: bool | None = True,
              ack_type: str = "accept", group: str = "s") -> Event:
    return ev(t, Kind.SHARE_ACK, client, group=group, topic=T, partition=0, offsets=offsets, ack_type=ack_type,
              t0=t0, ok=ok, error=None)


def replica(node: int, start: int, end_: int, batches: list[list[Any]]) -> Event:
    return ev(100.0, Kind.REPLICA_LOG, "runner", node=node, topic=T, partition=0, start=start, end=end_,
              batches=batches)


def checks(events: list[Event]) -> list[str]:
    return [v.check for v in check(events)]


def produced(*values: str) -> list[Event]:
    """Each value sent, acknowledged at its index, and in the final read."""
    out: list[Event] = []
    for i, value in enumerate(values):
        out += [send(i, "p", value), ack(i + 0.5, "p", value, i), final(50 + i, value, i)]
    return out + [end(60, len(values))]


# lost -------------------------------------------------------------------------------------------
def test_every_acknowledged_record_read_at_the_end_passes() -> None:
    assert check(produced("a", "b", "c")) == []


def test_an_acknowledged_record_missing_from_the_final_read_is_lost() -> None:
    events = [send(1, "p", "a"), ack(2, "p", "a", 0), send(3, "p", "b"), ack(4, "p", "b", 1),
              final(10, "a", 0), end(11, 1)]
    found = check(events)
    assert [v.check for v in found] == ["lost"]
    assert "b" in found[0].message


def test_a_record_sent_but_never_acknowledged_may_be_missing() -> None:
    events = [send(1, "p", "a"), ack(2, "p", "a", 0), send(3, "p", "b"),
              ev(4, Kind.SEND_FAIL, "p", topic=T, partition=0, value="b", error="_MSG_TIMED_OUT", txn=None),
              final(10, "a", 0), end(11, 1)]
    assert check(events) == []


def test_an_acknowledged_record_found_at_another_offset_is_lost() -> None:
    events = [send(1, "p", "a"), ack(2, "p", "a", 0), final(10, "x", 0), final(10.1, "a", 1), end(11, 2)]
    assert checks(events) == ["lost"]


def test_a_final_read_short_of_the_high_watermark_cannot_be_judged() -> None:
    events = [send(1, "p", "a"), ack(2, "p", "a", 0), end(11, 0, high_watermark=1)]
    assert "lost" in checks(events)


def test_records_of_a_committed_transaction_must_be_read() -> None:
    events = [ev(1, Kind.TXN_BEGIN, "x", txn="x-1", t0=1), send(2, "x", "a", txn="x-1"),
              ev(3, Kind.TXN_COMMIT, "x", txn="x-1", t0=2.5),
              end(10, 2, isolation="read_committed")]
    assert checks(events) == ["lost"]
    events.insert(3, final(9, "a", 0, isolation="read_committed"))
    assert check(events) == []


# duplicate --------------------------------------------------------------------------------------
def test_a_value_written_twice_is_a_duplicate() -> None:
    events = produced("a", "b") + [final(53, "a", 2)]
    assert checks(events) == ["duplicate"]


# order ------------------------------------------------------------------------------------------
def test_two_records_acknowledged_at_one_offset_break_order() -> None:
    events = [send(1, "p", "a"), ack(2, "p", "a", 0), send(3, "q", "b"), ack(4, "q", "b", 0),
              final(10, "a", 0), end(11, 1)]
    assert "order" in checks(events)


def test_a_producers_records_acknowledged_out_of_send_order_break_order() -> None:
    events = [send(1, "p", "a"), send(2, "p", "b"), ack(3, "p", "b", 0), ack(4, "p", "a", 1),
              final(10, "b", 0), final(10.1, "a", 1), end(11, 2)]
    assert checks(events) == ["order"]


def test_a_consumer_reading_backwards_without_a_new_assignment_breaks_order() -> None:
    ok = [assign(1, "c", [0]), read(2, "c", 0, "a"), read(3, "c", 1, "b"), revoke(4, "c", [0]),
          assign(5, "c", [0]), read(6, "c", 0, "a")]
    assert check(ok) == []
    broken = [assign(1, "c", [0]), read(2, "c", 0, "a"), read(3, "c", 1, "b"), read(4, "c", 1, "b")]
    assert checks(broken) == ["order"]


def test_a_final_read_out_of_order_breaks_order() -> None:
    events = [final(1, "a", 1), final(2, "b", 0), end(3, 2)]
    assert checks(events) == ["order"]


# reread -----------------------------------------------------------------------------------------
def test_a_member_resuming_from_the_committed_offset_passes() -> None:
    events = [assign(1, "c1", [0]), read(2, "c1", 0, "a"), read(3, "c1", 1, "b"), commit(4, 5, "c1", {0: 2}),
              revoke(6, "c1", [0]), assign(7, "c2", [0]), read(8, "c2", 2, "c")]
    assert check(events) == []


def test_reading_below_an_acknowledged_commit_is_a_reread() -> None:
    events = [assign(1, "c1", [0]), read(2, "c1", 0, "a"), read(3, "c1", 1, "b"), commit(4, 5, "c1", {0: 2}),
              revoke(6, "c1", [0]), assign(7, "c2", [0]), read(8, "c2", 1, "b")]
    found = check(events)
    assert [v.check for v in found] == ["reread"]
    assert "offset 2" in found[0].message


def test_a_failed_or_later_commit_is_no_floor() -> None:
    failed = [assign(1, "c1", [0]), read(2, "c1", 0, "a"), commit(4, 5, "c1", {0: 1}, ok=False),
              revoke(6, "c1", [0]), assign(7, "c2", [0]), read(8, "c2", 0, "a")]
    assert check(failed) == []
    after_assign = [assign(1, "c1", [0]), read(2, "c1", 0, "a"), commit(4, 7.5, "c1", {0: 1}),
                    assign(7, "c2", [0]), read(8, "c2", 0, "a")]
    assert check(after_assign) == []


def test_a_lower_commit_of_unknown_outcome_may_have_landed() -> None:
    # c1 committed 3 (acknowledged), then a commit of 1 timed out: it may have landed after
    events = [assign(1, "c1", [0]), commit(2, 3, "c1", {0: 3}), commit(4, 6, "c3", {0: 1}, ok=None),
              revoke(6.5, "c1", [0]), assign(7, "c2", [0]), read(8, "c2", 1, "b")]
    assert check(events) == []


# aborted_read -----------------------------------------------------------------------------------
def txn(name: str, t: float, outcome: Kind, *values: str) -> list[Event]:
    out = [ev(t, Kind.TXN_BEGIN, "x", txn=name, t0=t)]
    out += [send(t + 0.1 * (i + 1), "x", v, txn=name) for i, v in enumerate(values)]
    return out + [ev(t + 1, outcome, "x", txn=name, t0=t + 0.9)]


def test_a_read_committed_consumer_seeing_an_aborted_record_breaks_isolation() -> None:
    events = txn("x-1", 1, Kind.TXN_ABORT, "a") + txn("x-2", 3, Kind.TXN_COMMIT, "b")
    events += [assign(5, "c", [0]), read(6, "c", 1, "b")]
    events += [final(7, "b", 1, isolation="read_committed"), end(8, 2, isolation="read_committed")]
    assert check(events) == []
    seen = events + [read(6.5, "c", 2, "a")]
    assert checks(seen) == ["aborted_read"]
    uncommitted = events + [read(6.5, "c", 2, "a", isolation="read_uncommitted")]
    assert check(uncommitted) == []


def test_a_transaction_both_committed_and_aborted_breaks_isolation() -> None:
    events = txn("x-1", 1, Kind.TXN_ABORT) + [ev(3, Kind.TXN_COMMIT, "x", txn="x-1", t0=2.5)]
    assert checks(events) == ["aborted_read"]


# share groups -----------------------------------------------------------------------------------
def test_share_members_taking_turns_pass() -> None:
    # m1's lock ran out, m2 got the record, m1's late acknowledgement was refused
    events = [deliver(1, 2, "m1", 0), deliver(5, 6, "m2", 0), share_ack(7, 8, "m1", [0], ok=False),
              share_ack(9, 10, "m2", [0])]
    assert check(events) == []


def test_two_share_members_holding_one_record_overlap() -> None:
    events = [deliver(1, 2, "m1", 0), deliver(5, 6, "m2", 0), share_ack(7, 8, "m1", [0], ok=True)]
    found = check(events)
    assert [v.check for v in found] == ["share_overlap"]


def test_an_accepted_record_delivered_again_breaks_share() -> None:
    ok = [deliver(1, 2, "m1", 0), share_ack(3, 4, "m1", [0], ack_type="release"), deliver(5, 6, "m2", 0)]
    assert check(ok) == []
    broken = [deliver(1, 2, "m1", 0), share_ack(3, 4, "m1", [0]), deliver(5, 6, "m2", 0)]
    assert checks(broken) == ["share_after_ack"]


# replicas ---------------------------------------------------------------------------------------
def test_replicas_agreeing_where_both_hold_records_pass() -> None:
    events = [replica(1, 0, 3, [[0, 1, "aa"], [2, 2, "bb"]]), replica(2, 0, 2, [[0, 1, "aa"]]),
              replica(3, 2, 3, [[2, 2, "bb"]])]
    assert check(events) == []


def test_replicas_holding_different_batches_at_an_offset_diverge() -> None:
    events = [replica(1, 0, 3, [[0, 1, "aa"], [2, 2, "bb"]]), replica(2, 0, 3, [[0, 1, "aa"], [2, 2, "cc"]])]
    found = check(events)
    assert [v.check for v in found] == ["replica_divergence"]
    assert "offset 2" in found[0].message


# the history file -------------------------------------------------------------------------------
def test_history_round_trips_through_its_file(tmp_path: Path) -> None:
    path = tmp_path / "history.jsonl"
    history = History(path)
    events = produced("a", "b")
    history.extend(reversed(events))
    history.close()
    with open(path, "a") as f:
        f.write('{"t": 1, "kind": "ack", "cli')  # a line cut short by a crash
    back = load(path)
    assert [e.to_json() for e in back] == [e.to_json() for e in sorted(events, key=lambda e: e.t)]
    assert summary(back)["acknowledged"] == 2
