"""Capture the first requests real clients send, as golden files for tests/protocol/test_golden.py.

    python tools/capture_golden.py [--out tests/protocol/golden] [--timeout 20]

A tiny fake broker (asyncio, 127.0.0.1, an ephemeral port) answers with our own codec just
enough for each client to get to its target requests: ApiVersions, Metadata (real topic ids),
FindCoordinator, InitProducerId, Produce, JoinGroup (answered with a retriable error: only the
first one matters), ConsumerGroupHeartbeat, ShareGroupHeartbeat (with an assignment, so that
the share consumer fetches) and ShareFetch. Every scenario is bounded in time; the first frame
of each API per client is saved as `<client>_<Api>_v<version>.bin` (size prefix included),
and `index.json` lists them with the client versions.

Clients are told apart by their default client ids: `rdkafka` (confluent-kafka),
`kafka-python-*` and `aiokafka-*`.
"""

from __future__ import annotations

import argparse
import asyncio
import faulthandler
import json
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from protocol.frames import (  # noqa: E402
    FrameSplitter,
    decode_request_header,
    encode_response_header,
    response_header_version,
    size_prefix,
)
from protocol.messages import CLASSES, REQUESTS, RESPONSES, decode_request, encode  # noqa: E402


def message(name: str) -> Any:
    """A message class, typed loosely: its nested classes are generated attributes."""
    return CLASSES[name]


TOPIC = "golden-topic"
NODE_ID = 1
CLUSTER_ID = "golden-cluster-0000000"


def topic_id(name: str) -> uuid.UUID:
    return uuid.uuid5(uuid.NAMESPACE_URL, "golden/" + name)


def variant_of(api_key: int, request: Any) -> str | None:
    """A second kind of request of the same API worth its own golden file, if this is one."""
    if api_key == 3 and request.topics is None:
        return "all_topics"
    if api_key == 3 and request.topics and any(t.name is None for t in request.topics):
        return "by_topic_id"  # KIP-848 and share consumers look assigned topics up by id
    return None


def client_of(client_id: str | None) -> str | None:
    cid = client_id or ""
    if cid.startswith("rdkafka"):
        return "confluent-kafka"
    if cid.startswith("kafka-python"):
        return "kafka-python"
    if cid.startswith("aiokafka"):
        return "aiokafka"
    return None


