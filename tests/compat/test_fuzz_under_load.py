"""Bad input under load (issue 16): 100 connections throw garbage at the broker while real
clients produce and consume.

The broker runs as its own process (`python -m broker`, uvloop, JSON log lines), so a crash
shows as an exit and everything it logs can be read. While idempotent producers (acks=all) of
confluent-kafka and kafka-python write keyed records and a confluent-kafka consumer group reads
them, 100 raw connections send seeded garbage: random bytes, a valid size prefix with a random
body, valid requests (ApiVersions, Metadata, Produce) cut short or with bytes changed, unknown
API keys, oversized and negative sizes. Each piece ends with a probe (an ApiVersions request: answered, or the broker
closed the connection), a half-close (the broker must close), a close or a reset; a closed
connection is opened again for the next piece. The garbage Produce requests go to a topic of
their own, so the real topic holds only what the real producers sent.

The phases are tied by conditions, never by time: the producers write their records in chunks,
chunk j only once j tenths of the garbage are out, and every garbage connection waits halfway
until the group consumer has received a record, so producing and consuming overlap the attack
however fast or slow the machine is.

Afterwards: the broker still runs and answers a fresh connection, and a connection opened
before the attack is still served; the real clients saw no error; every acknowledged record is
in the topic exactly once at its acknowledged offset and nothing else is; the group consumed
them all; no garbage connection hung, and the broker holds no socket of one (those the client
dropped included); the broker logged no error, no traceback and no UNKNOWN_SERVER_ERROR, only
"closing connection: ..." warnings, and stopped cleanly. The seed is printed; set FUZZ_SEED to
try another (the same seed sends the same bytes and gets the same outcomes).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

confluent_kafka = pytest.importorskip("confluent_kafka")
from confluent_kafka import Consumer, Producer, TopicPartition  # noqa: E402
from kafka import KafkaProducer  # noqa: E402

from broker.apis import APIS, load_handlers  # noqa: E402
from protocol import frames  # noqa: E402
from protocol import messages as M  # noqa: E402
from protocol.records import build_batch  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess, RawClient, wait_for  # noqa: E402

SEED = int(os.environ.get("FUZZ_SEED", "16"))
CONNECTIONS = 100
PIECES_PER_CONNECTION = 60
RECORDS = 3000  # from confluent-kafka
KAFKA_PYTHON_RECORDS = 600
CHUNKS = 10  # the producers' records go out in this many chunks, spread over the attack
PARTITIONS = 4
TOPIC = "fuzz-load"  # the real clients' topic
SINK = "garbage-sink"  # where garbage Produce requests point (no byte change turns one name into the other)
MAX_REQUEST = 2_000_000  # socket.request.max.bytes: above any request of the real producers (1 MB batches)
WAIT_S = 20.0  # no single wait for the broker takes longer unless it hangs
PROBE_ID = 0x50524F42  # the probe's correlation id ("PROB")
PROBE = frames.encode_request_header(18, 0, PROBE_ID, "probe") + M.encode(M.ApiVersionsRequest(), 0)
PROBE_FRAME = struct.pack(">i", len(PROBE)) + PROBE
API_VERSIONS, METADATA, PRODUCE = 18, 3, 0


# -- the garbage: generated up front from the seed, so every run sends the same bytes ---------------


@dataclass(frozen=True)
class Piece:
    kind: str
    data: bytes
    ending: str  # probe | half-close | close | reset
    must_close: bool  # the broker cannot accept it: a probe behind it must not be answered

    def short(self) -> str:
        return "%s then %s, %d bytes %r..." % (self.kind, self.ending, len(self.data), self.data[:24])


def valid_requests() -> list[bytes]:
    """Request bodies (header included, no size prefix) of the three APIs, at several versions."""
    out = []
    for v in range(5):
        req = M.ApiVersionsRequest(client_software_name="fuzz", client_software_version="1") if v >= 3 else M.ApiVersionsRequest()
        out.append(frames.encode_request_header(API_VERSIONS, v, 1000 + v, "fuzz") + M.encode(req, v))
    R = M.MetadataRequest
    for v in range(1, 13):
        for topics in (None, [R.MetadataRequestTopic(name=SINK)], [R.MetadataRequestTopic(name="absent")]):
            req = R(topics=topics, allow_auto_topic_creation=False)
            out.append(frames.encode_request_header(METADATA, v, 2000 + v, "fuzz") + M.encode(req, v))
    P = M.ProduceRequest
    for v in range(3, 10):
        for acks in (-1, 1):
            records = build_batch([(b"gk%d" % i, b"garbage-%d" % i) for i in range(1 + v % 3)])
            data = P.TopicProduceData(name=SINK, partition_data=[P.PartitionProduceData(index=0, records=records)])
            req = P(transactional_id=None, acks=acks, timeout_ms=30000, topic_data=[data])
            out.append(frames.encode_request_header(PRODUCE, v, 3000 + v, "fuzz") + M.encode(req, v))
    return out


def stream_state(data: bytes) -> str:
    """What the broker's frame splitter makes of `data`: invalid (a negative or oversized size:
    closed), partial (it waits for more bytes) or complete (whole frames only)."""
    pos = 0
    while len(data) - pos >= 4:
        (size,) = struct.unpack_from(">i", data, pos)
        if size < 0 or size > MAX_REQUEST:
            return "invalid"
        if pos + 4 + size > len(data):
            return "partial"
        pos += 4 + size
    return "complete" if pos == len(data) else "partial"


def framed(body: bytes) -> bytes:
    return struct.pack(">i", len(body)) + body


def garbage(rng: random.Random, requests: list[bytes], unknown_keys: list[int]) -> Piece:
    kind = rng.choice(["random", "random-body", "truncated", "cut-body", "mutated", "mutated", "unknown-api",
                       "oversized", "negative", "valid"])
    valid = rng.choice(requests)
    if kind == "random":  # no frame boundary at all
        data = rng.randbytes(rng.randint(1, 64))
    elif kind == "random-body":  # a right size, random contents
        data = framed(rng.randbytes(rng.choice([0, 1, 2, 6, 9, 17, 40, 200])))
    elif kind == "truncated":  # a valid request cut on the wire: its size promises more
        cut = rng.randrange(1, 4 + len(valid))
        data = framed(valid)[:cut]
    elif kind == "cut-body":  # a whole frame whose request is cut short
        data = framed(valid[: rng.randrange(len(valid))])
    elif kind == "mutated":  # bytes changed after the API key (a changed key is "unknown-api")
        buf = bytearray(valid)
        for _ in range(rng.randint(1, 3)):
            pos = rng.randrange(2, len(buf))
            buf[pos] = rng.choice([0x00, 0x7F, 0x80, 0xFF, rng.randrange(256), buf[pos] ^ (1 << rng.randrange(8))])
        data = framed(bytes(buf))
    elif kind == "unknown-api":
        data = framed(struct.pack(">h", rng.choice(unknown_keys)) + valid[2:])
    elif kind == "oversized":
        data = struct.pack(">i", rng.randint(MAX_REQUEST + 1, 2**31 - 1)) + rng.randbytes(rng.randint(0, 32))
    elif kind == "negative":
        data = struct.pack(">i", rng.randint(-(2**31), -1)) + rng.randbytes(rng.randint(0, 32))
    else:
        data = framed(valid)
    state = stream_state(data)
    if state == "partial":  # the broker waits for the rest: only an end of stream ends it
        ending = rng.choice(["half-close", "half-close", "close", "reset"])
    else:
        ending = rng.choice(["probe"] * 6 + ["half-close", "close", "reset"])
    return Piece(kind, data, ending, must_close=state == "invalid" or kind == "unknown-api")


def pieces_of(connection: int) -> list[Piece]:
    load_handlers()
    unknown = [k for k in (-1, 4, 5, 6, 7, 38, 99, 1000, 32767, -32768) if k not in APIS]
    rng = random.Random("%d-%d" % (SEED, connection))
    requests = valid_requests()
    return [garbage(rng, requests, unknown) for _ in range(PIECES_PER_CONNECTION)]


# -- the attack: one asyncio loop in a thread, one task per connection ------------------------------


@dataclass
class Attack:
    port: int
    consumer_count: Callable[[], int]  # records the group consumer has received so far
    progress: threading.Condition = field(default_factory=threading.Condition)
    done_pieces: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    connects: int = 0
    failures: list[str] = field(default_factory=list)
    consumed_when_done: int = 0  # records the group consumer had when the garbage ended
    _consumed: threading.Event = field(default_factory=threading.Event)
    _consumed_here: asyncio.Event | None = None  # the same news on the attack's loop
    _loop: asyncio.AbstractEventLoop | None = None

    def consumer_received(self) -> None:
        """Called by the group consumer's thread at its first record."""
        with self.progress:
            self._consumed.set()
            if self._loop is not None and self._consumed_here is not None:
                self._loop.call_soon_threadsafe(self._consumed_here.set)

    def run(self) -> None:
        try:
            asyncio.run(self._all())
        except Exception as exc:  # the test reports it
            self.failures.append(repr(exc))

    async def _all(self) -> None:
        with self.progress:
            self._loop, self._consumed_here = asyncio.get_running_loop(), asyncio.Event()
            if self._consumed.is_set():
                self._consumed_here.set()
        await asyncio.gather(*(self._connection(i, pieces_of(i)) for i in range(CONNECTIONS)))
        self.consumed_when_done = self.consumer_count()

    def _done(self, outcome: str) -> None:
        with self.progress:
            self.done_pieces += 1
            self.outcomes[outcome] += 1
            self.progress.notify_all()

    async def _connection(self, index: int, pieces: list[Piece]) -> None:
        stream: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        n = 0
        try:
            for n, piece in enumerate(pieces):
                if n == len(pieces) // 2 and self._consumed_here is not None:
                    # halfway: on only once the group consumer is reading, so that it reads under attack
                    try:
                        await asyncio.wait_for(self._consumed_here.wait(), WAIT_S)
                    except TimeoutError:
                        self.failures.append("the group consumer received nothing")
                        return
                if stream is None:
                    stream = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", self.port), WAIT_S)
                    self.connects += 1
                outcome = await asyncio.wait_for(self._send(stream, piece), WAIT_S)
                if outcome == "answered" and piece.must_close:
                    self.failures.append("connection %d piece %d was accepted: %s" % (index, n, piece.short()))
                if outcome != "answered":
                    stream = None
                self._done(outcome)
        except TimeoutError:
            self.failures.append("connection %d hung at piece %d: %s" % (index, n, pieces[n].short()))
        except Exception as exc:  # reported by the test
            self.failures.append("connection %d: %r" % (index, exc))
        finally:
            if stream is not None:
                stream[1].close()

    async def _send(self, stream: tuple[asyncio.StreamReader, asyncio.StreamWriter], piece: Piece) -> str:
        """Send a piece and end it as it says: answered (the probe came back), closed (the broker
        closed the connection) or dropped (this side closed it)."""
        reader, writer = stream
        try:
            writer.write(piece.data + (PROBE_FRAME if piece.ending == "probe" else b""))
            await writer.drain()
            if piece.ending in ("close", "reset"):
                if piece.ending == "reset":
                    writer.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.close()
                return "dropped"
            if piece.ending == "half-close":
                writer.write_eof()
            while True:  # responses to the garbage, if any, then the probe's or the end of stream
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                if not 4 <= size <= 64 << 20:
                    raise AssertionError("a response frame of %d bytes" % size)
                body = await reader.readexactly(size)
                if piece.ending == "probe" and struct.unpack_from(">i", body)[0] == PROBE_ID:
                    return "answered"
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            return "closed"


