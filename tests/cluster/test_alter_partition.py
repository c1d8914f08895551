"""broker/cluster/alter_partition.py against a fake controller: batching, one change per partition,
answers per partition, retries after top-level errors; and a leader Partition applying them."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from broker.cluster.alter_partition import AlterPartitionManager
from broker.log import LogConfig, create_log
from broker.partition import Partition
from broker.partition.replica import LeaderAndIsr
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.log.log_helpers import Clock, batch

pytestmark = pytest.mark.timeout(20)
A = M.AlterPartitionResponse
T1, T2 = uuid.uuid4(), uuid.uuid4()


class FakeController:
    """Answers what the test queues (a response, or an exception), recording each request."""

    def __init__(self) -> None:
        self.requests: list[M.AlterPartitionRequest] = []
        self.answers: asyncio.Queue[object] = asyncio.Queue()

    async def __call__(self, request: M.AlterPartitionRequest) -> M.AlterPartitionResponse:
        self.requests.append(request)
        answer = await self.answers.get()
        if isinstance(answer, Exception):
            raise answer
        assert isinstance(answer, A)
        return answer


def accept(request: M.AlterPartitionRequest, error: int = 0) -> A:
    """The answer of a controller applying every change (partition epoch + 1)."""
    return A(throttle_time_ms=0, error_code=0, topics=[A.TopicData(topic_id=t.topic_id, partitions=[
        A.PartitionData(partition_index=p.partition_index, error_code=error, leader_id=1, leader_epoch=p.leader_epoch,
                        isr=[b.broker_id for b in p.new_isr_with_epochs], leader_recovery_state=0,
                        partition_epoch=p.partition_epoch + 1) for p in t.partitions]) for t in request.topics])


async def until(condition, timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.001)


def change(isr: tuple[int, ...], epochs: tuple[int, ...] = ()) -> LeaderAndIsr:
    return LeaderAndIsr(1, 4, isr, 7, epochs)


async def test_one_request_in_flight_and_the_rest_batched():
    controller = FakeController()
    manager = AlterPartitionManager(1, lambda: 42, controller, retry_backoff_s=0.01)
    first = manager.submit(T1, "a", 0, change((1, 2), (-1, 9)))
    await until(lambda: len(controller.requests) == 1)
    second = manager.submit(T1, "a", 1, change((1, 3)))
    third = manager.submit(T2, "b", 0, change((1,)))
    # the same partition again while its change is unanswered: refused at once
    again = manager.submit(T1, "a", 0, change((1,)))
    with pytest.raises(KafkaError) as e:
        await again
    assert e.value.code == ErrorCode.OPERATION_NOT_ATTEMPTED
    request = controller.requests[0]
    assert (request.broker_id, request.broker_epoch) == (1, 42)
    [[p]] = [t.partitions for t in request.topics]
    assert [(b.broker_id, b.broker_epoch) for b in p.new_isr_with_epochs] == [(1, 42), (2, 9)]
    assert (p.leader_epoch, p.partition_epoch) == (4, 7)
    await controller.answers.put(accept(request))
    assert await first == LeaderAndIsr(1, 4, (1, 2), 8)
    await until(lambda: len(controller.requests) == 2)
    assert sorted((t.topic_id, p.partition_index) for t in controller.requests[1].topics for p in t.partitions) == \
        sorted([(T1, 1), (T2, 0)])
    await controller.answers.put(accept(controller.requests[1], error=int(ErrorCode.INVALID_UPDATE_VERSION)))
    for future in (second, third):
        with pytest.raises(KafkaError) as e:
            await future
        assert e.value.code == ErrorCode.INVALID_UPDATE_VERSION
    assert manager.unsent == {} and not manager.in_flight


async def test_top_level_errors_and_lost_requests_are_retried():
    controller = FakeController()
    manager = AlterPartitionManager(1, lambda: 42, controller, retry_backoff_s=0.01)
    future = manager.submit(T1, "a", 0, change((1, 2)))
    await controller.answers.put(A(throttle_time_ms=0, error_code=int(ErrorCode.STALE_BROKER_EPOCH), topics=[]))
    await controller.answers.put(KafkaError(ErrorCode.NOT_CONTROLLER, "moved"))
    await controller.answers.put(A(throttle_time_ms=0, error_code=0, topics=[]))  # the partition left out
    await until(lambda: len(controller.requests) == 4)
    assert not future.done()
    await controller.answers.put(accept(controller.requests[-1]))
    assert (await future).isr == (1, 2)


async def test_a_leader_partition_applies_the_controllers_answer(tmp_path):
    controller = FakeController()
    manager = AlterPartitionManager(1, lambda: 42, controller, retry_backoff_s=0.01)
    clock = Clock()
    p = Partition("a", 0, T1, create_log(str(tmp_path), "a", 0, LogConfig(), time=clock))
    p.local_id, p.alter_partition = 1, manager
    p.make_leader(4, 7, [1, 2, 3], [1, 2, 3])
    p.append_records(batch(1))
    p.update_follower(2, 9, 1, 0, 1)
    clock.advance(31_000)
    p.update_follower(2, 9, 1, 0, 1)
    p.maybe_shrink_isr()  # 3 never fetched
    await until(lambda: len(controller.requests) == 1)
    await controller.answers.put(accept(controller.requests[0]))
    await until(lambda: not p.isr_state.in_flight)
    assert (p.isr, p.partition_epoch, p.high_watermark) == ([1, 2], 8, 1)