class FakeBroker:
    """One node that is the leader of everything and the coordinator of every group."""

    def __init__(self) -> None:
        self.port = 0
        self.topics: dict[str, uuid.UUID] = {}
        self.captured: dict[tuple[str, int, str], dict[str, Any]] = {}
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self._ready = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping: asyncio.Event | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._next_offset = 0

    # ----- lifecycle ------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("fake broker did not start")

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._serve())

    async def _serve(self) -> None:
        self._stopping = asyncio.Event()
        server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        await self._stopping.wait()
        server.close()
        for w in list(self._writers):  # EOF for every connection task, rather than cancelling them
            w.transport.abort()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        await asyncio.wait(tasks, timeout=5) if tasks else None

    def stop(self) -> None:
        if self.loop is not None and self._stopping is not None:
            self.loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    def has(self, client: str, api_keys: list[int | tuple[int, str]]) -> bool:
        wanted = [(client, *k) if isinstance(k, tuple) else (client, k, "") for k in api_keys]
        with self.lock:
            return all(w in self.captured for w in wanted)

    def wait_for(self, client: str, api_keys: list[int | tuple[int, str]], deadline: float) -> bool:
        while not self.has(client, api_keys):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    # ----- connections ----------------------------------------------------------------------
    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        splitter = FrameSplitter()
        self._writers.add(writer)
        try:
            while data := await reader.read(65536):
                for frame in splitter.feed(data):
                    response = await self._handle(bytes(frame))
                    if response is not None:
                        writer.write(response)
                        await writer.drain()
        except ConnectionError:
            pass
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _handle(self, frame: bytes) -> bytes | None:
        hdr = decode_request_header(frame)
        client = client_of(hdr.client_id)
        request = decode_request(hdr.api_key, hdr.api_version, memoryview(frame)[hdr.body_offset :])
        with self.lock:
            for variant in ("", variant_of(hdr.api_key, request)):
                if client is None or variant is None:
                    continue
                key = (client, hdr.api_key, variant)
                if key not in self.captured:
                    self.captured[key] = {
                        "frame": size_prefix(len(frame)) + frame,
                        "api_version": hdr.api_version,
                        "client_id": hdr.client_id,
                    }
        handler = HANDLERS.get(hdr.api_key, FakeBroker._default)
        body = await handler(self, request, hdr.api_version)
        if body is None:
            return None
        payload = encode_response_header(
            hdr.correlation_id, response_header_version(hdr.api_key, hdr.api_version)
        )
        payload += encode(body, hdr.api_version)
        return size_prefix(len(payload)) + payload

    # ----- handlers -------------------------------------------------------------------------
    async def _default(self, request: Any, version: int) -> Any:
        cls = RESPONSES[REQUESTS_BY_CLASS[type(request)]].root_class
        return cls()

    async def _api_versions(self, request: Any, version: int) -> Any:
        R = message("ApiVersionsResponse")
        keys = [
            R.ApiVersion(
                api_key=k, min_version=c.spec.valid_versions.lo, max_version=c.spec.valid_versions.hi
            )
            for k, c in sorted(REQUESTS.items())  # every API we have a codec for (no telemetry)
        ]
        return R(error_code=0, api_keys=keys, throttle_time_ms=0)

    def _topic(self, name: str) -> uuid.UUID:
        return self.topics.setdefault(name, topic_id(name))

    async def _metadata(self, request: Any, version: int) -> Any:
        R = message("MetadataResponse")
        by_id = {v: k for k, v in self.topics.items()}
        names: list[tuple[str | None, uuid.UUID]] = []
        if request.topics is None:
            names = list(self.topics.items())
        else:
            for t in request.topics:
                if t.name is None:
                    names.append((by_id.get(t.topic_id), t.topic_id))
                else:
                    names.append((t.name, self._topic(t.name)))
        topics = []
        for name, tid in names:
            if name is None:
                topics.append(R.MetadataResponseTopic(error_code=100, name=None, topic_id=tid))
                continue
            part = R.MetadataResponsePartition(
                error_code=0,
                partition_index=0,
                leader_id=NODE_ID,
                leader_epoch=0,
                replica_nodes=[NODE_ID],
                isr_nodes=[NODE_ID],
            )
            topics.append(R.MetadataResponseTopic(error_code=0, name=name, topic_id=tid, partitions=[part]))
        broker = R.MetadataResponseBroker(node_id=NODE_ID, host="127.0.0.1", port=self.port, rack=None)
        return R(brokers=[broker], cluster_id=CLUSTER_ID, controller_id=NODE_ID, topics=topics)

    async def _find_coordinator(self, request: Any, version: int) -> Any:
        R = message("FindCoordinatorResponse")
        if version >= 4:
            coordinators = [
                R.Coordinator(key=k, node_id=NODE_ID, host="127.0.0.1", port=self.port, error_code=0)
                for k in request.coordinator_keys
            ]
            return R(coordinators=coordinators)
        return R(error_code=0, node_id=NODE_ID, host="127.0.0.1", port=self.port)

    async def _init_producer_id(self, request: Any, version: int) -> Any:
        return message("InitProducerIdResponse")(error_code=0, producer_id=1000, producer_epoch=0)

    async def _produce(self, request: Any, version: int) -> Any:
        if request.acks == 0:
            return None
        R = message("ProduceResponse")
        topics = []
        for t in request.topic_data:
            parts = []
            for p in t.partition_data:
                parts.append(
                    R.PartitionProduceResponse(index=p.index, error_code=0, base_offset=self._next_offset)
                )
                self._next_offset += 1
            topics.append(R.TopicProduceResponse(name=t.name, topic_id=t.topic_id, partition_responses=parts))
        return R(responses=topics)

    async def _join_group(self, request: Any, version: int) -> Any:
        # only the first JoinGroup is wanted: keep the client retrying until it is closed
        await asyncio.sleep(0.2)
        return message("JoinGroupResponse")(error_code=14, generation_id=-1, protocol_name="", member_id="")

    async def _consumer_group_heartbeat(self, request: Any, version: int) -> Any:
        R = message("ConsumerGroupHeartbeatResponse")
        epoch = -1 if request.member_epoch < 0 else request.member_epoch + 1
        return R(
            error_code=0,
            member_id=request.member_id,
            member_epoch=epoch,
            heartbeat_interval_ms=1000,
            assignment=R.Assignment(topic_partitions=[]),
        )

    async def _share_group_heartbeat(self, request: Any, version: int) -> Any:
        R = message("ShareGroupHeartbeatResponse")
        tp = R.TopicPartitions(topic_id=self._topic(TOPIC), partitions=[0])
        epoch = -1 if request.member_epoch < 0 else request.member_epoch + 1
        return R(
            error_code=0,
            member_id=request.member_id,
            member_epoch=epoch,
            heartbeat_interval_ms=1000,
            assignment=R.Assignment(topic_partitions=[tp]),
        )

    async def _share_fetch(self, request: Any, version: int) -> Any:
        R = message("ShareFetchResponse")
        await asyncio.sleep(min(request.max_wait_ms, 200) / 1000)
        leader = R.LeaderIdAndEpoch(leader_id=NODE_ID, leader_epoch=0)
        responses = [
            R.ShareFetchableTopicResponse(
                topic_id=t.topic_id,
                partitions=[
                    R.PartitionData(partition_index=p.partition_index, current_leader=leader, records=b"")
                    for p in t.partitions
                ],
            )
            for t in request.topics
        ]
        node = R.NodeEndpoint(node_id=NODE_ID, host="127.0.0.1", port=self.port, rack=None)
        return R(error_code=0, acquisition_lock_timeout_ms=30000, responses=responses, node_endpoints=[node])

    async def _fetch(self, request: Any, version: int) -> Any:
        await asyncio.sleep(min(request.max_wait_ms, 200) / 1000)
        return message("FetchResponse")(error_code=0, session_id=0, responses=[])


