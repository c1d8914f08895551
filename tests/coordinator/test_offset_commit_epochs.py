"""OffsetCommit's epoch rule of Kafka 4.3 (KIP-1251) for consumer-protocol members: a commit with
the member's epoch passes; with an older one, each partition passes if the member held it at
that epoch already (a commit from the revocation callback, or one in flight while a heartbeat
moved the member on) and fails with STALE_MEMBER_EPOCH otherwise; a newer epoch fails the whole
request. The epochs partitions were given at survive a reload."""

from __future__ import annotations

from protocol.errors import ErrorCode
from tests.coordinator.consumer_harness import Client, ConsumerHarness

E = ErrorCode


def test_commits_across_a_revocation() -> None:
    h = ConsumerHarness()
    t = h.topic("t", 4)
    a = Client(h, "a", ["t"])
    a.poll()
    assert (a.epoch, sorted(p for _, p in a.partitions())) == (1, [0, 1, 2, 3])
    b = Client(h, "b", ["t"])
    b.poll()  # b joins: a must give up two partitions, b waits for them
    a.poll()  # a is told to revoke: it stays at epoch 1 meanwhile
    kept = {p for _, p in a.partitions()}
    revoked = {0, 1, 2, 3} - kept
    assert a.epoch == 1 and len(kept) == 2
    # the revocation callback commits every partition it still owns, at epoch 1: all accepted
    assert set(h.commit9("g", "a", 1, {("t", p): 10 for p in range(4)}).values()) == {0}
    a.poll()  # acknowledges: a moves to the group's epoch
    assert a.epoch == 2
    # a commit sent before that heartbeat's answer carries epoch 1: accepted for what a kept,
    # refused for what it gave up
    got = h.commit9("g", "a", 1, {("t", p): 11 for p in range(4)})
    assert {p for (_, p), code in got.items() if code == 0} == kept
    assert {p for (_, p), code in got.items() if code == E.STALE_MEMBER_EPOCH} == revoked
    # a newer epoch than the member's fails the whole request
    assert set(h.commit9("g", "a", 3, {("t", p): 12 for p in kept}).values()) == {E.STALE_MEMBER_EPOCH}
    # b was given its partitions at epoch 2: a commit of b at an older epoch is refused for them
    b.poll()
    assert b.epoch == 2 and {p for _, p in b.partitions()} == revoked
    assert set(h.commit9("g", "b", 1, {("t", p): 5 for p in revoked}).values()) == {E.STALE_MEMBER_EPOCH}
    assert set(h.commit9("g", "b", 2, {("t", p): 5 for p in revoked}).values()) == {0}
    # the epochs partitions were given at are kept in the records
    member = h.group().members["a"]
    epochs = dict(member.assignment_epochs[t])
    assert set(epochs) == kept and set(epochs.values()) == {1}
    reloaded = h.reload()
    assert reloaded.group().members["a"].assignment_epochs == member.assignment_epochs
    assert {p for (_, p), code in reloaded.commit9("g", "a", 1, {("t", p): 13 for p in range(4)}).items()
            if code == 0} == kept


def test_a_partition_given_later_needs_the_later_epoch() -> None:
    h = ConsumerHarness()
    h.topic("t", 2)
    a = Client(h, "a", ["t"])
    a.poll()
    h.topic("t", 3)  # a third partition: the group moves to a new epoch and gives it to a
    a.poll()
    assert a.epoch == 2 and len(a.partitions()) == 3
    got = h.commit9("g", "a", 1, {("t", 0): 1, ("t", 2): 1})
    assert got == {("t", 0): 0, ("t", 2): E.STALE_MEMBER_EPOCH}
    assert h.commit9("g", "a", 2, {("t", 2): 1}) == {("t", 2): 0}
