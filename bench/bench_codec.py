"""Encode/decode speed of our generated codecs next to kio's, in the same process.

    python bench/bench_codec.py [--json]

Four messages: ProduceRequest v9 (10 partitions), FetchResponse v12 (50 partitions),
MetadataResponse v12 (100 topics x 3 partitions), JoinGroupResponse v7 (100 members).
Our decoders are measured twice: the C accelerated path (protocol._speedups, when built) and the
pure-Python generated path. Both codecs must produce the same bytes for the same message, which
is checked first so that the comparison is like for like. Figures are the best of 15 rounds
(the contenders interleaved, so that load on the machine hits all alike), in microseconds per
operation; `ratio` is ours / kio (below 1 means we are faster).
"""

from __future__ import annotations

import datetime
import importlib
import io
import json
import os
import sys
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from kio.schema.errors import ErrorCode as KErr  # noqa: E402
from kio.schema.types import BrokerId  # noqa: E402
from kio.serial import entity_reader, entity_writer  # noqa: E402
from kio.static.primitive import Records, i16, i32, i64  # noqa: E402

import protocol.messages as m  # noqa: E402
from protocol import accel  # noqa: E402

RNG_SEED = 7
RECORDS = bytes((i * 31 + 7) & 0xFF for i in range(1024))  # an opaque 1 KiB record batch
TOPIC_IDS = [uuid.UUID(int=(i + 1) * 0x9E3779B97F4A7C15) for i in range(100)]


def ms(n: int) -> Any:
    return datetime.timedelta(milliseconds=n)  # kio's i32Timedelta is a timedelta


def produce_request() -> tuple[Any, Any, int, int]:
    K: Any = importlib.import_module("kio.schema.produce.v9.request")  # typed loosely: kio wants its own int types

    M = m.ProduceRequest
    ours = M(
        transactional_id=None,
        acks=-1,
        timeout_ms=30000,
        topic_data=[
            M.TopicProduceData(
                name="topic-%d" % t,
                partition_data=[M.PartitionProduceData(index=p, records=RECORDS) for p in range(5)],
            )
            for t in range(2)
        ],
    )
    theirs = K.ProduceRequest(
        transactional_id=None,
        acks=i16(-1),
        timeout=ms(30000),
        topic_data=tuple(
            K.TopicProduceData(
                name="topic-%d" % t,
                partition_data=tuple(K.PartitionProduceData(index=i32(p), records=Records(RECORDS)) for p in range(5)),
            )
            for t in range(2)
        ),
    )
    return ours, theirs, 0, 9


def fetch_response() -> tuple[Any, Any, int, int]:
    K: Any = importlib.import_module("kio.schema.fetch.v12.response")  # typed loosely: kio wants its own int types

    M = m.FetchResponse
    ours = M(
        throttle_time_ms=0,
        error_code=0,
        session_id=12345,
        responses=[
            M.FetchableTopicResponse(
                topic="topic-%d" % t,
                partitions=[
                    M.PartitionData(
                        partition_index=p,
                        error_code=0,
                        high_watermark=1000 + p,
                        last_stable_offset=1000 + p,
                        log_start_offset=0,
                        aborted_transactions=None,
                        preferred_read_replica=-1,
                        records=RECORDS,
                    )
                    for p in range(10)
                ],
            )
            for t in range(5)
        ],
    )
    theirs = K.FetchResponse(
        throttle_time=ms(0),
        error_code=KErr.none,
        session_id=i32(12345),
        responses=tuple(
            K.FetchableTopicResponse(
                topic="topic-%d" % t,
                partitions=tuple(
                    K.PartitionData(
                        partition_index=i32(p),
                        error_code=KErr.none,
                        high_watermark=i64(1000 + p),
                        last_stable_offset=i64(1000 + p),
                        log_start_offset=i64(0),
                        aborted_transactions=None,
                        preferred_read_replica=i32(-1),
                        records=Records(RECORDS),
                    )
                    for p in range(10)
                ),
            )
            for t in range(5)
        ),
    )
    return ours, theirs, 1, 12


def metadata_response() -> tuple[Any, Any, int, int]:
    K: Any = importlib.import_module("kio.schema.metadata.v12.response")  # typed loosely: kio wants its own int types

    M = m.MetadataResponse
    ours = M(
        throttle_time_ms=0,
        brokers=[M.MetadataResponseBroker(node_id=1, host="localhost", port=9092, rack=None)],
        cluster_id="cluster-abc",
        controller_id=1,
        topics=[
            M.MetadataResponseTopic(
                error_code=0,
                name="topic-%d" % t,
                topic_id=TOPIC_IDS[t],
                is_internal=False,
                partitions=[
                    M.MetadataResponsePartition(
                        error_code=0,
                        partition_index=p,
                        leader_id=1,
                        leader_epoch=0,
                        replica_nodes=[1],
                        isr_nodes=[1],
                        offline_replicas=[],
                    )
                    for p in range(3)
                ],
                topic_authorized_operations=-2147483648,
            )
            for t in range(100)
        ],
    )
    theirs = K.MetadataResponse(
        throttle_time=ms(0),
        brokers=(K.MetadataResponseBroker(node_id=i32(1), host="localhost", port=i32(9092), rack=None),),
        cluster_id="cluster-abc",
        controller_id=i32(1),
        topics=tuple(
            K.MetadataResponseTopic(
                error_code=KErr.none,
                name="topic-%d" % t,
                topic_id=TOPIC_IDS[t],
                is_internal=False,
                partitions=tuple(
                    K.MetadataResponsePartition(
                        error_code=KErr.none,
                        partition_index=i32(p),
                        leader_id=i32(1),
                        leader_epoch=i32(0),
                        replica_nodes=(BrokerId(1),),
                        isr_nodes=(BrokerId(1),),
                        offline_replicas=(),
                    )
                    for p in range(3)
                ),
                topic_authorized_operations=i32(-2147483648),
            )
            for t in range(100)
        ),
    )
    return ours, theirs, 3, 12


