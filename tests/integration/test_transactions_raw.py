"""Transactions with raw frames against an in-process broker: every version of the transaction
APIs, read_committed fetches, ListOffsets at the LSO, and bad input answered with Kafka's codes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient, wait_for
from tests.integration.test_server_support import (
    PRODUCE,
    BrokerThread,
    batch,
    fetch_one,
    list_offset,
    produce_request,
)

E = ErrorCode
INIT_PRODUCER_ID, ADD_PARTITIONS, END_TXN, DESCRIBE_TXNS, LIST_TXNS, FIND_COORDINATOR = 22, 24, 26, 65, 66, 10
READ_COMMITTED = 1


@pytest.fixture(scope="module")
def bt(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerThread]:
    with BrokerThread(Path(tmp_path_factory.mktemp("txn")), **{"transaction.state.log.num.partitions": "3"}) as b:
        yield b


@pytest.fixture
def c(bt: BrokerThread) -> Iterator[RawClient]:
    with bt.client() as client:
        yield client


def init(c: RawClient, tid: str | None, version: int = 4, timeout_ms: int = 60000, pid: int = -1,
         epoch: int = -1) -> Any:
    return c.call(INIT_PRODUCER_ID, version, M.InitProducerIdRequest(
        transactional_id=tid, transaction_timeout_ms=timeout_ms, producer_id=pid, producer_epoch=epoch))


def add(c: RawClient, tid: str, pid: int, epoch: int, partitions: dict[str, list[int]], version: int = 3) -> Any:
    R = M.AddPartitionsToTxnRequest
    topics = [R.AddPartitionsToTxnTopic(name=t, partitions=ps) for t, ps in partitions.items()]
    if version < 4:
        request = R(v3_and_below_transactional_id=tid, v3_and_below_producer_id=pid,
                    v3_and_below_producer_epoch=epoch, v3_and_below_topics=topics)
    else:
        request = R(transactions=[R.AddPartitionsToTxnTransaction(
            transactional_id=tid, producer_id=pid, producer_epoch=epoch, verify_only=True, topics=topics)])
    return c.call(ADD_PARTITIONS, version, request)


def add_errors(response: Any) -> dict[tuple[str, int], int]:
    topics = response.results_by_topic_v3_and_below if response.results_by_topic_v3_and_below else [
        t for r in response.results_by_transaction for t in r.topic_results]
    return {(t.name, p.partition_index): p.partition_error_code for t in topics for p in t.results_by_partition}


def end(c: RawClient, tid: str, pid: int, epoch: int, committed: bool, version: int = 3) -> Any:
    return c.call(END_TXN, version, M.EndTxnRequest(transactional_id=tid, producer_id=pid, producer_epoch=epoch,
                                                   committed=committed))


def txn_produce(c: RawClient, topic: str, partition: int, tid: str | None, pid: int, epoch: int, seq: int,
                values: list[bytes], version: int = 9) -> Any:
    records = batch(values, producer_id=pid, producer_epoch=epoch, base_sequence=seq, is_transactional=True)
    response = c.call(PRODUCE, version, produce_request(topic, partition, records, transactional_id=tid))
    return response.responses[0].partition_responses[0]


def data_values(part: Any) -> list[bytes | None]:
    """The values of the data records fetched (markers are control records, not data)."""
    from protocol.records import decode_batch, iter_batches

    raw = bytes(part.records)
    return [r.value for pos, h in iter_batches(raw) if not h.is_control for r in decode_batch(raw, pos)[1]]


def begin(c: RawClient, tid: str, topic: str, partitions: list[int] | None = None) -> tuple[int, int]:
    r = init(c, tid)
    assert r.error_code == 0, r
    assert set(add_errors(add(c, tid, r.producer_id, r.producer_epoch, {topic: partitions or [0]})).values()) == {0}
    return r.producer_id, r.producer_epoch


@pytest.mark.parametrize("version", range(0, 6))
def test_init_producer_id_with_a_transactional_id_at_every_version(c: RawClient, version: int) -> None:
    r = init(c, "init-%d" % version, version)
    assert (r.error_code, r.producer_epoch) == (0, 0) and r.producer_id >= 0
    assert init(c, "init-%d" % version, version).producer_epoch == 1
    assert init(c, "init-x", version, timeout_ms=900001).error_code == E.INVALID_TRANSACTION_TIMEOUT
    if version >= 3:
        assert init(c, "init-x", version, pid=5).error_code == E.INVALID_REQUEST  # an id without an epoch


def test_find_coordinator_for_a_transactional_id(c: RawClient) -> None:
    r = c.call(FIND_COORDINATOR, 2, M.FindCoordinatorRequest(key="tx", key_type=1))
    assert r.error_code == 0 and r.port > 0


@pytest.mark.parametrize("add_version, end_version", [(0, 0), (1, 1), (2, 2), (3, 3), (3, 4)])
def test_commit_and_abort(bt: BrokerThread, c: RawClient, add_version: int, end_version: int) -> None:
    topic = "ca-%d-%d" % (add_version, end_version)
    bt.create_topic(topic, 2)
    tid = "tx-" + topic
    r = init(c, tid)
    pid, epoch = r.producer_id, r.producer_epoch
    assert add_errors(add(c, tid, pid, epoch, {topic: [0, 1]}, add_version)) == {(topic, 0): 0, (topic, 1): 0}
    assert txn_produce(c, topic, 0, tid, pid, epoch, 0, [b"c0", b"c1"]).error_code == 0
    assert txn_produce(c, topic, 1, tid, pid, epoch, 0, [b"c2"]).error_code == 0
    # open: read_committed sees nothing, ListOffsets latest is the LSO
    assert fetch_one(c, topic, 0, 0, isolation_level=READ_COMMITTED).last_stable_offset == 0
    assert list_offset(c, topic, 0, -1, isolation_level=READ_COMMITTED).offset == 0
    assert list_offset(c, topic, 0, -1).offset == 2
    assert end(c, tid, pid, epoch, True, end_version).error_code == 0
    part = fetch_one(c, topic, 0, 0, isolation_level=READ_COMMITTED)
    assert part.last_stable_offset == part.high_watermark == 3  # the marker is offset 2
    assert data_values(part) == [b"c0", b"c1"]
    assert part.aborted_transactions == []
    # an aborted transaction: its data is seen only with read_uncommitted, and announced
    assert add_errors(add(c, tid, pid, epoch, {topic: [0]}, add_version)) == {(topic, 0): 0}
    assert txn_produce(c, topic, 0, tid, pid, epoch, 2, [b"a0"]).error_code == 0
    assert end(c, tid, pid, epoch, False, end_version).error_code == 0
    part = fetch_one(c, topic, 0, 0, isolation_level=READ_COMMITTED)
    assert part.high_watermark == part.last_stable_offset == 5
    assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [(pid, 3)]
    assert fetch_one(c, topic, 0, 0).aborted_transactions is None  # read_uncommitted: null


def test_requests_pipelined_behind_end_txn_find_it_complete(bt: BrokerThread, c: RawClient) -> None:
    """EndTxn is answered before the Complete* record is written (as Kafka answers once the
    Prepare* record is durable), with the markers already in the logs and the Complete* record
    queued first: requests sent right behind it, on the same connection, find the transaction
    complete (no CONCURRENT_TRANSACTIONS for the next transaction) and its records committed."""
    bt.create_topic("behind", 1)
    pid, epoch = begin(c, "behind", "behind")
    assert txn_produce(c, "behind", 0, "behind", pid, epoch, 0, [b"b0", b"b1"]).error_code == 0
    R = M.AddPartitionsToTxnRequest
    sent = []
    for i in range(3):
        c.send(END_TXN, 3, M.EndTxnRequest(transactional_id="behind", producer_id=pid, producer_epoch=epoch,
                                           committed=i % 2 == 0))
        sent.append((END_TXN, c.correlation_id))
        c.send(ADD_PARTITIONS, 3, R(v3_and_below_transactional_id="behind", v3_and_below_producer_id=pid,
                                    v3_and_below_producer_epoch=epoch,
                                    v3_and_below_topics=[R.AddPartitionsToTxnTopic(name="behind", partitions=[0])]))
        sent.append((ADD_PARTITIONS, c.correlation_id))
    c.send(DESCRIBE_TXNS, 0, M.DescribeTransactionsRequest(transactional_ids=["behind"]))
    sent.append((DESCRIBE_TXNS, c.correlation_id))
    answers = [c.receive(api, 3 if api != DESCRIBE_TXNS else 0, correlation_id) for api, correlation_id in sent]
    assert [a.error_code for a in answers[:-1:2]] == [0, 0, 0]  # EndTxn: commit, abort, commit
    assert [add_errors(a) for a in answers[1:-1:2]] == [{("behind", 0): 0}] * 3
    (state,) = answers[-1].transaction_states
    assert (state.transaction_state, [t.partitions for t in state.topics]) == ("Ongoing", [[0]])
    part = fetch_one(c, "behind", 0, 0, isolation_level=READ_COMMITTED)
    assert data_values(part) == [b"b0", b"b1"]
    assert part.last_stable_offset == part.high_watermark == 5  # two records, three markers
    assert end(c, "behind", pid, epoch, False).error_code == 0


def test_end_txn_without_a_transaction(c: RawClient) -> None:
    r = init(c, "no-txn")
    assert end(c, "no-txn", r.producer_id, r.producer_epoch, True).error_code == E.INVALID_TXN_STATE
    assert end(c, "unknown-txn", r.producer_id, 0, True).error_code == E.INVALID_PRODUCER_ID_MAPPING
    assert end(c, "no-txn", r.producer_id, 5, True, version=1).error_code == E.INVALID_PRODUCER_EPOCH
    assert end(c, "no-txn", r.producer_id, 5, True, version=2).error_code == E.PRODUCER_FENCED


def test_add_partitions_errors(bt: BrokerThread, c: RawClient) -> None:
    bt.create_topic("ape", 1)
    r = init(c, "ape")
    pid, epoch = r.producer_id, r.producer_epoch
    assert add_errors(add(c, "ape", pid, epoch + 1, {"ape": [0]}, 1)) == {("ape", 0): E.INVALID_PRODUCER_EPOCH}
    assert add_errors(add(c, "ape", pid, epoch + 1, {"ape": [0]}, 2)) == {("ape", 0): E.PRODUCER_FENCED}
    assert add_errors(add(c, "ape", pid, epoch, {"ape": [0, 3], "nope": [0]})) == {
        ("ape", 0): E.OPERATION_NOT_ATTEMPTED, ("ape", 3): E.UNKNOWN_TOPIC_OR_PARTITION,
        ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert add_errors(add(c, "ape", pid + 1, epoch, {"ape": [0]})) == {("ape", 0): E.INVALID_PRODUCER_ID_MAPPING}
    # a broker's verification (v4+, VerifyOnly)
    assert add_errors(add(c, "ape", pid, epoch, {"ape": [0]}, 4)) == {("ape", 0): E.TRANSACTION_ABORTABLE}


def test_transactional_produce_to_a_partition_not_added(bt: BrokerThread, c: RawClient) -> None:
    bt.create_topic("notadded", 2)
    pid, epoch = begin(c, "notadded", "notadded", [0])
    part = txn_produce(c, "notadded", 1, "notadded", pid, epoch, 0, [b"x"])
    assert part.error_code == E.INVALID_TXN_STATE
    part = txn_produce(c, "notadded", 1, "notadded", pid, epoch, 0, [b"x"], version=11)
    assert part.error_code == E.TRANSACTION_ABORTABLE
    assert fetch_one(c, "notadded", 1, 0).high_watermark == 0  # nothing written
    # transactional records without a transactional id: the whole request is refused
    part = txn_produce(c, "notadded", 0, None, pid, epoch, 0, [b"x"])
    assert part.error_code == E.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    # a stale epoch
    assert txn_produce(c, "notadded", 0, "notadded", pid, epoch + 1, 0, [b"x"]).error_code == \
        E.INVALID_PRODUCER_EPOCH
    assert fetch_one(c, "notadded", 0, 0).high_watermark == 0


def test_zombie_fencing(bt: BrokerThread, c: RawClient) -> None:
    bt.create_topic("zombie", 1)
    pid, epoch = begin(c, "zombie", "zombie")
    assert txn_produce(c, "zombie", 0, "zombie", pid, epoch, 0, [b"z"]).error_code == 0
    first = init(c, "zombie")
    assert first.error_code == E.CONCURRENT_TRANSACTIONS  # its transaction is being aborted
    second = wait_for(lambda: (r := init(c, "zombie")).error_code == 0 and r, what="the new producer")
    assert second.producer_id == pid and second.producer_epoch > epoch + 1
    # the zombie can neither write nor end
    assert txn_produce(c, "zombie", 0, "zombie", pid, epoch, 1, [b"late"]).error_code == E.INVALID_PRODUCER_EPOCH
    assert end(c, "zombie", pid, epoch, True).error_code == E.PRODUCER_FENCED
    part = fetch_one(c, "zombie", 0, 0, isolation_level=READ_COMMITTED)
    assert [t.first_offset for t in part.aborted_transactions] == [0]
    assert part.last_stable_offset == part.high_watermark == 2


def test_transactions_v2(bt: BrokerThread, c: RawClient) -> None:
    """Produce v12 adds the partition itself; EndTxn v5 bumps the epoch and answers it."""
    bt.create_topic("tv2", 1)
    r = init(c, "tv2", version=5)
    pid, epoch = r.producer_id, r.producer_epoch
    assert txn_produce(c, "tv2", 0, "tv2", pid, epoch, 0, [b"v1"], version=12).error_code == 0
    done = end(c, "tv2", pid, epoch, True, version=5)
    assert (done.error_code, done.producer_id, done.producer_epoch) == (0, pid, epoch + 1)
    # the next transaction with the new epoch, from sequence 0
    assert txn_produce(c, "tv2", 0, "tv2", pid, epoch + 1, 0, [b"v2"], version=12).error_code == 0
    # the old epoch is fenced
    assert txn_produce(c, "tv2", 0, "tv2", pid, epoch, 1, [b"old"], version=12).error_code == \
        E.INVALID_PRODUCER_EPOCH
    done = end(c, "tv2", pid, epoch + 1, False, version=5)
    assert (done.error_code, done.producer_epoch) == (0, epoch + 2)
    retry = end(c, "tv2", pid, epoch + 1, False, version=5)  # a retry of that end
    assert (retry.error_code, retry.producer_epoch) == (0, epoch + 2)
    part = fetch_one(c, "tv2", 0, 0, isolation_level=READ_COMMITTED)
    # the data below the LSO, with the aborted transaction announced for the client to skip
    assert data_values(part) == [b"v1", b"v2"]
    assert [(t.producer_id, t.first_offset) for t in part.aborted_transactions] == [(pid, 2)]


def test_transactions_v2_first_batch_starts_at_sequence_0(bt: BrokerThread, c: RawClient) -> None:
    """KIP-890: a producer without state in the partition must start at 0 (a lost first batch
    cannot leave a transaction hanging); v11 (transactions v1) keeps the old leniency."""
    bt.create_topic("tv2seq", 1)
    r = init(c, "tv2seq", version=5)
    pid, epoch = r.producer_id, r.producer_epoch
    refused = txn_produce(c, "tv2seq", 0, "tv2seq", pid, epoch, 3, [b"late"], version=12)
    assert refused.error_code == E.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert refused.error_message.endswith("Expected sequence 0 for transactions v2 idempotent producer with no "
                                          "existing state.")
    assert txn_produce(c, "tv2seq", 0, "tv2seq", pid, epoch, 0, [b"first"], version=12).error_code == 0
    assert end(c, "tv2seq", pid, epoch, True, version=5).error_code == 0


def test_describe_and_list_transactions(bt: BrokerThread, c: RawClient) -> None:
    bt.create_topic("dl", 2)
    pid, epoch = begin(c, "dl-open", "dl", [0, 1])
    init(c, "dl-empty")
    R = M.DescribeTransactionsRequest
    states = c.call(DESCRIBE_TXNS, 0, R(transactional_ids=["dl-open", "dl-empty", "dl-none", ""])).transaction_states
    by_id = {s.transactional_id: s for s in states}
    s = by_id["dl-open"]
    assert (s.error_code, s.transaction_state, s.producer_id, s.producer_epoch) == (0, "Ongoing", pid, epoch)
    assert [(t.topic, sorted(t.partitions)) for t in s.topics] == [("dl", [0, 1])]
    assert s.transaction_timeout_ms == 60000 and s.transaction_start_time_ms > 0
    assert by_id["dl-empty"].transaction_state == "Empty"
    assert by_id["dl-none"].error_code == E.TRANSACTIONAL_ID_NOT_FOUND
    assert by_id[""].error_code == E.INVALID_REQUEST
    L = M.ListTransactionsRequest
    for version in range(3):
        listed = c.call(LIST_TXNS, version, L(state_filters=["Ongoing", "Bogus"], producer_id_filters=[]))
        assert listed.error_code == 0 and listed.unknown_state_filters == ["Bogus"]
        assert "dl-open" in {t.transactional_id for t in listed.transaction_states}
        assert "dl-empty" not in {t.transactional_id for t in listed.transaction_states}
    listed = c.call(LIST_TXNS, 2, L(transactional_id_pattern="dl-e.*"))
    assert {t.transactional_id for t in listed.transaction_states} == {"dl-empty"}
    # as in Kafka the duration is measured from the start time, -1 for ids without a transaction
    listed = c.call(LIST_TXNS, 1, L(state_filters=["Ongoing"], duration_filter=3_600_000))
    assert listed.transaction_states == []
    end(c, "dl-open", pid, epoch, False)


# ----- offsets in transactions -----------------------------------------------------------------
ADD_OFFSETS, TXN_OFFSET_COMMIT, OFFSET_FETCH = 25, 28, 9


def add_offsets(c: RawClient, tid: str, pid: int, epoch: int, group: str, version: int = 0) -> int:
    return int(c.call(ADD_OFFSETS, version, M.AddOffsetsToTxnRequest(
        transactional_id=tid, producer_id=pid, producer_epoch=epoch, group_id=group)).error_code)


def txn_offset_commit(c: RawClient, tid: str, pid: int, epoch: int, group: str,
                      offsets: dict[tuple[str, int], int], version: int = 3) -> dict[tuple[str, int], int]:
    R = M.TxnOffsetCommitRequest
    topics: dict[str, list[Any]] = {}
    for (t, p), o in offsets.items():
        topics.setdefault(t, []).append(R.TxnOffsetCommitRequestPartition(
            partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata="m"))
    r = c.call(TXN_OFFSET_COMMIT, version, R(transactional_id=tid, group_id=group, producer_id=pid,
                                            producer_epoch=epoch, topics=[
                                                R.TxnOffsetCommitRequestTopic(name=t, partitions=ps)
                                                for t, ps in topics.items()]))
    return {(t.name, p.partition_index): p.error_code for t in r.topics for p in t.partitions}


def fetch_stable(c: RawClient, group: str, topic: str, partition: int, version: int = 7) -> tuple[int, int]:
    R = M.OffsetFetchRequest
    if version >= 8:
        r = c.call(OFFSET_FETCH, version, R(require_stable=True, groups=[R.OffsetFetchRequestGroup(
            group_id=group, topics=[R.OffsetFetchRequestTopics(name=topic, partition_indexes=[partition])])]))
        p = r.groups[0].topics[0].partitions[0]
    else:
        r = c.call(OFFSET_FETCH, version, R(group_id=group, require_stable=True, topics=[
            R.OffsetFetchRequestTopic(name=topic, partition_indexes=[partition])]))
        p = r.topics[0].partitions[0]
    return p.error_code, p.committed_offset


@pytest.mark.parametrize("version", range(0, 4))
def test_transactional_offsets_commit_with_the_transaction(bt: BrokerThread, c: RawClient, version: int) -> None:
    topic, group, tid = "to-%d" % version, "tg-%d" % version, "tot-%d" % version
    bt.create_topic(topic, 1)
    pid, epoch = begin(c, tid, topic)
    # without AddOffsetsToTxn the group's partition is not in the transaction
    assert txn_offset_commit(c, tid, pid, epoch, group, {(topic, 0): 3}, version) == {(topic, 0): E.INVALID_TXN_STATE}
    assert add_offsets(c, tid, pid, epoch, group, min(version, 4)) == 0
    assert txn_offset_commit(c, tid, pid, epoch, group, {(topic, 0): 3, (topic, 9): 1, ("nope", 0): 1}, version) == {
        (topic, 0): 0, (topic, 9): E.UNKNOWN_TOPIC_OR_PARTITION, ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    assert fetch_stable(c, group, topic, 0) == (E.UNSTABLE_OFFSET_COMMIT, -1)
    assert fetch_stable(c, group, topic, 0, version=8) == (E.UNSTABLE_OFFSET_COMMIT, -1)
    assert end(c, tid, pid, epoch, True).error_code == 0
    assert fetch_stable(c, group, topic, 0) == (0, 3)
    # the next transaction aborts: the offset stays
    assert add_offsets(c, tid, pid, epoch, group) == 0
    assert txn_offset_commit(c, tid, pid, epoch, group, {(topic, 0): 8}, version) == {(topic, 0): 0}
    assert end(c, tid, pid, epoch, False).error_code == 0
    assert fetch_stable(c, group, topic, 0) == (0, 3)


def test_txn_offset_commit_errors(bt: BrokerThread, c: RawClient) -> None:
    bt.create_topic("toe", 1)
    pid, epoch = begin(c, "toe", "toe")
    # before AddOffsetsToTxn, in newer clients' words
    assert txn_offset_commit(c, "toe", pid, epoch, "g", {("toe", 0): 1}, version=4) == {
        ("toe", 0): E.TRANSACTION_ABORTABLE}
    assert add_offsets(c, "toe", pid, epoch + 1, "g", 1) == E.INVALID_PRODUCER_EPOCH
    assert add_offsets(c, "toe", pid, epoch + 1, "g", 2) == E.PRODUCER_FENCED
    assert add_offsets(c, "toe", pid, epoch, "g") == 0
    assert txn_offset_commit(c, "toe", pid, epoch + 1, "g", {("toe", 0): 1}) == {("toe", 0): E.INVALID_PRODUCER_EPOCH}
    assert txn_offset_commit(c, "toe", pid, epoch, "", {("toe", 0): 1}) == {("toe", 0): E.INVALID_GROUP_ID}
    assert txn_offset_commit(c, "other", pid, epoch, "g", {("toe", 0): 1}) == {
        ("toe", 0): E.INVALID_PRODUCER_ID_MAPPING}
    end(c, "toe", pid, epoch, False)


def test_txn_offset_commit_v5_adds_the_group_partition(bt: BrokerThread, c: RawClient) -> None:
    bt.create_topic("to5", 1)
    r = init(c, "to5", version=5)
    pid, epoch = r.producer_id, r.producer_epoch
    assert txn_produce(c, "to5", 0, "to5", pid, epoch, 0, [b"x"], version=12).error_code == 0
    assert txn_offset_commit(c, "to5", pid, epoch, "g5", {("to5", 0): 4}, version=5) == {("to5", 0): 0}
    assert fetch_stable(c, "g5", "to5", 0) == (E.UNSTABLE_OFFSET_COMMIT, -1)
    assert end(c, "to5", pid, epoch, True, version=5).error_code == 0
    assert fetch_stable(c, "g5", "to5", 0) == (0, 4)


# ----- WriteTxnMarkers and DescribeProducers ------------------------------------------------------
def write_markers(c: RawClient, pid: int, epoch: int, committed: bool, partitions: dict[str, list[int]],
                  version: int = 1) -> dict[tuple[str, int], int]:
    R = M.WriteTxnMarkersRequest
    r = c.call(27, version, R(markers=[R.WritableTxnMarker(
        producer_id=pid, producer_epoch=epoch, transaction_result=committed, coordinator_epoch=0,
        topics=[R.WritableTxnMarkerTopic(name=t, partition_indexes=ps) for t, ps in partitions.items()])]))
    return {(t.name, p.partition_index): p.error_code for m in r.markers for t in m.topics for p in t.partitions}


def producers(c: RawClient, topic: str) -> dict[int, Any]:
    R = M.DescribeProducersRequest
    r = c.call(61, 0, R(topics=[R.TopicRequest(name=topic, partition_indexes=[0])]))
    return {p.producer_id: p for p in r.topics[0].partitions[0].active_producers}


@pytest.mark.parametrize("version", [1, 2])
def test_write_txn_markers(bt: BrokerThread, c: RawClient, version: int) -> None:
    topic = "wtm-%d" % version
    bt.create_topic(topic, 1)
    pid, epoch = begin(c, topic, topic)
    assert txn_produce(c, topic, 0, topic, pid, epoch, 0, [b"x"]).error_code == 0
    state = producers(c, topic)[pid]
    assert (state.producer_epoch, state.current_txn_start_offset, state.last_sequence) == (epoch, 0, 0)
    assert fetch_one(c, topic, 0, 0, isolation_level=READ_COMMITTED).last_stable_offset == 0
    assert write_markers(c, pid, epoch - 1, True, {topic: [0]}, version) == {(topic, 0): E.INVALID_PRODUCER_EPOCH}
    assert write_markers(c, pid, epoch, True, {topic: [0], "nope": [0]}, version) == {
        (topic, 0): 0, ("nope", 0): E.UNKNOWN_TOPIC_OR_PARTITION}
    part = fetch_one(c, topic, 0, 0, isolation_level=READ_COMMITTED)
    assert part.last_stable_offset == part.high_watermark == 2
    assert producers(c, topic)[pid].current_txn_start_offset == -1
    assert write_markers(c, 424242, 0, False, {topic: [0]}, version) == {(topic, 0): 0}  # an unknown producer
    assert end(c, topic, pid, epoch, True).error_code == 0  # the coordinator's own marker follows
