"""Incremental fetch sessions (KIP-227), as Kafka's FetchManager answers them: the cache's slots
and evictions, and the protocol against an in-process broker with raw frames (a session made by
a full fetch at epoch 0, incremental fetches answering only partitions with news, the session's
errors, forgetting, closing). kafka-python's consumer, which uses sessions, is in
tests/compat/test_fetch_sessions_clients.py."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from broker.apis.fetch_sessions import INT_MAX, FetchSessionCache, next_epoch
from broker.cluster.etcd_fake import ManualClock
from broker.testing.embedded import EmbeddedBroker
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient

FETCH = 1
Q, R = M.FetchRequest, M.FetchResponse
E = ErrorCode


def test_epochs_count_up_and_wrap_to_one() -> None:
    assert (next_epoch(0), next_epoch(1), next_epoch(INT_MAX), next_epoch(-1)) == (1, 2, 1, -1)


def parts(n: int) -> dict:  # type: ignore[type-arg]
    return {(uuid.uuid4(), i): None for i in range(n)}


def test_a_full_cache_gives_a_slot_as_kafkas_fetch_session_cache_does() -> None:
    clock = ManualClock(0.0)
    cache = FetchSessionCache(max_entries=2, eviction_ms=120_000, clock=clock)
    consumer = cache.maybe_create(False, True, parts(1))
    follower = cache.maybe_create(True, True, parts(1))
    assert consumer and follower and consumer != follower
    # young sessions: a consumer's new session finds no slot, however big
    assert cache.maybe_create(False, True, parts(9)) == 0
    # a follower's (privileged) takes a consumer's slot
    second_follower = cache.maybe_create(True, True, parts(1))
    assert second_follower and cache.get(consumer) is None and cache.evictions == 1
    # and never a young follower's: both followers stay
    assert cache.maybe_create(True, True, parts(9)) == 0
    # older than two minutes (as of their last use) sessions may go to bigger ones
    clock.now = 100.0
    for session in list(cache.sessions.values()):
        cache.touch(session)
    clock.now = 130.0
    for session in list(cache.sessions.values()):
        cache.touch(session)
    assert cache.maybe_create(False, True, parts(1)) == 0  # (consumer, 1) is below (follower, 1)
    clock.now = 251.0  # both unused for more than two minutes: anyone takes the stalest
    assert cache.maybe_create(False, True, parts(1)) != 0
    assert len(cache.sessions) == 2 and cache.evictions == 2


class Fetches:
    """Raw Fetch requests for topic `s` at one version: by name until 12, by topic id from 13."""

    def __init__(self, broker: EmbeddedBroker, version: int) -> None:
        self.client = RawClient(broker.port)
        self.version = version
        info = broker.broker.metadata.topic("s")
        assert info is not None
        self.topic: dict[str, Any] = {"topic": "s"} if version < 13 else {"topic_id": info.topic_id}

    def __call__(self, session_id: int, epoch: int, partitions: dict[int, int],
                 forgotten: list[int] | None = None) -> M.FetchResponse:
        request = Q(replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1 << 20, isolation_level=0,
                    session_id=session_id, session_epoch=epoch, rack_id="",
                    topics=[Q.FetchTopic(**self.topic, partitions=[
                        Q.FetchPartition(partition=p, fetch_offset=o, log_start_offset=-1,
                                         partition_max_bytes=1 << 20, current_leader_epoch=-1, last_fetched_epoch=-1)
                        for p, o in partitions.items()])] if partitions else [],
                    forgotten_topics_data=[Q.ForgottenTopic(**self.topic, partitions=forgotten)] if forgotten else [])
        response: M.FetchResponse = self.client.call(FETCH, self.version, request)
        return response


@pytest.fixture
def broker(tmp_path) -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker({"log.dirs": str(tmp_path / "data")}) as made:
        made.create_topic("s", partitions=3)
        yield made


@pytest.fixture(params=[12, 16], ids=["by-name", "by-topic-id"])
def fetch(broker: EmbeddedBroker, request: pytest.FixtureRequest) -> Fetches:
    return Fetches(broker, request.param)


def answered(response: M.FetchResponse) -> dict[int, int]:
    """Partition -> records' size, of the partitions the response carries."""
    return {p.partition_index: len(p.records or b"") for t in response.responses for p in t.partitions}


def produce(broker: EmbeddedBroker, partition: int, value: bytes) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": broker.bootstrap_servers})
    producer.produce("s", value, partition=partition)
    assert producer.flush(10) == 0


def test_a_session_answers_only_the_partitions_with_news(broker: EmbeddedBroker, fetch: Fetches) -> None:
    produce(broker, 0, b"first")
    full = fetch(0, 0, {0: 0, 1: 0, 2: 0})
    assert full.error_code == 0 and full.session_id != 0
    assert sorted(answered(full)) == [0, 1, 2] and answered(full)[0] > 0
    session = full.session_id
    # the client moves past the record: nothing new anywhere (the high watermarks sent stand)
    quiet = fetch(session, 1, {0: 1})
    assert (quiet.error_code, quiet.session_id, answered(quiet)) == (0, session, {})
    # a record arrives in partition 2
    produce(broker, 2, b"second")
    news = fetch(session, 2, {})
    assert news.session_id == session and list(answered(news)) == [2] and answered(news)[2] > 0
    # the wrong epoch, an unknown session: errors, session id 0, nothing else
    stale = fetch(session, 2, {})
    assert (stale.error_code, stale.session_id, stale.responses) == (E.INVALID_FETCH_SESSION_EPOCH, 0, [])
    unknown = fetch(session + 1, 1, {})
    assert (unknown.error_code, unknown.session_id) == (E.FETCH_SESSION_ID_NOT_FOUND, 0)
    # the session goes on at its epoch after an error
    assert fetch(session, 3, {2: 1}).error_code == 0


def test_forgetting_every_partition_or_a_final_epoch_closes_the_session(fetch: Fetches) -> None:
    first = fetch(0, 0, {0: 0, 1: 0})
    closed = fetch(first.session_id, 1, {}, forgotten=[0, 1])
    assert (closed.error_code, closed.session_id) == (0, 0)
    assert fetch(first.session_id, 2, {}).error_code == E.FETCH_SESSION_ID_NOT_FOUND
    second = fetch(0, 0, {0: 0})
    sessionless = fetch(second.session_id, -1, {0: 0})
    assert (sessionless.session_id, sorted(answered(sessionless))) == (0, [0])
    assert fetch(second.session_id, 1, {}).error_code == E.FETCH_SESSION_ID_NOT_FOUND


def test_a_partition_added_to_a_session_is_answered_in_full_once(fetch: Fetches) -> None:
    first = fetch(0, 0, {0: 0})
    added = fetch(first.session_id, 1, {1: 0})
    assert list(answered(added)) == [1]  # its high watermark was never sent
    assert answered(fetch(first.session_id, 2, {})) == {}


def test_no_slots_no_sessions(tmp_path) -> None:
    with EmbeddedBroker({"log.dirs": str(tmp_path / "data"), "max.incremental.fetch.session.cache.slots": "0"}) as b:
        b.create_topic("s", partitions=1)
        full = Fetches(b, 16)(0, 0, {0: 0})
        assert (full.error_code, full.session_id, list(answered(full))) == (0, 0, [0])
