"""Requests from one node to another (broker/cluster/client.py) against a stand-in node on
127.0.0.1: a request given up by its caller (cancelled) leaves no answer behind on the connection
for the next request to read as its own."""

from __future__ import annotations

import asyncio
import struct

from broker.cluster.client import NodeClient
from protocol import frames
from protocol import messages as M

FIND_COORDINATOR, VERSION = 10, 4


async def stand_in_node(delays: list[float]) -> tuple[asyncio.Server, int]:
    """Answers the n-th FindCoordinator after delays[n] seconds, naming its correlation id as the
    coordinator, so an answer tells which request it is for."""
    served = 0

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal served
        try:
            while True:
                (size,) = struct.unpack(">i", await reader.readexactly(4))
                frame = await reader.readexactly(size)
                (correlation_id,) = struct.unpack_from(">i", frame, 4)
                delay = delays[served]
                served += 1
                await asyncio.sleep(delay)
                response = M.FindCoordinatorResponse(coordinators=[M.FindCoordinatorResponse.Coordinator(
                    key="k", node_id=correlation_id, host="", port=0, error_code=0)])
                head = frames.encode_response_header(correlation_id, frames.response_header_version(
                    FIND_COORDINATOR, VERSION))
                payload = head + bytes(M.encode(response, VERSION))
                writer.write(struct.pack(">i", len(payload)) + payload)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def test_a_cancelled_request_leaves_no_answer_for_the_next() -> None:
    server, port = await stand_in_node([0.3, 0.0, 0.0])
    client = NodeClient(lambda: ("127.0.0.1", port), "node-test", timeout_s=5)
    request = M.FindCoordinatorRequest(key_type=0, coordinator_keys=["k"])
    try:
        first = asyncio.create_task(client.call(FIND_COORDINATOR, VERSION, request))
        await asyncio.sleep(0.05)  # sent, not answered (the stand-in holds it 0.3 s)
        first.cancel()  # e.g. the client whose request it served went away
        second = await client.call(FIND_COORDINATOR, VERSION, request)
        third = await client.call(FIND_COORDINATOR, VERSION, request)
    finally:
        client.close()
        server.close()
        await server.wait_closed()
    # each answer is the one to its own request (the correlation id the stand-in echoes)
    assert second.coordinators[0].node_id != 1
    assert third.coordinators[0].node_id == second.coordinators[0].node_id + 1