# -- the real clients ---------------------------------------------------------------------------------


def chunks(attack: Attack, count: int, errors: list[Any]) -> Iterator[range]:
    """range(count) in CHUNKS pieces, piece j once j/CHUNKS of the garbage is out."""
    total = CONNECTIONS * PIECES_PER_CONNECTION
    for j in range(CHUNKS):
        with attack.progress:
            if not attack.progress.wait_for(lambda j=j: attack.done_pieces >= j * total // CHUNKS or attack.failures,
                                            WAIT_S * 2):
                errors.append("the attack made no progress")
                return
        yield range(j * count // CHUNKS, (j + 1) * count // CHUNKS)


def produce_confluent(bootstrap: str, attack: Attack, acked: dict[tuple[bytes, bytes], tuple[int, int]],
                      errors: list[Any]) -> None:
    p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                  "message.timeout.ms": 60000, "error_cb": errors.append})

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            acked[(msg.key(), msg.value())] = (msg.partition(), msg.offset())
        else:
            errors.append(err)

    for part in chunks(attack, RECORDS, errors):
        for i in part:
            p.produce(TOPIC, key=b"key-%d" % (i % 97), value=b"value-%d" % i, on_delivery=on_delivery)
            p.poll(0)
    if p.flush(60) != 0:
        errors.append("flush left records undelivered")