REQUESTS_BY_CLASS = {c.root_class: k for k, c in REQUESTS.items()}
HANDLERS: dict[int, Callable[..., Any]] = {
    0: FakeBroker._produce,
    1: FakeBroker._fetch,
    3: FakeBroker._metadata,
    10: FakeBroker._find_coordinator,
    11: FakeBroker._join_group,
    18: FakeBroker._api_versions,
    22: FakeBroker._init_producer_id,
    68: FakeBroker._consumer_group_heartbeat,
    76: FakeBroker._share_group_heartbeat,
    78: FakeBroker._share_fetch,
}

# ----- client scenarios ------------------------------------------------------------------------


def confluent_producer(addr: str, broker: FakeBroker, deadline: float) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": addr})
    p.produce(TOPIC, key=b"golden-key", value=b"golden-value")
    p.flush(max(0.1, deadline - time.monotonic()))
    p.list_topics(timeout=max(0.1, deadline - time.monotonic()))  # Metadata for all topics
    p.close()


def _confluent_consume(
    consumer: Any, client_keys: list[int | tuple[int, str]], broker: FakeBroker, deadline: float
) -> None:
    consumer.subscribe([TOPIC])
    while time.monotonic() < deadline and not broker.has("confluent-kafka", client_keys):
        consumer.poll(0.1)
    consumer.close()


def confluent_classic_consumer(addr: str, broker: FakeBroker, deadline: float) -> None:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": addr, "group.id": "golden-classic", "auto.offset.reset": "earliest"})
    _confluent_consume(c, [11], broker, deadline)


def confluent_kip848_consumer(addr: str, broker: FakeBroker, deadline: float) -> None:
    from confluent_kafka import Consumer

    c = Consumer({"bootstrap.servers": addr, "group.id": "golden-consumer", "group.protocol": "consumer"})
    _confluent_consume(c, [68], broker, deadline)


def confluent_share_consumer(addr: str, broker: FakeBroker, deadline: float) -> None:
    from confluent_kafka import ShareConsumer

    c = ShareConsumer({"bootstrap.servers": addr, "group.id": "golden-share"})
    _confluent_consume(c, [76, 78, (3, "by_topic_id")], broker, deadline)


def kafka_python_producer(addr: str, broker: FakeBroker, deadline: float) -> None:
    from kafka import KafkaProducer

    p = KafkaProducer(bootstrap_servers=addr)
    p.send(TOPIC, key=b"golden-key", value=b"golden-value")
    p.flush(timeout=max(0.1, deadline - time.monotonic()))
    p.close(timeout=2)


def kafka_python_consumer(addr: str, broker: FakeBroker, deadline: float) -> None:
    from kafka import KafkaConsumer

    c = KafkaConsumer(TOPIC, bootstrap_servers=addr, group_id="golden-classic")
    c.topics()  # Metadata for all topics
    while time.monotonic() < deadline and not broker.has("kafka-python", [11]):
        c.poll(timeout_ms=100)
    c.close(autocommit=False)


