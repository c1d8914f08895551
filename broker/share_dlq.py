"""The broker side of the share groups' dead-letter queue (broker/share/dlq.py): topics from the
metadata, topic creation, appends to this broker's partitions and reads of the source records.
(Kafka sends CreateTopics and Produce to the controller and the leader; on one node they are calls.)
"""

from __future__ import annotations

import uuid
from typing import Any

from broker.share.dlq import TopicView
from protocol.errors import ErrorCode, KafkaError
from protocol.records import decode_batch, iter_batches

READ_CHUNK = 1024 * 1024  # Kafka reads 1 MiB at a time for the DLQ


class BrokerDlqCluster:
    def __init__(self, broker: Any) -> None:
        self.broker = broker

    def topic(self, name: str) -> TopicView | None:
        info = self.broker.metadata.topic(name)
        if info is None:
            return None
        partition = self.broker.partitions.get(name, 0)
        max_bytes = partition.log.config.max_message_bytes if partition is not None else 1048588
        return TopicView(name, info.partitions, dict(info.configs), max_bytes)

    def topic_name(self, topic_id: uuid.UUID) -> str | None:
        info = self.broker.metadata.topic_by_id(topic_id)
        return None if info is None else str(info.name)

    async def create_topic(self, name: str, configs: dict[str, str]) -> None:
        try:
            await self.broker.create_topic(name, -1, configs)
        except KafkaError as exc:
            if exc.code != ErrorCode.TOPIC_ALREADY_EXISTS:
                raise

    async def append(self, topic: str, partition: int, records: bytes) -> None:
        target = self.broker.partitions.get(topic, partition)
        if target is None:
            raise KafkaError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "DLQ partition %s-%d is not here." % (topic, partition))
        await target.append(records)

    def read(self, topic_id: uuid.UUID, partition: int, first: int, last: int
             ) -> dict[int, tuple[bytes | None, bytes | None]]:
        """Key and value of the source records first..last that the log still has."""
        name = self.topic_name(topic_id)
        source = self.broker.partitions.get(name, partition) if name is not None else None
        out: dict[int, tuple[bytes | None, bytes | None]] = {}
        if source is None:
            return out
        offset = max(first, source.log_start_offset)
        while offset <= last:
            data = source.log.read_bytes(offset, READ_CHUNK)
            if not data:
                break
            next_offset = offset
            for pos, header in iter_batches(data):
                next_offset = max(next_offset, header.next_offset)
                if header.is_control:
                    continue
                for record in decode_batch(data, pos)[1]:
                    if offset <= record.offset <= last:
                        key = None if record.key is None else bytes(record.key)
                        value = None if record.value is None else bytes(record.value)
                        out[record.offset] = (key, value)
            if next_offset <= offset:
                break
            offset = next_offset
        return out
