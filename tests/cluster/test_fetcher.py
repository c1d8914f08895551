"""The replica fetcher against a leader played in memory (its answers encoded and decoded as on the
wire): what a follower's Fetch carries, the copy it makes, truncation on a diverging epoch (the
answer Kafka's leaders give), OFFSET_OUT_OF_RANGE, a fenced epoch, a partition moved away while
its fetch was out, and a leader that cannot be reached."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

from broker.apis.fetch_sessions import FetchContext, FetchSessionCache
from broker.cluster.fetcher import (
    FETCH,
    LIST_OFFSETS,
    FetcherSettings,
    ReplicaFetcher,
    ReplicaFetcherManager,
    truncation_offset,
)
from broker.log import create_log
from broker.partition import Partition
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.log.log_helpers import Clock, batch, read_all, small_config

R = M.FetchResponse
TOPIC_ID = uuid.uuid4()
FAST = FetcherSettings(max_wait_ms=0, backoff_ms=10)


def partition(path: str, name: str, index: int = 0) -> Partition:
    log = create_log(os.path.join(path, name, "t-%d" % index), "t", index, small_config(), time=Clock())
    p = Partition("t", index, TOPIC_ID, log)
    p.rebuild_producer_state()
    return p


class FakeLeader:
    """A NodeClient to a leader holding `partitions`, answering as Kafka's leaders do (the
    diverging-epoch check included); every request and response goes through the codecs."""

    def __init__(self, partitions: dict[int, Partition], epoch: int = 0) -> None:
        self.partitions = partitions
        self.epoch = epoch
        self.requests: list[tuple[int, int, Any]] = []
        self.errors: dict[int, ErrorCode] = {}  # partition -> error its fetches get
        self.down = False
        self.gate: asyncio.Event | None = None  # set: fetches wait for it
        self.sessions = FetchSessionCache()

    async def call(self, api_key: int, version: int, request: Any, unreachable: ErrorCode = ErrorCode.NONE) -> Any:
        if self.down:
            raise KafkaError(unreachable, "down")
        request = M.decode_request(api_key, version, M.encode(request, version))
        self.requests.append((api_key, version, request))
        if api_key == 18:
            keys = [M.ApiVersionsResponse.ApiVersion(api_key=k, min_version=0, max_version=v)
                    for k, v in ((FETCH, 18), (LIST_OFFSETS, 11))]
            response: Any = M.ApiVersionsResponse(error_code=0, api_keys=keys)
        elif api_key == FETCH:
            if self.gate is not None:
                await self.gate.wait()
            response = self.fetch(request, version)
            if not any(len(p.records) for t in response.responses for p in t.partitions):
                await asyncio.sleep(0.005)  # a leader's long poll: nothing came within max_wait_ms
        else:
            response = self.list_offsets(request)
        return M.decode_response(api_key, version, M.encode(response, version))

    def fetch(self, request: M.FetchRequest, version: int = 17) -> M.FetchResponse:
        """As a leader answers, in the fetch session the request names (the broker's own sessions)."""
        context = FetchContext(self.sessions, version, request, privileged=True)
        if context.error is not None:
            return R(error_code=int(context.error), session_id=0, responses=[])
        parts = []
        for topic in context.topics:
            for entry in self._entries(topic):
                parts.append((topic.topic, topic.topic_id, entry))
        error, session_id, answered = context.respond(parts)
        out: list[R.FetchableTopicResponse] = []
        for name, topic_id, entry in answered:
            if not out or out[-1].topic_id != topic_id:
                out.append(R.FetchableTopicResponse(topic=name, topic_id=topic_id, partitions=[]))
            out[-1].partitions.append(entry)
        return R(error_code=int(error), session_id=session_id, responses=out)

    def _entries(self, topic: M.FetchRequest.FetchTopic) -> list[R.PartitionData]:
        entries = []
        for p in topic.partitions:
            leader = self.partitions[p.partition]
            entry = R.PartitionData(partition_index=p.partition, high_watermark=leader.high_watermark,
                                    last_stable_offset=leader.last_stable_offset,
                                    log_start_offset=leader.log_start_offset, records=b"")
            entries.append(entry)
            error = self.errors.get(p.partition)
            if error is not None:
                entry.error_code = int(error)
                continue
            if p.current_leader_epoch < self.epoch:
                entry.error_code = int(ErrorCode.FENCED_LEADER_EPOCH)
                continue
            if p.last_fetched_epoch >= 0:
                epoch, end = leader.log.end_offset_for_epoch(p.last_fetched_epoch)
                if epoch < 0 or end < 0 or p.fetch_offset < leader.log_start_offset:
                    entry.error_code = int(ErrorCode.OFFSET_OUT_OF_RANGE)
                    continue
                if epoch < p.last_fetched_epoch or end < p.fetch_offset:
                    entry.diverging_epoch = R.EpochEndOffset(epoch=epoch, end_offset=end)
                    continue
            try:
                entry.records = leader.log.read(p.fetch_offset, p.partition_max_bytes).records.read()
            except KafkaError as exc:
                entry.error_code = int(exc.code)
        return entries

    def list_offsets(self, request: M.ListOffsetsRequest) -> M.ListOffsetsResponse:
        L = M.ListOffsetsResponse
        p = request.topics[0].partitions[0]
        leader = self.partitions[p.partition_index]
        offset = leader.log.log_end_offset if p.timestamp == -1 else leader.log_start_offset
        return L(topics=[L.ListOffsetsTopicResponse(name=request.topics[0].name, partitions=[
            L.ListOffsetsPartitionResponse(partition_index=p.partition_index, error_code=0, timestamp=-1,
                                           offset=offset, leader_epoch=self.epoch)])])

    def close(self) -> None:
        pass


def fetcher_for(client: FakeLeader, followers: dict[int, Partition], epoch: int = 0) -> ReplicaFetcher:
    fetcher = ReplicaFetcher(2, 1, client, lambda: 77, lambda t, i: followers.get(i), FAST)  # type: ignore[arg-type]
    for index in followers:
        fetcher.add_partition(("t", index), TOPIC_ID, epoch)
    return fetcher


async def run_until_copied(fetcher: ReplicaFetcher, leaders: dict[int, Partition], followers: dict[int, Partition],
                           rounds: int = 50, same_high_watermark: bool = True) -> None:
    for _ in range(rounds):
        if all(read_all(followers[i].log) == read_all(leaders[i].log)
               and (followers[i].high_watermark == leaders[i].high_watermark or not same_high_watermark)
               for i in leaders):
            return
        if not await fetcher.fetch_once():
            await asyncio.sleep(0.02)
    raise AssertionError("not copied in %d fetches" % rounds)


async def test_one_fetch_carries_every_partition_of_the_leader_as_kafkas_followers_send_it(tmp_path) -> None:
    leaders = {i: partition(str(tmp_path), "leader", i) for i in range(2)}
    followers = {i: partition(str(tmp_path), "follower", i) for i in range(2)}
    for i, p in leaders.items():
        p.become_leader(3)
        p.append_records(batch(3 + i))
        p.append_records(batch(2, producer_id=5, producer_epoch=0, base_sequence=0))
    for p in followers.values():
        p.make_follower(1, 3, 0, [1, 2], [1, 2])
    client = FakeLeader(leaders, epoch=3)
    fetcher = fetcher_for(client, followers, epoch=3)
    await run_until_copied(fetcher, leaders, followers)
    await fetcher.fetch_once()
    fetches = [r for k, v, r in client.requests if k == FETCH]
    version = next(v for k, v, _ in client.requests if k == FETCH)
    assert version == 17  # Kafka 4.x's, below the leader's 18
    first = fetches[0]
    assert (first.replica_state.replica_id, first.replica_state.replica_epoch) == (2, 77)
    assert (first.session_id, first.session_epoch, first.max_wait_ms, first.min_bytes) == (0, 0, 0, 1)  # opens a session
    assert [(t.topic_id, [(p.partition, p.fetch_offset, p.current_leader_epoch, p.last_fetched_epoch)
                          for p in t.partitions]) for t in first.topics] == [(TOPIC_ID, [(0, 0, 3, 0), (1, 0, 3, 0)])]
    last = fetches[-1].topics[0].partitions
    assert [(p.fetch_offset, p.last_fetched_epoch) for p in last] == [(5, 3), (6, 3)]
    for i in leaders:
        assert followers[i].producers.producers.keys() == {5}
        assert followers[i].log.epoch_cache.entries == leaders[i].log.epoch_cache.entries


async def test_a_diverging_epoch_truncates_to_where_the_histories_part(tmp_path) -> None:
    """The follower led epoch 1 and wrote 10-14 that nobody copied; the new leader wrote 10-19 in
    epoch 2: the follower truncates to 10 and copies the leader's."""
    leader, follower = partition(str(tmp_path), "leader"), partition(str(tmp_path), "follower")
    leader.append_records(batch(10))
    follower.append_as_follower(leader.log.read(0, 1 << 20).records.read())
    follower.become_leader(1)
    follower.append_records(batch([b"lost-%d" % i for i in range(5)]))
    leader.become_leader(2)
    leader.append_records(batch(10))
    follower.make_follower(1, 2, 1, [1, 2], [1, 2])
    client = FakeLeader({0: leader}, epoch=2)
    fetcher = fetcher_for(client, {0: follower}, epoch=2)
    await run_until_copied(fetcher, {0: leader}, {0: follower})
    assert b"lost" not in read_all(follower.log)
    assert follower.log.epoch_cache.entries == [(0, 0), (2, 10)]


def test_the_truncation_offset_follows_kafkas_rules(tmp_path) -> None:
    p = partition(str(tmp_path), "p")
    p.append_records(batch(5))          # epoch 0: 0-4
    p.become_leader(2)
    p.append_records(batch(5))          # epoch 2: 5-9
    p.make_follower(1, 4, 0, [1], [1])
    assert truncation_offset(p, 2, 7) == 7          # both know epoch 2: the smaller end
    assert truncation_offset(p, 2, 50) == 10        # never past this log's end
    assert truncation_offset(p, 1, 3) == 5          # epoch 1 unknown here: the end of epoch 0, to compare again
    assert truncation_offset(p, 3, 8) == 8          # no epoch here ends it: the leader's end
    p.update_follower_high_watermark(6)
    assert truncation_offset(p, 2, -1) == 6         # no end offset: the high watermark


async def test_out_of_range_below_the_leaders_start_starts_over_there(tmp_path) -> None:
    leader, follower = partition(str(tmp_path), "leader"), partition(str(tmp_path), "follower")
    for _ in range(30):
        leader.append_records(batch(2, size=200))
    leader.log.delete_records_before(40)
    follower.append_records(batch(3))
    follower.make_follower(1, 0, 0, [1, 2], [1, 2])
    client = FakeLeader({0: leader})
    fetcher = fetcher_for(client, {0: follower})
    await fetcher.fetch_once()
    assert follower.log.log_start_offset == follower.log.log_end_offset == leader.log_start_offset
    await run_until_copied(fetcher, {0: leader}, {0: follower})


async def test_out_of_range_past_the_leaders_end_truncates_to_it(tmp_path) -> None:
    leader, follower = partition(str(tmp_path), "leader"), partition(str(tmp_path), "follower")
    leader.append_records(batch(4))
    follower.append_as_follower(leader.log.read(0, 1 << 20).records.read())
    follower.append_as_follower(batch(3, base_offset=4))  # never on the leader; no leader epoch in it
    follower.make_follower(1, 0, 0, [1, 2], [1, 2])
    client = FakeLeader({0: leader})
    leader.log.epoch_cache.entries.clear()  # a leader that cannot place the follower's epoch: out of range
    fetcher = fetcher_for(client, {0: follower})
    # this leader answers every fetch out of range: the follower never gets a high watermark from it
    await run_until_copied(fetcher, {0: leader}, {0: follower}, same_high_watermark=False)
    assert follower.log.log_end_offset == 4


async def test_a_fenced_epoch_stops_the_partition_until_the_metadata_adds_it_again(tmp_path) -> None:
    leader, follower = partition(str(tmp_path), "leader"), partition(str(tmp_path), "follower")
    leader.append_records(batch(2))
    client = FakeLeader({0: leader}, epoch=5)
    fetcher = fetcher_for(client, {0: follower}, epoch=4)
    await fetcher.fetch_once()
    assert fetcher.states == {}
    fetcher.add_partition(("t", 0), TOPIC_ID, 5)
    await run_until_copied(fetcher, {0: leader}, {0: follower})


async def test_errors_back_off_and_an_answer_for_a_partition_moved_away_is_dropped(tmp_path) -> None:
    leader, follower = partition(str(tmp_path), "leader"), partition(str(tmp_path), "follower")
    leader.append_records(batch(2))
    client = FakeLeader({0: leader})
    fetcher = fetcher_for(client, {0: follower})
    client.errors[0] = ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert await fetcher.fetch_once()
    assert not await fetcher.fetch_once()  # backing off
    del client.errors[0]
    client.down = True
    await asyncio.sleep(0.02)
    assert await fetcher.fetch_once()
    assert fetcher._versions is None and follower.log.log_end_offset == 0
    client.down = False
    await asyncio.sleep(0.02)
    client.gate = asyncio.Event()
    out = asyncio.ensure_future(fetcher.fetch_once())
    await asyncio.sleep(0.01)
    fetcher.remove_partition(("t", 0))  # this node leads it now
    client.gate.set()
    await out
    assert follower.log.log_end_offset == 0


async def test_the_manager_runs_one_fetcher_per_leader_and_moves_partitions(tmp_path) -> None:
    leaders = {1: {0: partition(str(tmp_path), "l1", 0)}, 3: {1: partition(str(tmp_path), "l3", 1)}}
    followers = {0: partition(str(tmp_path), "f", 0), 1: partition(str(tmp_path), "f", 1)}
    clients = {1: FakeLeader(leaders[1]), 3: FakeLeader({**leaders[3], **leaders[1]})}
    for parts in leaders.values():
        for p in parts.values():
            p.append_records(batch(3))
    manager = ReplicaFetcherManager(2, lambda n: clients[n], lambda: 1,  # type: ignore[arg-type,return-value]
                                    lambda t, i: followers.get(i), FAST)
    manager.add_partition(("t", 0), TOPIC_ID, 1, 0)
    manager.add_partition(("t", 1), TOPIC_ID, 3, 0)
    assert set(manager.fetchers) == {1, 3}

    async def copied() -> None:
        while any(followers[i].log.log_end_offset < 3 for i in (0, 1)):
            await asyncio.sleep(0.01)

    await asyncio.wait_for(copied(), 10)
    manager.remove_partition(("t", 1))  # e.g. this node leads it now
    assert set(manager.fetchers) == {1}
    manager.add_partition(("t", 0), TOPIC_ID, 3, 1)  # its leadership moved to node 3
    assert set(manager.fetchers) == {3} and manager.leader_of(("t", 0)) == 3
    await manager.shutdown()
    assert manager.fetchers == {}



async def test_fetches_go_on_in_an_incremental_session_and_start_over_when_the_leader_loses_it(tmp_path) -> None:
    leaders = {i: partition(str(tmp_path), "leader", i) for i in range(2)}
    followers = {i: partition(str(tmp_path), "follower", i) for i in range(2)}
    for p in leaders.values():
        p.become_leader(3)
    leaders[0].append_records(batch(3))
    for p in followers.values():
        p.make_follower(1, 3, 0, [1, 2], [1, 2])
    client = FakeLeader(leaders, epoch=3)
    fetcher = fetcher_for(client, followers, epoch=3)

    async def fetch() -> M.FetchRequest:
        assert await fetcher.fetch_once()
        request: M.FetchRequest = client.requests[-1][2]
        return request

    def named(request: M.FetchRequest) -> list[tuple[int, int]]:
        return [(p.partition, p.fetch_offset) for t in request.topics for p in t.partitions]

    first = await fetch()
    assert (first.session_id, first.session_epoch, named(first)) == (0, 0, [(0, 0), (1, 0)])
    session = fetcher.session.session_id
    assert session != 0
    # partition 0 moved (it copied 3 records): only it is named; partition 1 stays in the session
    second = await fetch()
    assert (second.session_id, second.session_epoch, named(second)) == (session, 1, [(0, 3)])
    third = await fetch()
    assert (third.session_epoch, named(third)) == (2, [])
    # a partition no longer fetched is forgotten
    fetcher.remove_partition(("t", 1))
    fourth = await fetch()
    assert [(t.partitions) for t in fourth.forgotten_topics_data] == [[1]]
    # the leader lost the session: one refused fetch, then a full one opens another; nothing lost
    client.sessions.sessions.clear()
    leaders[0].append_records(batch(2))
    refused = await fetch()
    assert refused.session_epoch == 4
    again = await fetch()
    assert (again.session_id, again.session_epoch, named(again)) == (0, 0, [(0, 3)])
    await run_until_copied(fetcher, {0: leaders[0]}, {0: followers[0]})