def join_group_response() -> tuple[Any, Any, int, int]:
    K: Any = importlib.import_module("kio.schema.join_group.v7.response")  # typed loosely: kio wants its own int types

    M = m.JoinGroupResponse
    meta = bytes(range(40))
    ids = ["consumer-%d-%s" % (i, uuid.UUID(int=i * 7919 + 1)) for i in range(100)]
    ours = M(
        throttle_time_ms=0,
        error_code=0,
        generation_id=3,
        protocol_type="consumer",
        protocol_name="range",
        leader=ids[0],
        member_id=ids[0],
        members=[M.JoinGroupResponseMember(member_id=i, group_instance_id=None, metadata=meta) for i in ids],
    )
    theirs = K.JoinGroupResponse(
        throttle_time=ms(0),
        error_code=KErr.none,
        generation_id=i32(3),
        protocol_type="consumer",
        protocol_name="range",
        leader=ids[0],
        member_id=ids[0],
        members=tuple(K.JoinGroupResponseMember(member_id=i, group_instance_id=None, metadata=meta) for i in ids),
    )
    return ours, theirs, 11, 7


CASES: list[tuple[str, Callable[[], tuple[Any, Any, int, int]]]] = [
    ("ProduceRequest v9 (10 partitions)", produce_request),
    ("FetchResponse v12 (50 partitions)", fetch_response),
    ("MetadataResponse v12 (100x3)", metadata_response),
    ("JoinGroupResponse v7 (100 members)", join_group_response),
]


def calibrate(fn: Callable[[], Any], seconds: float) -> int:
    """How many calls of `fn` take about `seconds`."""
    fn()
    n = 1
    while True:
        t = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t
        if dt > 0.01:
            return max(1, int(n * seconds / dt))
        n *= 2


def best_us(fns: dict[str, Callable[[], Any]], rounds: int = 15, seconds: float = 0.03) -> dict[str, float]:
    """Best per-call time of each function, measured in interleaved rounds (fair on a busy box)."""
    sizes = {name: calibrate(fn, seconds) for name, fn in fns.items()}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(rounds):
        for name, fn in fns.items():
            n = sizes[name]
            t = time.perf_counter()
            for _ in range(n):
                fn()
            best[name] = min(best[name], (time.perf_counter() - t) / n * 1e6)
    return best


def py_decode(codec: Any, version: int, data: bytes) -> Any:
    """Our decode with the pure-Python generated decoder (what runs without the C extension)."""
    obj, pos = codec.py_decoder(version)(data, memoryview(data), 0)
    if pos != len(data):
        raise AssertionError("trailing bytes")
    return obj


def main() -> None:
    rows = []
    for label, build in CASES:
        ours, theirs, api_key, version = build()
        codec = m.codec_of(ours)
        kio_cls = type(theirs)
        write = entity_writer(kio_cls)
        read = entity_reader(kio_cls)

        def kio_encode(write: Any = write, theirs: Any = theirs) -> bytes:
            buf = io.BytesIO()
            write(buf, theirs)
            return buf.getvalue()

        data = m.encode(ours, version)
        if kio_encode() != data:
            raise SystemExit("%s: kio and our encodings differ" % label)
        if codec.spec.type == "request":
            decode = m.decode_request
        else:
            decode = m.decode_response
        assert decode(api_key, version, data) == ours
        assert py_decode(codec, version, data) == ours
        row: dict[str, Any] = {"message": label, "bytes": len(data)}
        contenders: dict[str, Callable[[], Any]] = {
            "encode_ours": partial(m.encode, ours, version),
            "encode_kio": kio_encode,
            "decode_ours": partial(decode, api_key, version, data),
            "decode_ours_py": partial(py_decode, codec, version, data),
            "decode_kio": partial(read, data, 0),
        }
        row.update(best_us(contenders))
        rows.append(row)
    if "--json" in sys.argv:
        print(json.dumps({"speedups": accel.ENABLED, "rows": rows}, indent=2))
        return
    print("C speedups: %s" % ("on" if accel.ENABLED else "off (%s)" % accel.UNAVAILABLE_REASON))
    head = "%-36s %6s | %9s %9s %6s | %9s %9s %9s %6s %6s"
    print(head % ("message", "bytes", "enc ours", "enc kio", "ratio", "dec ours", "dec py", "dec kio", "ratio", "py/kio"))
    for r in rows:
        print(
            "%-36s %6d | %9.1f %9.1f %6.2f | %9.1f %9.1f %9.1f %6.2f %6.2f"
            % (
                r["message"],
                r["bytes"],
                r["encode_ours"],
                r["encode_kio"],
                r["encode_ours"] / r["encode_kio"],
                r["decode_ours"],
                r["decode_ours_py"],
                r["decode_kio"],
                r["decode_ours"] / r["decode_kio"],
                r["decode_ours_py"] / r["decode_kio"],
            )
        )
    print("(microseconds per operation, best of 15 interleaved rounds; ratio = ours / kio, below 1 is faster)")


if __name__ == "__main__":
    main()
