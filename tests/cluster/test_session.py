"""A node's etcd session (election.Session) stops when asked, even when its keep-alive's answer
comes in the same instant as the cancellation (Python 3.11's asyncio.wait_for returned the answer
and dropped the cancellation: the session ran on and `close` waited for it for ever; a node
refused at start for a taken node.id hung instead of exiting, about one start in thirty)."""

from __future__ import annotations

import asyncio

from broker.cluster.election import Session
from broker.cluster.etcd_fake import FakeEtcd


class HeldKeepAlive(FakeEtcd):
    """Holds each keep-alive until the test lets it through."""

    def __init__(self) -> None:
        super().__init__()
        self.gate: asyncio.Future[None] | None = None

    async def keep_alive(self, lease: int, timeout: float | None = None) -> int:
        self.gate = asyncio.get_running_loop().create_future()
        await self.gate
        return await super().keep_alive(lease, timeout)


async def test_close_while_a_keep_alive_is_being_answered() -> None:
    etcd = HeldKeepAlive()
    session = Session(etcd, 3000)
    await session.start()
    async with asyncio.timeout(5):
        while etcd.gate is None:
            await asyncio.sleep(0.01)
    etcd.gate.set_result(None)  # answered, and in the same instant:
    closing = asyncio.create_task(session.close())
    await asyncio.wait({closing}, timeout=2)
    stuck = not closing.done()
    while not closing.done():  # the session ran on: end it for good
        if session._task is not None:
            session._task.cancel()
        if etcd.gate is not None and not etcd.gate.done():
            etcd.gate.cancel()
        await asyncio.sleep(0.01)
    assert not stuck, "the session did not stop"
    assert session.lost.is_set()
