"""Classic consumer groups with aiokafka's AIOKafkaConsumer: members share a topic's
partitions with the roundrobin, range and sticky assignors, take over from a member that
stops, and commit and fetch offsets."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

pytest.importorskip("aiokafka")
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRebalanceListener, TopicPartition  # noqa: E402
from aiokafka.coordinator.assignors.range import RangePartitionAssignor  # noqa: E402
from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor  # noqa: E402
from aiokafka.coordinator.assignors.sticky.sticky_assignor import StickyPartitionAssignor  # noqa: E402
from aiokafka.structs import OffsetAndMetadata  # noqa: E402

from protocol.errors import ErrorCode  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.compat.group_checker import TP, OwnershipLog, broker_assignment, describe_group, raw_commit  # noqa: E402
from tests.harness import BrokerProcess  # noqa: E402

PARTITIONS = 6
ASSIGNORS: dict[str, tuple[Any, ...]] = {
    "roundrobin": (RoundRobinPartitionAssignor,),
    "range": (RangePartitionAssignor,),
    "sticky": (StickyPartitionAssignor,),
}
# Not tested: several assignors in one aiokafka consumer. aiokafka 0.14 then sends one JoinGroup
# per prefix of its assignor list on every rejoin ([a], then [a, b]); members whose alternating
# metadata gets out of phase keep triggering rebalances (a JoinGroup with changed metadata forces
# one, in Kafka's coordinator as in ours), so the group may never settle.


def consumer(kafka: BrokerProcess, group: str, **config: Any) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(**{
        "bootstrap_servers": kafka.bootstrap, "group_id": group, "enable_auto_commit": False,
        "auto_offset_reset": "earliest", "session_timeout_ms": 6000, "heartbeat_interval_ms": 500,
        "fetch_max_wait_ms": 200, **config,
    })


class Listener(ConsumerRebalanceListener):
    def __init__(self, name: str, log: OwnershipLog) -> None:
        self.name = name
        self.log = log

    async def on_partitions_revoked(self, revoked: Any) -> None:
        self.log.revoked(self.name, [(tp.topic, tp.partition) for tp in revoked])

    async def on_partitions_assigned(self, assigned: Any) -> None:
        self.log.assigned(self.name, [(tp.topic, tp.partition) for tp in assigned])


class Member:
    """A subscribed AIOKafkaConsumer fetching in its own task until stopped."""

    def __init__(self, name: str, kafka: BrokerProcess, group: str, topic: str, log: OwnershipLog,
                 **config: Any) -> None:
        self.name = name
        self.log = log
        self.topic = topic
        self.consumer = consumer(kafka, group, **config)
        self.misplaced: list[TP] = []
        self.received = 0
        self.task: asyncio.Task[None] | None = None
        self.stopped = False

    async def start(self) -> Member:
        await self.consumer.start()
        self.consumer.subscribe([self.topic], listener=Listener(self.name, self.log))
        self.task = asyncio.create_task(self._fetch())
        return self

    async def _fetch(self) -> None:
        while True:
            for tp, records in (await self.consumer.getmany(timeout_ms=500)).items():
                self.received += len(records)
                if (tp.topic, tp.partition) not in self.log.owned_by(self.name):
                    self.misplaced.append((tp.topic, tp.partition))

    def generation(self) -> tuple[int, str]:
        coordinator = self.consumer._coordinator  # aiokafka internals
        return coordinator.generation, coordinator.member_id

    async def stop(self) -> None:
        if self.stopped:
            return
        self.stopped = True
        if self.task is not None and not self.task.done():
            self.task.cancel()
            try:
                await self.task
            except asyncio.CancelledError:
                pass
        self.log.gone(self.name)
        await self.consumer.stop()


async def wait_settled(log: OwnershipLog, members: list[str], timeout: float = 30) -> dict[str, set[TP]]:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not log.settled(members):
        if loop.time() > deadline:
            raise AssertionError("not settled: %s\n%s" % (log.owners(), log.format(log.events)))
        await asyncio.sleep(0.02)
    log.check()
    return log.assignment()


async def wait_until(predicate: Any, timeout: float, what: str) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("timed out waiting for " + what)
        await asyncio.sleep(0.05)


def broker_view_matches(kafka: BrokerProcess, group: str, log: OwnershipLog) -> bool:
    if describe_group(kafka.port, group).group_state != "Stable":
        return False
    held = sorted(sorted(tps) for tps in broker_assignment(kafka.port, group).values())
    return held == sorted(sorted(tps) for tps in log.assignment().values())


async def produce(kafka: BrokerProcess, topic: str, count: int, partitions: int) -> None:
    p = AIOKafkaProducer(bootstrap_servers=kafka.bootstrap, linger_ms=5)
    await p.start()
    try:
        for f in [await p.send(topic, value=b"%d" % i, partition=i % partitions) for i in range(count)]:
            await f
    finally:
        await p.stop()


@pytest.mark.parametrize("assignor", list(ASSIGNORS))
async def test_members_own_every_partition_once_and_take_over_on_leave(
        kafka: BrokerProcess, topic_name: str, assignor: str) -> None:
    create_topic(kafka, topic_name, PARTITIONS)
    await produce(kafka, topic_name, 60, PARTITIONS)
    group = "aio-" + topic_name
    log = OwnershipLog([(topic_name, p) for p in range(PARTITIONS)])
    members = [Member(name, kafka, group, topic_name, log, partition_assignment_strategy=ASSIGNORS[assignor])
               for name in ("a0", "a1", "a2")]
    try:
        for m in members:
            await m.start()
        owned = await wait_settled(log, ["a0", "a1", "a2"])
        assert sorted(len(tps) for tps in owned.values()) == [2, 2, 2], owned
        await wait_until(lambda: broker_view_matches(kafka, group, log), 15, "the coordinator to agree")
        assert describe_group(kafka.port, group).protocol_data == assignor
        old_generation, member_id = members[1].generation()

        await members[0].stop()
        owned = await wait_settled(log, ["a1", "a2"])
        assert sorted(len(tps) for tps in owned.values()) == [3, 3], owned
        await wait_until(lambda: broker_view_matches(kafka, group, log), 15, "the coordinator to agree")
        log.check()
        assert not any(m.misplaced for m in members), [m.misplaced for m in members]
        assert sum(m.received for m in members) > 0

        await wait_until(lambda: members[1].generation()[0] > old_generation, 15, "a1's new generation")
        generation, same_member = members[1].generation()
        assert same_member == member_id
        tp = (topic_name, 0)
        assert raw_commit(kafka.port, group, old_generation, member_id, tp, 1) == ErrorCode.ILLEGAL_GENERATION
        assert raw_commit(kafka.port, group, generation, member_id, tp, 1) == ErrorCode.NONE
    finally:
        for m in members:
            await m.stop()


async def test_commit_and_fetch(kafka: BrokerProcess, topic_name: str) -> None:
    partitions = 3
    create_topic(kafka, topic_name, partitions)
    await produce(kafka, topic_name, 90, partitions)
    group = "aio-commit-" + topic_name
    tps = [TopicPartition(topic_name, i) for i in range(partitions)]

    c = consumer(kafka, group, max_poll_records=10)
    await c.start()
    c.subscribe([topic_name])
    try:
        first: list[bytes] = []

        async def read_some() -> None:
            while len(first) < 30:
                for records in (await c.getmany(timeout_ms=500, max_records=10)).values():
                    first.extend(r.value for r in records)

        await asyncio.wait_for(read_some(), 30)
        positions = {tp: await c.position(tp) for tp in tps}
        await c.commit()  # what was consumed so far
        assert {tp: await c.committed(tp) for tp in tps} == positions
        await c.commit({tps[0]: OffsetAndMetadata(positions[tps[0]], "checkpoint")})
        assert await c.committed(tps[0]) == positions[tps[0]]
    finally:
        await c.stop()

    # a new member of the group goes on from the committed offsets: nothing again, nothing lost
    c = consumer(kafka, group)
    await c.start()
    c.subscribe([topic_name])
    try:
        rest: list[bytes] = []

        async def read_rest() -> None:
            while len(first) + len(rest) < 90:
                for records in (await c.getmany(timeout_ms=500)).values():
                    rest.extend(r.value for r in records)

        await asyncio.wait_for(read_rest(), 30)
        assert sorted(first + rest) == sorted(b"%d" % i for i in range(90))
        assert not await c.getmany(timeout_ms=500)  # and nothing more
    finally:
        await c.stop()
