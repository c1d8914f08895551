"""The broker's own CPU per request on the server path, without sockets or a second process.

    python bench/server_path.py [--requests 20000] [--rounds 5] [--apis describe_cluster,offset_commit]

Starts a Broker in this process (uvloop, data on disk in a temp dir), makes one server Connection
over a transport that only counts what is written, and hands it the same requests as
bench/request_cost.py one at a time: a frame arrives through `buffer_updated` (as uvloop delivers
it), the loop runs until the response has been written, the next one follows. So it measures
exactly the interpreter's part of a request (frame, header, decode, dispatch, handler, encode,
write call, plus the event loop's scheduling) and none of the kernel's; it is hot (nothing runs
between requests), so it is the lower bound of what request_cost.py reads from /proc. The
heartbeat's member joins its group over the broker's port first, as in request_cost.py. Prints
µs per request, the best of `--rounds` rounds (the machine's noise only ever adds time).
`--cprofile FILE` profiles the timed rounds.
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

from request_cost import FIND_COORDINATOR, OVERRIDES, REQUESTS, TOPIC, join_group  # noqa: E402

from protocol import frames  # noqa: E402
from protocol import messages as M  # noqa: E402


class CountingTransport:
    """Enough of a transport for broker.network.server.Connection: counts the responses written."""

    def __init__(self) -> None:
        self.responses = 0
        self.bytes = 0
        self.waiter: asyncio.Future[None] | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return ("127.0.0.1", 40000) if name == "peername" else default

    def write(self, data: Any) -> None:
        self.writelines([data])

    def writelines(self, parts: Any) -> None:
        self.bytes += sum(len(p) for p in parts)
        self.responses += 1
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def get_write_buffer_size(self) -> int:
        return 0

    def is_closing(self) -> bool:
        return False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def close(self) -> None:
        pass


def frame(api_key: int, version: int, correlation_id: int, request: Any) -> bytes:
    body = frames.encode_request_header(api_key, version, correlation_id, "server-path") + M.encode(request, version)
    return struct.pack(">i", len(body)) + body


async def run(names: list[str], n: int, rounds: int, profiler: Any = None) -> list[dict[str, Any]]:
    import gc

    from broker.network.server import Connection
    from broker.observability.log_setup import configure
    from tests.harness import start_inprocess

    configure("text", "INFO")  # as `python -m broker`: no per-request debug line

    with tempfile.TemporaryDirectory() as tmp:
        broker = await start_inprocess(Path(tmp), **{k.replace(".", "_"): v for k, v in OVERRIDES.items()})
        try:
            transport = CountingTransport()
            gc.collect()
            gc.freeze()  # as broker.cli.serve does once the broker has started
            conn = Connection(broker.server)
            conn.connection_made(transport)  # type: ignore[arg-type]
            loop = asyncio.get_running_loop()

            async def call(data: bytes) -> None:
                transport.waiter = loop.create_future()
                buf = conn.get_buffer(len(data))
                buf[: len(data)] = data
                conn.buffer_updated(len(data))
                await transport.waiter

            from tests.compat.conftest import CREATE_TOPICS

            R = M.CreateTopicsRequest
            await call(frame(CREATE_TOPICS, 5, 1, R(topics=[R.CreatableTopic(
                name=TOPIC, num_partitions=1, replication_factor=1, assignments=[], configs=[])],
                timeout_ms=10000, validate_only=False)))
            await call(frame(FIND_COORDINATOR, 3, 2, M.FindCoordinatorRequest(key="request-cost", key_type=0)))
            if "heartbeat" in names:  # a member of a classic group, joined over the broker's port
                heartbeat = REQUESTS["heartbeat"][2]
                heartbeat.generation_id, heartbeat.member_id = await asyncio.to_thread(join_group, broker.ports[0])
            results = []
            for name in names:
                key, version, request = REQUESTS[name]
                data = frame(key, version, 7, request)
                for _ in range(1000):
                    await call(data)
                best = float("inf")
                for _ in range(rounds):
                    if profiler is not None:
                        profiler.enable()
                    t0 = time.perf_counter()
                    for _ in range(n):
                        await call(data)
                    best = min(best, time.perf_counter() - t0)
                    if profiler is not None:
                        profiler.disable()
                results.append({"api": name, "requests": n, "us_per_request": round(best / n * 1e6, 2)})
            conn.connection_lost(None)
            return results
        finally:
            await broker.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--apis", default=",".join(REQUESTS))
    ap.add_argument("--cprofile", metavar="FILE", help="profile the timed rounds with cProfile, stats to FILE")
    args = ap.parse_args()
    import uvloop

    profiler = None
    if args.cprofile:
        import cProfile

        profiler = cProfile.Profile()
    results = uvloop.run(run(args.apis.split(","), args.requests, args.rounds, profiler))
    if profiler is not None:
        profiler.dump_stats(args.cprofile)
    print(json.dumps({"results": results}, indent=1))


if __name__ == "__main__":
    main()
