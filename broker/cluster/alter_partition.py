"""Kafka's AlterPartitionManager: a leader's ISR changes sent to the active controller.

Each partition has at most one change queued or in flight (a second one is refused at once with
OPERATION_NOT_ATTEMPTED: the partition tried to change while its last change is unanswered); the
changes queued meanwhile go together in the next request, and there is one request in flight at a
time. A partition-level answer completes its future (the controller's LeaderAndIsr, or a
KafkaError with its code: the Partition decides what to do, as Kafka's does); a partition missing
from the answer stays queued and goes again. A top-level error (STALE_BROKER_EPOCH, the
controller unreachable or moving, ...) leaves everything queued and retries after a short pause,
without end: an ISR change is never timed out, the partition stays pending until the answer or new
metadata.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from broker.observability.logger import get_logger
from broker.partition.replica import LeaderAndIsr
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.cluster.alter_partition")

ALTER_PARTITION, ALTER_PARTITION_VERSION = 56, 3
RETRY_BACKOFF_S = 0.05  # Kafka's pause after a top-level error
Q = M.AlterPartitionRequest


@dataclass
class _Item:
    topic_id: uuid.UUID
    topic: str
    partition: int
    leader_and_isr: LeaderAndIsr
    future: asyncio.Future[LeaderAndIsr]


class AlterPartitionManager:
    """`send` delivers an AlterPartition request to the active controller (raising KafkaError when
    it cannot); `broker_epoch` is this broker's current epoch (its registration's)."""

    def __init__(self, broker_id: int, broker_epoch: Callable[[], int],
                 send: Callable[[M.AlterPartitionRequest], Awaitable[M.AlterPartitionResponse]],
                 retry_backoff_s: float = RETRY_BACKOFF_S) -> None:
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self.send = send
        self.retry_backoff_s = retry_backoff_s
        self.unsent: dict[tuple[str, int], _Item] = {}  # by name: a re-created topic collides, as in Kafka
        self.in_flight = False
        self._task: asyncio.Task[None] | None = None
        self._retry: asyncio.TimerHandle | None = None
        self._stopped = False

    def submit(self, topic_id: uuid.UUID, topic: str, partition: int,
               leader_and_isr: LeaderAndIsr) -> asyncio.Future[LeaderAndIsr]:
        future: asyncio.Future[LeaderAndIsr] = asyncio.get_running_loop().create_future()
        key = (topic, partition)
        if key in self.unsent:
            future.set_exception(KafkaError(ErrorCode.OPERATION_NOT_ATTEMPTED, "Failed to enqueue ISR change state "
                                            "%s for partition %s-%d" % (leader_and_isr, topic, partition)))
            return future
        self.unsent[key] = _Item(topic_id, topic, partition, leader_and_isr, future)
        self._maybe_send()
        return future

    def stop(self) -> None:
        self._stopped = True
        if self._retry is not None:
            self._retry.cancel()
        if self._task is not None:
            self._task.cancel()

    def _maybe_send(self) -> None:
        self._retry = None
        if self.unsent and not self.in_flight and not self._stopped:
            self.in_flight = True
            items = list(self.unsent.values())
            self._task = asyncio.get_running_loop().create_task(self._send(items), name="alter-partition")

    async def _send(self, items: list[_Item]) -> None:
        error = ErrorCode.UNKNOWN_SERVER_ERROR
        try:
            response = await self.send(self.build_request(items))
            error = self.handle_response(response, items)
        except KafkaError as exc:
            error = exc.code
            log.info("AlterPartition not delivered", error=error.name)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("AlterPartition failed")
        finally:
            self.in_flight = False
        if error == ErrorCode.NONE:
            self._maybe_send()
        elif not self._stopped:
            self._retry = asyncio.get_running_loop().call_later(self.retry_backoff_s, self._maybe_send)

    def build_request(self, items: list[_Item]) -> M.AlterPartitionRequest:
        """One request for the queued changes, topic by topic, each ISR member with its broker
        epoch (this broker's own current one)."""
        own_epoch = self.broker_epoch()
        topics: dict[uuid.UUID, Q.TopicData] = {}
        for item in items:
            change = item.leader_and_isr
            epochs = change.isr_broker_epochs or (-1,) * len(change.isr)
            isr = [Q.BrokerState(broker_id=b, broker_epoch=own_epoch if b == self.broker_id else e)
                   for b, e in zip(change.isr, epochs)]
            topic = topics.get(item.topic_id)
            if topic is None:
                topic = topics[item.topic_id] = Q.TopicData(topic_id=item.topic_id, partitions=[])
            topic.partitions.append(Q.PartitionData(
                partition_index=item.partition, leader_epoch=change.leader_epoch, new_isr_with_epochs=isr,
                leader_recovery_state=0, partition_epoch=change.partition_epoch))
        return Q(broker_id=self.broker_id, broker_epoch=own_epoch, topics=list(topics.values()))

    def handle_response(self, response: M.AlterPartitionResponse, items: list[_Item]) -> ErrorCode:
        """Complete the futures of the partitions answered; returns the top-level error."""
        error = ErrorCode(response.error_code)  # type: ignore[call-arg]
        if error != ErrorCode.NONE:
            log.warning("AlterPartition refused by the controller", error=error.name)
            return error
        names = {item.topic_id: item.topic for item in items}
        answers: dict[tuple[str, int], LeaderAndIsr | ErrorCode] = {}
        for topic in response.topics:
            name = names.get(topic.topic_id)
            if name is None:
                log.error("AlterPartition answered an unexpected topic", topic_id=str(topic.topic_id))
                continue
            for p in topic.partitions:
                if p.error_code:
                    answers[(name, p.partition_index)] = ErrorCode(p.error_code)  # type: ignore[call-arg]
                elif p.leader_recovery_state not in (0, 1):
                    answers[(name, p.partition_index)] = ErrorCode.UNKNOWN_SERVER_ERROR
                else:
                    answers[(name, p.partition_index)] = LeaderAndIsr(p.leader_id, p.leader_epoch, tuple(p.isr),
                                                                      p.partition_epoch)
        for item in items:
            key = (item.topic, item.partition)
            answer = answers.get(key)
            if answer is None:
                log.warning("AlterPartition answer without a sent partition", topic=item.topic,
                            partition=item.partition)
                continue  # stays queued: sent again
            # free the slot first: the partition's callback may submit its next change
            if self.unsent.get(key) is item:
                del self.unsent[key]
            if item.future.done():
                continue
            if isinstance(answer, LeaderAndIsr):
                item.future.set_result(answer)
            else:
                item.future.set_exception(KafkaError(answer, "AlterPartition of %s-%d failed: %s" % (
                    item.topic, item.partition, answer.name)))
        return ErrorCode.NONE
