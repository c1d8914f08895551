"""The broker's own CPU per transaction on the server path, without sockets or a second process.

    python bench/txn_path.py [--txns 60] [--rounds 5] [--split 967] [--cprofile FILE]

What librdkafka sends per transaction in bench/transactions.py (1000 records of 1 KB, batch.size
1 MB): AddPartitionsToTxn v0, a Produce v10 of the first `--split` records (requests are capped by
message.max.bytes, 1 MB: 967 records), a Produce v10 of the rest, EndTxn v1 (commit). Each is handed
to one server Connection over a transport that only counts (as bench/server_path.py does: a frame
arrives through `buffer_updated`, the loop runs until the response has been written), one after
the other, as the client's serial chain has them. Prints µs per step, the best of `--rounds`
rounds of `--txns` transactions (the frames are built beforehand; the log is on disk in a temp
dir, so the 1 MB write into the page cache is in). A broker's share of a transaction on a live
connection is this plus the kernel's socket work and the wake-ups.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from server_path import CountingTransport  # noqa: E402

from protocol import frames  # noqa: E402
from protocol import messages as M  # noqa: E402
from protocol.records import build_batch  # noqa: E402

TOPIC = "txn-path"
TID = "txn-path"
VALUE = b"v" * 1024
STEPS = ("add_partitions", "produce_1", "produce_2", "end_txn")


def frame(api_key: int, version: int, correlation_id: int, request: Any) -> bytes:
    body = frames.encode_request_header(api_key, version, correlation_id, "txn-path") + M.encode(request, version)
    return struct.pack(">i", len(body)) + body


def produce_frame(pid: int, epoch: int, sequence: int, count: int) -> bytes:
    batch = build_batch([(None, VALUE)] * count, producer_id=pid, producer_epoch=epoch, base_sequence=sequence,
                        is_transactional=True)
    P = M.ProduceRequest
    return frame(0, 10, 9, P(transactional_id=TID, acks=-1, timeout_ms=30000, topic_data=[P.TopicProduceData(
        name=TOPIC, partition_data=[P.PartitionProduceData(index=0, records=batch)])]))


async def run(txns: int, rounds: int, split: int, profiler: Any = None) -> dict[str, Any]:
    import gc

    from broker.network.server import Connection
    from broker.observability.log_setup import configure
    from tests.compat.conftest import CREATE_TOPICS
    from tests.harness import start_inprocess

    configure("text", "INFO")
    with tempfile.TemporaryDirectory() as tmp:
        broker = await start_inprocess(Path(tmp))
        try:
            transport = CountingTransport()
            gc.collect()
            gc.freeze()
            conn = Connection(broker.network.server)
            conn.connection_made(transport)  # type: ignore[arg-type]
            loop = asyncio.get_running_loop()

            async def call(data: bytes) -> None:
                transport.waiter = loop.create_future()
                view, done = memoryview(data), 0
                while done < len(data):  # as a socket delivers a large frame: a buffer's worth at a time
                    buf = conn.get_buffer(len(data) - done)
                    n = min(len(buf), len(data) - done)
                    buf[:n] = view[done: done + n]
                    done += n
                    conn.buffer_updated(n)
                await transport.waiter

            R = M.CreateTopicsRequest
            await call(frame(CREATE_TOPICS, 5, 1, R(topics=[R.CreatableTopic(
                name=TOPIC, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
                timeout_ms=10000, validate_only=False)))
            for _ in range(100):  # the first FindCoordinator creates __transaction_state
                await call(frame(10, 3, 2, M.FindCoordinatorRequest(key=TID, key_type=1)))
                try:
                    pid, epoch = await _init_producer_id(broker)
                    break
                except RuntimeError:
                    await asyncio.sleep(0.05)
            else:
                raise RuntimeError("no producer id")
            A = M.AddPartitionsToTxnRequest
            add = frame(24, 0, 3, A(v3_and_below_transactional_id=TID, v3_and_below_producer_id=pid,
                                    v3_and_below_producer_epoch=epoch,
                                    v3_and_below_topics=[A.AddPartitionsToTxnTopic(name=TOPIC, partitions=[0])]))
            end = frame(26, 1, 4, M.EndTxnRequest(transactional_id=TID, producer_id=pid, producer_epoch=epoch,
                                                  committed=True))
            sequence = 0
            spent = {s: float("inf") for s in STEPS}
            for r in range(rounds + 1):  # the first round warms up
                batches = []
                for _ in range(txns):
                    batches.append((produce_frame(pid, epoch, sequence, split),
                                    produce_frame(pid, epoch, sequence + split, 1000 - split)))
                    sequence += 1000
                gc.collect()
                totals = dict.fromkeys(STEPS, 0.0)
                if profiler is not None and r:
                    profiler.enable()
                for p1, p2 in batches:
                    for step, data in zip(STEPS, (add, p1, p2, end)):
                        t0 = time.perf_counter()
                        await call(data)
                        totals[step] += time.perf_counter() - t0
                if profiler is not None and r:
                    profiler.disable()
                if r:
                    for s in STEPS:
                        spent[s] = min(spent[s], totals[s] / txns)
            conn.connection_lost(None)
            us = {s: round(v * 1e6, 1) for s, v in spent.items()}
            us["transaction"] = round(sum(spent.values()) * 1e6, 1)
            return {"txns": txns, "rounds": rounds, "split": split, "us_per_step": us}
        finally:
            await broker.stop()


async def _init_producer_id(broker: Any) -> tuple[int, int]:
    result = await broker.txn_coordinator.init_producer_id(TID, 60000)
    if result.error:
        raise RuntimeError(result.error)
    return result.producer_id, result.producer_epoch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--txns", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--split", type=int, default=967, help="records in the first Produce of a transaction")
    ap.add_argument("--cprofile", metavar="FILE", help="profile the timed rounds with cProfile, stats to FILE")
    args = ap.parse_args()
    import uvloop

    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
    result = uvloop.run(run(args.txns, args.rounds, args.split, profiler))
    if profiler is not None:
        profiler.dump_stats(args.cprofile)
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