def produce_kafka_python(bootstrap: str, attack: Attack, acked: dict[tuple[bytes, bytes], tuple[int, int]],
                         errors: list[Any]) -> None:
    p = KafkaProducer(bootstrap_servers=bootstrap, acks="all", enable_idempotence=True, linger_ms=5)
    try:
        sent = []
        for part in chunks(attack, KAFKA_PYTHON_RECORDS, errors):
            for i in part:
                key, value = b"kp-%d" % (i % 13), b"kp-value-%d" % i
                sent.append(((key, value), p.send(TOPIC, key=key, value=value)))
        p.flush(60)
        for kv, future in sent:
            metadata = future.get(timeout=WAIT_S)
            acked[kv] = (metadata.partition, metadata.offset)
    finally:
        p.close(10)


def consume_group(bootstrap: str, stop: threading.Event, attack: Attack, got: list[tuple[bytes, bytes]],
                  errors: list[Any]) -> None:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-group", "auto.offset.reset": "earliest",
                  "error_cb": errors.append})
    try:
        c.subscribe([TOPIC])
        while not stop.is_set():
            for msg in c.consume(num_messages=500, timeout=0.2):
                if msg.error() is not None:
                    errors.append(msg.error())
                    continue
                got.append((msg.key(), msg.value()))
                if len(got) == 1:
                    attack.consumer_received()
    finally:
        c.close()