async def _aiokafka_producer(addr: str, deadline: float) -> None:
    from aiokafka import AIOKafkaProducer

    p = AIOKafkaProducer(bootstrap_servers=addr)
    await p.start()
    try:
        await asyncio.wait_for(
            p.send_and_wait(TOPIC, key=b"golden-key", value=b"golden-value"),
            max(0.1, deadline - time.monotonic()),
        )
    finally:
        await p.stop()


async def _aiokafka_consumer(addr: str, broker: FakeBroker, deadline: float) -> None:
    from aiokafka import AIOKafkaConsumer

    c = AIOKafkaConsumer(bootstrap_servers=addr, group_id="golden-classic")
    await c.start()  # with topics given here, start() would wait for an assignment
    c.subscribe([TOPIC])
    try:
        while time.monotonic() < deadline and not broker.has("aiokafka", [11]):
            await asyncio.sleep(0.1)
    finally:
        await asyncio.wait_for(c.stop(), 5)


def aiokafka_producer(addr: str, broker: FakeBroker, deadline: float) -> None:
    asyncio.run(_aiokafka_producer(addr, deadline))


def aiokafka_consumer(addr: str, broker: FakeBroker, deadline: float) -> None:
    asyncio.run(_aiokafka_consumer(addr, broker, deadline))


# client, scenario, the API keys it must have captured (for that client) when done
SCENARIOS: list[tuple[str, Callable[[str, FakeBroker, float], None], list[int | tuple[int, str]]]] = [
    ("confluent-kafka", confluent_producer, [18, 3, 0, (3, "all_topics")]),
    ("confluent-kafka", confluent_classic_consumer, [10, 11]),
    ("confluent-kafka", confluent_kip848_consumer, [68]),
    ("confluent-kafka", confluent_share_consumer, [76, 78, (3, "by_topic_id")]),
    ("kafka-python", kafka_python_producer, [18, 3, 22, 0]),
    ("kafka-python", kafka_python_consumer, [10, 11, (3, "all_topics")]),
    ("aiokafka", aiokafka_producer, [18, 3, 0]),
    ("aiokafka", aiokafka_consumer, [10, 11]),
]


def client_versions() -> dict[str, str]:
    import aiokafka
    import confluent_kafka
    import kafka

    return {
        "confluent-kafka": "%s (librdkafka %s)"
        % (confluent_kafka.__version__, confluent_kafka.libversion()[0]),
        "kafka-python": kafka.__version__,
        "aiokafka": aiokafka.__version__,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out", type=Path, default=Path(__file__).resolve().parent.parent / "tests/protocol/golden"
    )
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per scenario")
    parser.add_argument("--only", nargs="*", help="scenario names to run (default: all)")
    args = parser.parse_args(argv)
    # a client stuck in close() must not hang the capture: dump the stacks and exit
    faulthandler.dump_traceback_later(args.timeout * (len(SCENARIOS) + 1), exit=True)

    broker = FakeBroker()
    broker.start()
    addr = "127.0.0.1:%d" % broker.port
    failures = []
    for client, scenario, keys in SCENARIOS:
        if args.only and scenario.__name__ not in args.only:
            continue
        print("running %s" % scenario.__name__, file=sys.stderr)
        deadline = time.monotonic() + args.timeout
        try:
            scenario(addr, broker, deadline)
        except Exception as exc:  # a client error after the capture is not ours to fix
            print("%s: %s raised %r" % (client, scenario.__name__, exc), file=sys.stderr)
        if not broker.wait_for(client, keys, deadline):
            failures.append("%s: %s did not send %s" % (client, scenario.__name__, keys))
    broker.stop()

    versions = client_versions()
    args.out.mkdir(parents=True, exist_ok=True)
    index = []
    with broker.lock:
        captured = sorted(broker.captured.items())
    for (client, key, variant), c in captured:
        api = REQUESTS[key].spec.name.removesuffix("Request")
        name = "%s_%s_v%d%s.bin" % (client, api, c["api_version"], "_" + variant if variant else "")
        (args.out / name).write_bytes(c["frame"])
        index.append(
            {
                "file": name,
                "client": client,
                "client_version": versions[client],
                "client_id": c["client_id"],
                "api": api,
                "api_key": key,
                "api_version": c["api_version"],
                "variant": variant,
            }
        )
    (args.out / "index.json").write_text(json.dumps(index, indent=1) + "\n")
    faulthandler.cancel_dump_traceback_later()
    for line in failures:
        print(line, file=sys.stderr)
    print("captured %d frames into %s" % (len(index), args.out))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
