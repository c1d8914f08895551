"""Many clients at once (issue 16): thousands of connections, producers and group members on one
broker; the bar is a produce p99 under 50 ms with no error but Kafka's own.

    flock /work/notes/bench.lock python bench/many_clients.py                       # quick run
    flock /work/notes/bench.lock python bench/many_clients.py --connections 5000 --producers 1000 \\
        --consumers 500 --groups 100 --duration 30

Starts `python -m broker` (peers.start_ours: Kafka's defaults, data in a temp dir), creates one
topic per group (`--topics`) with enough partitions for one producer each, and drives it from
`--processes` load generators (asyncio, raw frames built with our `protocol` package, so that
the load costs little CPU beside the broker on a 2-core machine) and one process of real
confluent-kafka clients:

- producers: one connection each, Produce v11 with acks=-1 (idempotent unless --no-idempotence)
  of one small RecordBatch, `--rate` requests a second on a schedule (open loop, at most 5 in
  flight as a client allows); the latency is the request's round trip from the moment it was
  written; how late the generator wrote it against its schedule is reported as its lag;
- consumers: KIP-848 members (ConsumerGroupHeartbeat v1) of `--groups` groups, each with a
  coordinator connection (heartbeats, OffsetFetch, OffsetCommit every 5 s) and a fetch connection
  (Fetch v15 of the assigned partitions, max.wait 500 ms, min.bytes 1, from the committed offset
  or the earliest), as Kafka's consumer does;
- the other connections are idle clients: ApiVersions and a Metadata every `--metadata-interval` s;
- `--real-clients` confluent-kafka producers (delivery latency) and classic-protocol consumers
  of one group (their own topic).

Members join before the measured window; producers start with the window's warm-up
(`--warmup`), and figures count the requests scheduled inside the window (`--duration`).
Prints one JSON object: produce latency percentiles, requests/s, records consumed per group
against the records produced to its topic, errors by API and error code, the broker's CPU, RSS
and descriptors (from /proc), and each generator's CPU and lag.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import base64
import collections
import gc
import json
import math
import os
import random
import resource
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402

from protocol import frames  # noqa: E402
from protocol import messages as M  # noqa: E402
from protocol.errors import ErrorCode  # noqa: E402
from protocol.records import RECORD_BATCH_OVERHEAD, build_batch, parse_batch_header  # noqa: E402
from tests.harness import RawClient  # noqa: E402

PRODUCE, FETCH, METADATA, OFFSET_COMMIT, OFFSET_FETCH = 0, 1, 3, 8, 9
FIND_COORDINATOR, API_VERSIONS, CREATE_TOPICS, INIT_PRODUCER_ID, HEARTBEAT = 10, 18, 19, 22, 68
VERSION = {PRODUCE: 11, FETCH: 15, METADATA: 12, OFFSET_COMMIT: 9, OFFSET_FETCH: 9, FIND_COORDINATOR: 4,
           API_VERSIONS: 3, INIT_PRODUCER_ID: 4, HEARTBEAT: 1}
API_NAME = {PRODUCE: "Produce", FETCH: "Fetch", METADATA: "Metadata", OFFSET_COMMIT: "OffsetCommit",
            OFFSET_FETCH: "OffsetFetch", FIND_COORDINATOR: "FindCoordinator", API_VERSIONS: "ApiVersions",
            INIT_PRODUCER_ID: "InitProducerId", HEARTBEAT: "ConsumerGroupHeartbeat"}
MAX_IN_FLIGHT = 5  # max.in.flight.requests.per.connection (idempotent producers: at most 5)
COMMIT_INTERVAL = 5.0  # auto.commit.interval.ms
REAL_CONNECTIONS = 5  # per real client pair, roughly: a producer's bootstrap + broker, a consumer's 3
SIZE = struct.Struct(">i")
E = ErrorCode


CODE_NAMES = {int(c): c.name for c in ErrorCode}


def code_name(code: int) -> str:
    return CODE_NAMES.get(code, str(code))


def percentiles(values: Any, scale: float = 1000.0) -> dict[str, float] | None:
    if not len(values):
        return None
    s = sorted(values)

    def at(q: float) -> float:
        return round(s[min(len(s) - 1, int(math.ceil(q * len(s))) - 1)] * scale, 2)

    return {"n": len(s), "p50": at(0.5), "p99": at(0.99), "p999": at(0.999), "max": round(s[-1] * scale, 2)}


# ------------------------------------------------------------------------------------------ generator


class Conn(asyncio.Protocol):
    """One client connection: requests written with a fresh correlation id, responses matched."""

    def __init__(self, gen: Generator, client_id: str) -> None:
        self.gen, self.client_id = gen, client_id
        self.buf = bytearray()
        self.pending: dict[int, tuple[asyncio.Future[tuple[float, bytes]], int]] = {}
        self.next_corr = 1
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def send_frame(self, frame: bytearray, api: int) -> asyncio.Future[tuple[float, bytes]]:
        """`frame` holds the size prefix and a header whose correlation id is overwritten here."""
        corr = self.next_corr
        self.next_corr += 1
        SIZE.pack_into(frame, 8, corr)
        fut: asyncio.Future[tuple[float, bytes]] = self.gen.loop.create_future()
        self.pending[corr] = (fut, api)
        if self.transport is None or self.transport.is_closing():
            fut.set_exception(ConnectionError("closed"))
        else:
            self.transport.write(frame)
        return fut

    def request(self, api: int, message: Any) -> asyncio.Future[tuple[float, bytes]]:
        header = frames.encode_request_header(api, VERSION[api], 0, self.client_id)
        body = M.encode(message, VERSION[api])
        return self.send_frame(bytearray(SIZE.pack(len(header) + len(body)) + header + body), api)

    async def call(self, api: int, message: Any) -> Any:
        _, body = await self.request(api, message)
        return M.decode_response(api, VERSION[api], body)

    def data_received(self, data: bytes) -> None:
        now = time.monotonic()
        buf = self.buf
        buf += data
        pos, n = 0, len(buf)
        while n - pos >= 8:
            (size,) = SIZE.unpack_from(buf, pos)
            if n - pos - 4 < size:
                break
            (corr,) = SIZE.unpack_from(buf, pos + 4)
            entry = self.pending.pop(corr, None)
            if entry is not None:
                fut, api = entry
                skip = 5 if frames.response_header_version(api, VERSION[api]) == 1 else 4
                if not fut.done():
                    fut.set_result((now, bytes(buf[pos + 4 + skip:pos + 4 + size])))
            pos += 4 + size
        if pos:
            del buf[:pos]

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.gen.closing:
            self.gen.error("connection", "closed by the broker")
        for fut, _ in self.pending.values():
            if not fut.done():
                fut.set_exception(ConnectionError("connection lost"))
        self.pending.clear()

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


class Producer:
    def __init__(self, gen: Generator, index: int, topic: str, partition: int) -> None:
        self.gen, self.index, self.topic, self.partition = gen, index, topic, partition
        self.records = [(b"key-%06d" % index, os.urandom(gen.cfg["value_bytes"] // 2).hex().encode()[
            :gen.cfg["value_bytes"]]) for _ in range(gen.cfg["batch_records"])]
        self.producer_id, self.epoch, self.sequence = -1, -1, 0
        self.in_flight = 0
        self.slot: asyncio.Future[None] | None = None
        self.end_offset = 0

    def batch(self) -> bytes:
        return build_batch(self.records, producer_id=self.producer_id, producer_epoch=self.epoch,
                           base_sequence=self.sequence if self.producer_id >= 0 else -1)

    async def setup(self) -> None:
        self.conn = await self.gen.connect("producer-%d" % self.index)
        await self.conn.call(API_VERSIONS, M.ApiVersionsRequest(client_software_name="many-clients",
                                                               client_software_version="1"))
        await self.conn.call(METADATA, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(
            name=self.topic)], allow_auto_topic_creation=False))
        if self.gen.cfg["idempotence"]:
            r = await self.conn.call(INIT_PRODUCER_ID, M.InitProducerIdRequest(
                transactional_id=None, transaction_timeout_ms=60000, producer_id=-1, producer_epoch=-1))
            if r.error_code:
                raise RuntimeError("InitProducerId: %s" % code_name(r.error_code))
            self.producer_id, self.epoch = r.producer_id, r.producer_epoch
        P = M.ProduceRequest
        batch = self.batch()
        request = P(transactional_id=None, acks=-1, timeout_ms=30000, topic_data=[P.TopicProduceData(
            name=self.topic, partition_data=[P.PartitionProduceData(index=self.partition, records=batch)])])
        header = frames.encode_request_header(PRODUCE, VERSION[PRODUCE], 0, self.conn.client_id)
        body = M.encode(request, VERSION[PRODUCE])
        self.template = SIZE.pack(len(header) + len(body)) + header + body
        self.batch_at, self.batch_len = self.template.rindex(batch), len(batch)

    async def run(self, start: float, window: tuple[float, float]) -> None:
        period = 1.0 / self.gen.cfg["rate"]
        scheduled = start + random.random() * period
        while scheduled < window[1] and not self.gen.closing:
            delay = scheduled - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            while self.in_flight >= MAX_IN_FLIGHT:
                self.slot = self.gen.loop.create_future()
                await self.slot
            self.send(scheduled, window[0] <= scheduled < window[1])
            scheduled += period

    def send(self, scheduled: float, measured: bool) -> None:
        batch = self.batch()
        assert len(batch) == self.batch_len
        frame = bytearray(self.template)
        frame[self.batch_at:self.batch_at + self.batch_len] = batch
        self.sequence += len(self.records)
        self.in_flight += 1
        sent = time.monotonic()
        fut = self.conn.send_frame(frame, PRODUCE)
        fut.add_done_callback(lambda f: self.done(f, scheduled, sent, measured))

    def done(self, fut: asyncio.Future[tuple[float, bytes]], scheduled: float, sent: float, measured: bool) -> None:
        self.in_flight -= 1
        if self.slot is not None and not self.slot.done():
            self.slot.set_result(None)
        gen = self.gen
        if fut.exception() is not None:
            gen.error("Produce", "no response (connection lost)")
            return
        now, body = fut.result()
        p = M.decode_response(PRODUCE, VERSION[PRODUCE], body).responses[0].partition_responses[0]
        if p.error_code:
            gen.error("Produce", code_name(p.error_code))
        else:
            self.end_offset = max(self.end_offset, p.base_offset + len(self.records))
        if measured:
            gen.sent_at.append(sent)
            gen.latency.append(now - sent)
            gen.latency_from_schedule.append(now - scheduled)
            gen.send_lag.append(sent - scheduled)


def member_uuid() -> str:
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()


class Member:
    """A KIP-848 consumer: heartbeats and commits on the coordinator connection, Fetch on another."""

    def __init__(self, gen: Generator, group: str, topic: str, index: int) -> None:
        self.gen, self.group, self.topic, self.index = gen, group, topic, index
        self.member_id, self.epoch = member_uuid(), 0
        self.owned: dict[int, int] = {}  # partition -> next offset to fetch
        self.committed: dict[int, int] = {}
        self.send_owned = True
        self.stopping = False
        self.wake = asyncio.Event()
        self.consumed = 0

    async def setup(self) -> None:
        self.fetcher = await self.gen.connect("consumer-%s-%d" % (self.group, self.index))
        self.coord = await self.gen.connect("consumer-%s-%d" % (self.group, self.index))
        for c in (self.fetcher, self.coord):
            await c.call(API_VERSIONS, M.ApiVersionsRequest(client_software_name="many-clients",
                                                            client_software_version="1"))
        md = await self.fetcher.call(METADATA, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(
            name=self.topic)], allow_auto_topic_creation=False))
        self.topic_id = md.topics[0].topic_id
        fc = await self.coord.call(FIND_COORDINATOR, M.FindCoordinatorRequest(key_type=0, coordinator_keys=[self.group]))
        if fc.coordinators[0].error_code:
            raise RuntimeError("FindCoordinator: %s" % code_name(fc.coordinators[0].error_code))
        self.tasks = [asyncio.ensure_future(self.heartbeats()), asyncio.ensure_future(self.fetches()),
                      asyncio.ensure_future(self.commits())]

    def heartbeat_request(self) -> Any:
        R = M.ConsumerGroupHeartbeatRequest
        joining = self.epoch == 0
        owned = [R.TopicPartitions(topic_id=self.topic_id, partitions=sorted(self.owned))] if self.owned else []
        return R(group_id=self.group, member_id=self.member_id, member_epoch=self.epoch,
                 rebalance_timeout_ms=300000 if joining else -1,
                 subscribed_topic_names=[self.topic] if joining else None,
                 topic_partitions=owned if joining or self.send_owned else None)

    async def heartbeats(self) -> None:
        interval = 5.0
        while not self.stopping:
            sent = time.monotonic()
            self.send_owned, request = False, self.heartbeat_request()
            try:
                r = await self.coord.call(HEARTBEAT, request)
            except ConnectionError:
                return
            self.gen.heartbeats += self.gen.measuring
            if self.stopping:
                return
            if r.error_code == E.NONE:
                self.epoch, interval = r.member_epoch, r.heartbeat_interval_ms / 1000
                if r.assignment is not None:
                    await self.reconcile({p for tp in r.assignment.topic_partitions if tp.topic_id == self.topic_id
                                          for p in tp.partitions})
                    continue  # acknowledge at once
            elif r.error_code in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
                self.gen.error("ConsumerGroupHeartbeat", code_name(r.error_code))
                self.owned.clear()
                self.epoch = 0
                continue
            else:
                self.gen.error("ConsumerGroupHeartbeat", code_name(r.error_code))
                interval = 0.5
            while not self.stopping and time.monotonic() < sent + interval:
                await asyncio.sleep(min(0.5, sent + interval - time.monotonic()))

    async def reconcile(self, target: set[int]) -> None:
        revoked = [p for p in self.owned if p not in target]
        if revoked:
            await self.commit(revoked)
            for p in revoked:
                del self.owned[p]
        added = sorted(target - self.owned.keys())
        if added:
            F = M.OffsetFetchRequest
            r = await self.coord.call(OFFSET_FETCH, F(require_stable=True, groups=[F.OffsetFetchRequestGroup(
                group_id=self.group, member_id=self.member_id, member_epoch=self.epoch,
                topics=[F.OffsetFetchRequestTopics(name=self.topic, partition_indexes=added)])]))
            group = r.groups[0]
            if group.error_code:
                self.gen.error("OffsetFetch", code_name(group.error_code))
            positions = {p.partition_index: p.committed_offset for t in group.topics for p in t.partitions}
            for p in added:
                self.owned[p] = max(0, positions.get(p, -1))  # auto.offset.reset=earliest: the log starts at 0
            self.wake.set()
        self.send_owned = True

    async def commit(self, partitions: list[int] | None = None) -> None:
        todo = {p: o for p, o in self.owned.items() if (partitions is None or p in partitions)
                and self.committed.get(p) != o}
        if not todo or self.epoch <= 0:
            return
        C = M.OffsetCommitRequest
        request = C(group_id=self.group, generation_id_or_member_epoch=self.epoch, member_id=self.member_id,
                    topics=[C.OffsetCommitRequestTopic(name=self.topic, partitions=[C.OffsetCommitRequestPartition(
                        partition_index=p, committed_offset=o, committed_leader_epoch=-1, committed_metadata="")
                        for p, o in sorted(todo.items())])])
        try:
            r = await self.coord.call(OFFSET_COMMIT, request)
        except ConnectionError:
            return
        self.gen.commits += self.gen.measuring
        for t in r.topics:
            for p in t.partitions:
                if p.error_code:
                    self.gen.error("OffsetCommit", code_name(p.error_code))
                else:
                    self.committed[p.partition_index] = todo[p.partition_index]

    async def commits(self) -> None:
        while not self.stopping:
            await asyncio.sleep(COMMIT_INTERVAL)
            if not self.stopping:
                await self.commit()

    async def fetches(self) -> None:
        F = M.FetchRequest
        gen = self.gen
        while not self.stopping:
            if not self.owned:
                self.wake.clear()
                try:
                    await asyncio.wait_for(self.wake.wait(), 0.5)
                except TimeoutError:
                    pass
                continue
            asked = dict(self.owned)
            request = F(max_wait_ms=500, min_bytes=1, max_bytes=52428800, isolation_level=0, topics=[F.FetchTopic(
                topic_id=self.topic_id, partitions=[F.FetchPartition(
                    partition=p, current_leader_epoch=-1, fetch_offset=o, last_fetched_epoch=-1, log_start_offset=-1,
                    partition_max_bytes=1048576) for p, o in sorted(asked.items())])])
            try:
                r = await self.fetcher.call(FETCH, request)
            except ConnectionError:
                return
            gen.fetches += gen.measuring
            now_ms = time.time() * 1000
            if r.error_code:
                gen.error("Fetch", code_name(r.error_code))
            for t in r.responses:
                for p in t.partitions:
                    if p.error_code:
                        gen.error("Fetch", code_name(p.error_code))
                        continue
                    records, pos, count, next_offset = p.records or b"", 0, 0, asked[p.partition_index]
                    while len(records) - pos >= RECORD_BATCH_OVERHEAD:
                        h = parse_batch_header(records, pos)
                        if pos + h.size > len(records):
                            break
                        if h.next_offset > next_offset:
                            count += h.records_count
                            next_offset = h.next_offset
                            if gen.measuring:
                                gen.end_to_end.append((now_ms - h.max_timestamp) / 1000)
                        pos += h.size
                    if self.owned.get(p.partition_index) == asked[p.partition_index]:
                        self.owned[p.partition_index] = next_offset
                        self.consumed += count
                        seen = gen.positions[self.group]
                        seen[p.partition_index] = max(seen.get(p.partition_index, 0), next_offset)

    async def stop(self) -> None:
        self.stopping = True
        self.wake.set()
        await self.commit()
        if self.epoch > 0:
            R = M.ConsumerGroupHeartbeatRequest
            try:  # leave the group (member epoch -1)
                await asyncio.wait_for(self.coord.call(HEARTBEAT, R(
                    group_id=self.group, member_id=self.member_id, member_epoch=-1)), 10)
            except (TimeoutError, ConnectionError):
                pass
        for task in self.tasks:
            task.cancel()


class Idle:
    def __init__(self, gen: Generator, index: int, topic: str) -> None:
        self.gen, self.index, self.topic = gen, index, topic

    def metadata(self) -> asyncio.Future[tuple[float, bytes]]:
        return self.conn.request(METADATA, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(
            name=self.topic)], allow_auto_topic_creation=False))

    async def setup(self) -> None:
        self.conn = await self.gen.connect("idle-%d" % self.index)
        await self.conn.call(API_VERSIONS, M.ApiVersionsRequest(client_software_name="many-clients",
                                                               client_software_version="1"))
        await self.metadata()

    async def run(self, start: float, end: float) -> None:
        interval = self.gen.cfg["metadata_interval"]
        due = start + random.random() * interval
        while due < end and not self.gen.closing:
            await asyncio.sleep(max(0.0, due - time.monotonic()))
            try:
                await self.metadata()
            except ConnectionError:
                return
            self.gen.metadata += self.gen.measuring
            due += interval


class Generator:
    """One load-generating process: its share (index `i` of `n`) of the producers, groups and idle
    connections."""

    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.loop = asyncio.get_running_loop()
        self.closing = self.measuring = False
        self.errors: collections.Counter[str] = collections.Counter()
        self.latency, self.latency_from_schedule, self.send_lag, self.end_to_end = (
            array.array("d"), array.array("d"), array.array("d"), array.array("d"))
        self.loop_lag, self.sent_at = array.array("d"), array.array("d")
        self.fetches = self.commits = self.metadata = self.heartbeats = 0  # inside the window
        self.positions: dict[str, dict[int, int]] = collections.defaultdict(dict)
        self.connect_gate = asyncio.Semaphore(64)
        host, port = cfg["bootstrap"].rsplit(":", 1)
        self.host, self.port = host, int(port)

    def error(self, api: str, what: str) -> None:
        self.errors["%s: %s" % (api, what)] += 1

    async def connect(self, client_id: str) -> Conn:
        async with self.connect_gate:
            _, conn = await self.loop.create_connection(lambda: Conn(self, client_id), self.host, self.port)
        return conn

    async def monitor(self, end: float) -> None:
        """How late the event loop wakes up (the generator's own saturation)."""
        while time.monotonic() < end:
            due = time.monotonic() + 0.05
            await asyncio.sleep(0.05)
            if self.measuring:
                self.loop_lag.append(time.monotonic() - due)

    async def run(self) -> dict[str, Any]:
        cfg, i, n = self.cfg, self.cfg["index"], self.cfg["processes"]
        topics, partitions = cfg["topics"], cfg["partitions"]
        topic = [("mc-%03d" % t) for t in range(topics)]
        producers = [Producer(self, j, topic[j % topics], (j // topics) % partitions)
                     for j in range(i, cfg["producers"], n)]
        members = [Member(self, "mc-group-%03d" % g, topic[g % topics], m)
                   for g in range(i, cfg["groups"], n) for m in range(cfg["members_per_group"][g])]
        idle = [Idle(self, k, topic[k % topics]) for k in range(i, cfg["idle"], n)]
        t0 = time.monotonic()
        for batch in (idle, producers, members):
            await asyncio.gather(*(c.setup() for c in batch))
        connected = time.monotonic() - t0
        groups = collections.defaultdict(list)
        for m in members:
            groups[m.group].append(m)

        def stable() -> bool:
            for ms in groups.values():
                owned = [p for m in ms for p in m.owned]
                if any(m.epoch <= 0 or m.send_owned for m in ms) or sorted(owned) != list(range(partitions)):
                    return False
            return True

        deadline = time.monotonic() + cfg["join_timeout"]
        while not stable():
            if time.monotonic() > deadline:
                raise RuntimeError("groups not stable after %.0f s" % cfg["join_timeout"])
            await asyncio.sleep(0.05)
        joined = time.monotonic() - t0
        gc.collect()
        gc.freeze()
        print("READY " + json.dumps({"connected_s": round(connected, 2), "joined_s": round(joined, 2)}), flush=True)
        line = await self.loop.run_in_executor(None, sys.stdin.readline)
        start = float(line.split()[1])
        window = (start + cfg["warmup"], start + cfg["warmup"] + cfg["duration"])
        monitor = asyncio.ensure_future(self.monitor(window[1]))
        runs = [asyncio.ensure_future(p.run(start, window)) for p in producers]
        runs += [asyncio.ensure_future(c.run(start, window[1])) for c in idle]
        await asyncio.sleep(max(0.0, window[0] - time.monotonic()))
        self.measuring, cpu0 = True, time.process_time()
        await asyncio.sleep(max(0.0, window[1] - time.monotonic()))
        self.measuring, cpu = False, time.process_time() - cpu0
        await asyncio.gather(*runs, monitor)
        drain = time.monotonic() + cfg["drain"]  # answers still due, then consumers catching up
        while time.monotonic() < drain and any(p.in_flight for p in producers):
            await asyncio.sleep(0.05)
        unanswered = sum(p.in_flight for p in producers)
        ends = {"%s:%d" % (p.topic, p.partition): p.end_offset for p in producers}

        def behind() -> bool:  # as far as this process knows the end offsets
            return any(self.positions[g].get(p, 0) < ends.get("%s:%d" % (ms[0].topic, p), 0)
                       for g, ms in groups.items() for p in range(partitions))

        while time.monotonic() < drain and behind():
            await asyncio.sleep(0.05)
        await asyncio.gather(*(m.stop() for m in members))
        self.closing = True
        for conn in [*(p.conn for p in producers), *(c.conn for c in idle)]:
            conn.close()
        for m in members:
            m.fetcher.close()
            m.coord.close()
        files = {}
        for name in ("latency", "latency_from_schedule", "send_lag", "end_to_end", "loop_lag", "sent_at"):
            files[name] = os.path.join(cfg["workdir"], "gen%d-%s.bin" % (i, name))
            with open(files[name], "wb") as f:
                getattr(self, name).tofile(f)
        return {"index": i, "connected_s": round(connected, 2), "joined_s": round(joined, 2),
                "cpu_s": round(cpu, 2), "errors": dict(self.errors), "unanswered_produce": unanswered,
                "end_offsets": ends, "fetches": self.fetches, "commits": self.commits, "metadata": self.metadata,
                "heartbeats": self.heartbeats,
                "consumed": {g: sum(m.consumed for m in ms) for g, ms in groups.items()},
                "positions": {g: self.positions[g] for g in groups}, "group_topic": {
                    g: ms[0].topic for g, ms in groups.items()}, "files": files}


def generator_main(cfg: dict[str, Any]) -> None:
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass

    async def main() -> dict[str, Any]:
        return await Generator(cfg).run()

    print("RESULT " + json.dumps(asyncio.run(main())), flush=True)


# ------------------------------------------------------------------------------------------ real clients


def real_main(cfg: dict[str, Any]) -> None:
    """confluent-kafka producers (delivery latency) and classic consumers of one group."""
    from confluent_kafka import Consumer
    from confluent_kafka import Producer as KProducer

    n, topic, errors = cfg["real_clients"], "mc-real", collections.Counter[str]()

    def on_error(err: Any) -> None:
        errors["client: %s" % err.name()] += 1

    common = {"bootstrap.servers": cfg["bootstrap"], "error_cb": on_error, "log_level": 4}
    producers = [KProducer({**common, "acks": "all", "linger.ms": 5}) for _ in range(n)]
    consumers = [Consumer({**common, "group.id": "mc-real-group", "auto.offset.reset": "earliest"}) for _ in range(n)]
    for c in consumers:
        c.subscribe([topic])
    latency, end_to_end, consumed = array.array("d"), array.array("d"), [0] * n
    state = {"measuring": False, "stop": False}
    assigned = [False] * n

    def consume(i: int) -> None:
        while not state["stop"]:
            msg = consumers[i].poll(0.1)
            assigned[i] = bool(consumers[i].assignment())
            if msg is None:
                continue
            failed = msg.error()
            if failed is not None:
                errors["consumer: %s" % failed.name()] += 1
                continue
            consumed[i] += 1
            if state["measuring"]:
                end_to_end.append(time.time() - msg.timestamp()[1] / 1000)

    threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + cfg["join_timeout"]
    while not all(assigned) and time.monotonic() < deadline:
        time.sleep(0.05)
    print("READY " + json.dumps({"assigned": sum(assigned)}), flush=True)
    start = float(sys.stdin.readline().split()[1])
    window = (start + cfg["warmup"], start + cfg["warmup"] + cfg["duration"])
    delivered = [0]

    def report(sent: float, measured: bool) -> Any:
        def cb(err: Any, msg: Any) -> None:
            if err is not None:
                errors["delivery: %s" % err.name()] += 1
            else:
                delivered[0] += 1
                if measured:
                    latency.append(time.monotonic() - sent)
        return cb

    period = 1.0 / cfg["rate"]
    due = [start + random.random() * period for _ in range(n)]
    cpu0 = None
    while min(due) < window[1]:
        now = time.monotonic()
        if cpu0 is None and now >= window[0]:
            state["measuring"], cpu0 = True, time.process_time()
        for i, p in enumerate(producers):
            if due[i] <= now and due[i] < window[1]:
                p.produce(topic, b"real-clients " * 8, key=b"k%d" % i,
                          on_delivery=report(time.monotonic(), window[0] <= due[i]))
                due[i] += period
            p.poll(0)
        time.sleep(0.001)
    state["measuring"] = False
    cpu = time.process_time() - (cpu0 or time.process_time())
    for p in producers:
        p.flush(30)
    time.sleep(2.0)  # consumers catch up
    state["stop"] = True
    for t in threads:
        t.join(10)
    for c in consumers:
        c.close()
    print("RESULT " + json.dumps({"cpu_s": round(cpu, 2), "errors": dict(errors), "delivered": delivered[0],
                                  "consumed": sum(consumed), "delivery_ms": percentiles(latency),
                                  "end_to_end_ms": percentiles(end_to_end)}), flush=True)


# ------------------------------------------------------------------------------------------ orchestration


def proc_facts(pid: int) -> dict[str, float]:
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    rss = 0
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    return {"cpu_s": (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), "rss_mb": rss / 1024,
            "fds": len(os.listdir("/proc/%d/fd" % pid))}


def machine_busy_s() -> float:
    """CPU seconds the whole machine has been busy (every core), from /proc/stat."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, Path("/proc/stat").read_text().split()[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    R = M.CreateTopicsRequest
    client = RawClient(int(bootstrap.rsplit(":", 1)[1]), "many-clients-setup")
    client.sock.settimeout(120)
    try:
        for k in range(0, len(names), 50):
            topics = [R.CreatableTopic(name=t, num_partitions=p, replication_factor=1, assignments=[], configs=[])
                      for t, p in ((t, 5 if t == "mc-real" else partitions) for t in names[k:k + 50])]
            r = client.call(CREATE_TOPICS, 5, R(topics=topics, timeout_ms=60000, validate_only=False))
            bad = [(t.name, t.error_code) for t in r.topics if t.error_code]
            assert not bad, bad
    finally:
        client.close()


def spawn(role: str, cfg: dict[str, Any]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, __file__, "--role", role, "--config", json.dumps(cfg)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            preexec_fn=peers._die_with_parent)


def read_line(child: subprocess.Popen[str], tag: str) -> dict[str, Any]:
    assert child.stdout is not None
    while True:
        line = child.stdout.readline()
        if not line:
            raise RuntimeError("a load process exited (%s) before %s" % (child.poll(), tag))
        if line.startswith(tag + " "):
            return json.loads(line[len(tag) + 1:])  # type: ignore[no-any-return]


def load(path: str) -> array.array[float]:
    a = array.array("d")
    with open(path, "rb") as f:
        a.frombytes(f.read())
    return a


def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # the broker and the generators inherit it
    topics = args.topics or args.groups
    partitions = args.partitions or max(1, math.ceil(args.producers / topics))
    real = args.real_clients * REAL_CONNECTIONS if args.real_clients else 0
    idle = args.connections - args.producers - 2 * args.consumers - real
    if idle < 0:
        raise SystemExit("--connections must be at least producers + 2 x consumers + the real clients' %d" % real)
    per_group = [args.consumers // args.groups + (1 if g < args.consumers % args.groups else 0)
                 for g in range(args.groups)]
    peer = peers.start_ours(dict(kv.split("=", 1) for kv in args.override), workdir=workdir)
    children: list[subprocess.Popen[str]] = []
    recorder = None
    if args.profile:
        import profile_broker
        py_spy = profile_broker.find_py_spy()
        if py_spy is None:
            raise SystemExit("--profile needs py-spy (pip install py-spy)")
        recorder = profile_broker.Recorder(py_spy, peer.pid, Path(args.profile), 100)
        Path(args.profile).mkdir(parents=True, exist_ok=True)
    try:
        names = ["mc-%03d" % t for t in range(topics)] + (["mc-real"] if args.real_clients else [])
        create_topics(peer.bootstrap, names, partitions)
        base = {"bootstrap": peer.bootstrap, "topics": topics, "partitions": partitions, "rate": args.rate,
                "producers": args.producers, "groups": args.groups, "members_per_group": per_group, "idle": idle,
                "processes": args.processes, "value_bytes": args.value_bytes, "batch_records": args.batch_records,
                "idempotence": args.idempotence, "metadata_interval": args.metadata_interval,
                "warmup": args.warmup, "duration": args.duration, "drain": 15.0, "join_timeout": 180.0,
                "workdir": str(workdir), "real_clients": args.real_clients}
        children = [spawn("gen", {**base, "index": i}) for i in range(args.processes)]
        if args.real_clients:
            children.append(spawn("real", base))
        ready = [read_line(c, "READY") for c in children]
        before = proc_facts(peer.pid)
        start = time.monotonic() + 0.5
        for c in children:
            assert c.stdin is not None
            c.stdin.write("GO %r\n" % start)
            c.stdin.flush()
        window = (start + args.warmup, start + args.warmup + args.duration)
        time.sleep(max(0.0, window[0] - time.monotonic()))
        first, busy0 = proc_facts(peer.pid), machine_busy_s()
        if recorder is not None:
            recorder.start("many_clients")
        samples = [first]
        while time.monotonic() < window[1]:
            time.sleep(min(1.0, max(0.0, window[1] - time.monotonic())))
            samples.append(proc_facts(peer.pid))
        busy = machine_busy_s() - busy0
        if recorder is not None:
            recorder.stop()
        results = [read_line(c, "RESULT") for c in children]
        for c in children:
            c.wait(30)
        after = proc_facts(peer.pid)
    finally:
        for c in children:
            if c.poll() is None:
                c.kill()
                c.wait(10)
        peer.stop()
    gens = [r for r in results if "index" in r]
    real_result = results[-1] if args.real_clients else None

    def merged(name: str) -> array.array[float]:
        out = array.array("d")
        for g in gens:
            out.extend(load(g["files"][name]))
        return out

    latency, sent_at = merged("latency"), merged("sent_at")
    worst: dict[int, float] = {}  # the slowest answer to the requests sent in each second of the window
    for at, took in zip(sent_at, latency):
        second = int(at - window[0])
        worst[second] = max(worst.get(second, 0.0), took)
    errors: collections.Counter[str] = collections.Counter()
    for r in results:
        errors.update(r["errors"])
    ends: dict[str, int] = {}
    for g in gens:
        ends.update(g["end_offsets"])
    per_group = []
    for g in gens:
        for group, topic in g["group_topic"].items():
            produced = sum(v for k, v in ends.items() if k.split(":")[0] == topic)
            read = sum(g["positions"][group].values())
            per_group.append({"group": group, "consumed": g["consumed"][group], "produced": produced,
                              "behind": produced - read})
    consumed = [x["consumed"] for x in per_group]
    kafka_own = {k: v for k, v in errors.items() if k.split(": ", 1)[1] in E.__members__
                 and k.split(": ", 1)[1] != "UNKNOWN_SERVER_ERROR"}
    other = {k: v for k, v in errors.items() if k not in kafka_own}
    p99 = percentiles(latency)["p99"] if len(latency) else None  # type: ignore[index]
    span = window[1] - window[0]
    return {
        "date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(),
        "config": {**{k: v for k, v in vars(args).items() if k not in ("override", "role", "config")},
                   "overrides": args.override,
                   "topics": topics, "partitions_per_topic": partitions, "idle_connections": idle},
        "setup": {"ready": ready, "window_start_monotonic": round(window[0], 3)},
        "produce": {"requests_per_s": round(len(latency) / span, 1),
                    "records_per_s": round(len(latency) * args.batch_records / span, 1),
                    "latency_ms": percentiles(latency),
                    "latency_from_schedule_ms": percentiles(merged("latency_from_schedule")),
                    "unanswered_at_end": sum(g["unanswered_produce"] for g in gens),
                    "max_ms_by_second": [round(worst.get(k, 0.0) * 1000, 1) for k in range(int(span) + 1)]},
        "consume": {"groups": len(per_group), "members": args.consumers,
                    "records_consumed_per_group": {"min": min(consumed), "median": statistics.median(consumed),
                                                   "max": max(consumed)} if consumed else None,
                    "groups_behind_at_end": sum(1 for x in per_group if x["behind"] > 0),
                    "end_to_end_ms": percentiles(merged("end_to_end")),
                    **{"%s_per_s" % k: round(sum(g[k] for g in gens) / span, 1)
                       for k in ("fetches", "heartbeats", "commits")}},
        "idle": {"connections": idle, "metadata_per_s": round(sum(g["metadata"] for g in gens) / span, 1)},
        "real_clients": real_result,
        "errors": dict(sorted(errors.items())),
        "errors_not_kafkas": other,
        "broker": {"cpu_percent": round(100 * (samples[-1]["cpu_s"] - first["cpu_s"]) / span, 1),
                   "rss_mb_before": round(before["rss_mb"], 1),
                   "rss_mb_peak": round(max(s["rss_mb"] for s in samples), 1),
                   "fds_peak": max(int(s["fds"]) for s in samples), "fds_after": int(after["fds"])},
        "machine": {"busy_percent": round(100 * busy / span, 1), "other_processes_percent": round(100 * (
            busy - (samples[-1]["cpu_s"] - first["cpu_s"]) - sum(r["cpu_s"] for r in results)) / span, 1)},
        "generators": [{"cpu_percent": round(100 * g["cpu_s"] / span, 1),
                        "send_lag_ms": percentiles(load(g["files"]["send_lag"])),
                        "loop_lag_ms": percentiles(load(g["files"]["loop_lag"]))} for g in gens],
        "bar": {"p99_under_50ms": p99 is not None and p99 < 50.0, "no_error_but_kafkas": not other},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--connections", type=int, default=500)
    ap.add_argument("--producers", type=int, default=100)
    ap.add_argument("--consumers", type=int, default=50)
    ap.add_argument("--groups", type=int, default=10)
    ap.add_argument("--topics", type=int, default=0, help="default: one per group")
    ap.add_argument("--partitions", type=int, default=0, help="per topic; default: one producer each")
    ap.add_argument("--rate", type=float, default=5.0, help="Produce requests a second per producer")
    ap.add_argument("--batch-records", type=int, default=5)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--no-idempotence", dest="idempotence", action="store_false")
    ap.add_argument("--metadata-interval", type=float, default=30.0, help="s between an idle client's Metadata")
    ap.add_argument("--real-clients", type=int, default=5, help="confluent-kafka producers and consumers (0: none)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    ap.add_argument("--warmup", type=float, default=5.0)
    ap.add_argument("--processes", type=int, default=2, help="load generator processes")
    ap.add_argument("--profile", metavar="DIR", help="record the broker with py-spy during the window (raw stacks)")
    ap.add_argument("--override", action="append", default=[], metavar="KEY=VALUE", help="broker property")
    ap.add_argument("--role", choices=["gen", "real"], help=argparse.SUPPRESS)
    ap.add_argument("--config", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.role == "gen":
        generator_main(json.loads(args.config))
    elif args.role == "real":
        real_main(json.loads(args.config))
    else:
        with tempfile.TemporaryDirectory(prefix="many-clients-") as tmp:
            result = run(args, Path(tmp))
        if args.profile:
            import profile_broker
            raw = (Path(args.profile) / "many_clients.txt").read_text()
            result["profile"] = profile_broker.hotspots(raw, 30)
        print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