def read_topic(bootstrap: str) -> list[tuple[bytes, bytes, int, int]]:
    """Every record of every partition, from its start to the high watermark (assigned, no group)."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "fuzz-check", "enable.auto.commit": False})
    try:
        highs = {p: c.get_watermark_offsets(TopicPartition(TOPIC, p), timeout=10)[1] for p in range(PARTITIONS)}
        c.assign([TopicPartition(TOPIC, p, confluent_kafka.OFFSET_BEGINNING) for p in range(PARTITIONS)])
        out: list[tuple[bytes, bytes, int, int]] = []
        next_offset = dict.fromkeys(highs, 0)
        deadline = time.monotonic() + WAIT_S
        while any(next_offset[p] < highs[p] for p in highs) and time.monotonic() < deadline:
            for msg in c.consume(num_messages=1000, timeout=0.5):
                assert msg.error() is None, msg.error()
                out.append((msg.key(), msg.value(), msg.partition(), msg.offset()))
                next_offset[msg.partition()] = msg.offset() + 1
        assert next_offset == highs, (next_offset, highs)
        return out
    finally:
        c.close()


def broker_log_problems(output: str) -> list[str]:
    """Lines the broker should not have logged under garbage: errors, tracebacks, unknown server
    errors, or warnings other than closing a connection."""
    problems = []
    for line in output.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            problems.append(line)  # not a log line: something wrote to stderr behind structlog's back
            continue
        level = entry.get("level")
        text = str(entry.get("event", ""))
        failed = level in ("error", "critical", "exception") or "Traceback" in line or "UNKNOWN_SERVER_ERROR" in line
        if failed or (level == "warning" and not text.startswith("closing connection: ")):
            problems.append(line)
    return problems


def broker_sockets(pid: int) -> int:
    """Sockets the broker process holds open (listening, connected, its own)."""
    fd_dir = Path("/proc/%d/fd" % pid)
    count = 0
    for fd in fd_dir.iterdir():
        try:
            count += os.readlink(fd).startswith("socket:")
        except FileNotFoundError:  # closed while we looked
            pass
    return count


def client_connections(port: int) -> int:
    """Connections to `port` open on the client side (every client of the test is on 127.0.0.1)."""
    established = "01"
    count = 0
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if int(fields[2].split(":")[1], 16) == port and fields[3] == established:
            count += 1
    return count


def reporting(target: Callable[..., None], errors: list[Any], *args: Any) -> threading.Thread:
    """A thread running target(*args) whose exception, if any, lands in `errors`."""

    def run() -> None:
        try:
            target(*args)
        except Exception as exc:  # the test reports it
            errors.append(exc)

    return threading.Thread(target=run, name=target.__name__)


def api_versions_and_metadata(c: RawClient) -> None:
    assert c.call(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1")).error_code == 0
    response = c.call(METADATA, 12, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(name=TOPIC)]))
    assert [(t.name, t.error_code, len(t.partitions)) for t in response.topics] == [(TOPIC, 0, PARTITIONS)]


@pytest.mark.timeout(120)
def test_garbage_on_100_connections_while_clients_produce_and_consume(tmp_path: Path) -> None:
    print("FUZZ_SEED=%d" % SEED)
    broker = BrokerProcess(tmp_path / "data", overrides={"log.format": "json",
                                                          "socket.request.max.bytes": str(MAX_REQUEST)}).start()
    assert broker.proc is not None
    pid = broker.proc.pid
    stop = threading.Event()
    threads: list[threading.Thread] = []
    try:
        create_topic(broker, TOPIC, PARTITIONS)
        create_topic(broker, SINK, 1)
        bystander = RawClient(broker.port, "bystander")  # open across the whole attack
        api_versions_and_metadata(bystander)
        own_sockets = broker_sockets(pid) - client_connections(broker.port)  # listener and the like

        acked: dict[tuple[bytes, bytes], tuple[int, int]] = {}
        group_got: list[tuple[bytes, bytes]] = []
        attack = Attack(broker.port, lambda: len(group_got))
        producer_errors: list[Any] = []
        consumer_errors: list[Any] = []
        threads = [
            threading.Thread(target=attack.run, name="garbage"),
            reporting(produce_confluent, producer_errors, broker.bootstrap, attack, acked, producer_errors),
            reporting(produce_kafka_python, producer_errors, broker.bootstrap, attack, acked, producer_errors),
            reporting(consume_group, consumer_errors, broker.bootstrap, stop, attack, group_got, consumer_errors),
        ]
        for t in threads:
            t.start()
        for t in threads[:3]:
            t.join(90)
            assert not t.is_alive(), "%s did not finish" % t.name
        consumed_during_attack = attack.consumed_when_done
        wait_for(lambda: set(group_got) >= acked.keys() or consumer_errors, timeout=WAIT_S,
                 what="the group consumer to receive every acknowledged record")
        stop.set()
        threads[3].join(30)

        print("garbage: %s, %d connections opened; the group consumer had %d records when the garbage ended"
              % (dict(sorted(attack.outcomes.items())), attack.connects, consumed_during_attack))
        assert not attack.failures, "\n".join(attack.failures[:10])
        assert attack.outcomes.total() == CONNECTIONS * PIECES_PER_CONNECTION
        assert attack.outcomes["closed"] > 0 and attack.outcomes["answered"] > 0
        assert not producer_errors, producer_errors[:5]
        assert not consumer_errors, consumer_errors[:5]
        assert consumed_during_attack > 0
        assert len(acked) == RECORDS + KAFKA_PYTHON_RECORDS

        # the broker is up; the connection opened before the attack and a new one are served
        assert broker.proc.poll() is None
        api_versions_and_metadata(bystander)
        fresh = RawClient(broker.port, "fresh")
        api_versions_and_metadata(fresh)
        fresh.close()

        # every acknowledged record exactly once, where its acknowledgement said; nothing else
        stored = read_topic(broker.bootstrap)
        counts = Counter((key, value) for key, value, _, _ in stored)
        assert not [kv for kv, n in counts.items() if n > 1]
        assert {(k, v): (p, o) for k, v, p, o in stored} == acked
        assert set(group_got) == set(acked)

        # the broker let go of every garbage connection, those the client dropped included
        wait_for(lambda: broker_sockets(pid) - client_connections(broker.port) == own_sockets, timeout=WAIT_S,
                 what="the broker to hold only the sockets of live connections")
        bystander.close()
    finally:
        stop.set()
        for t in threads:
            t.join(30)
        rc = broker.stop()
    assert rc == 0
    problems = broker_log_problems(broker.output())
    assert not problems, "\n".join(problems[:20])
