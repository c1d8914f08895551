"""A PartitionWriter on the storage engine: each internal-topic partition (`__consumer_offsets-N`)
is a broker.log Log, compacted like Kafka's.

An append writes one record batch (CreateTime now, uncompressed) with the coordinator's origin,
so the data reaches the OS before the response is released (it survives `kill -9`); when the
log's flush policy (`flush.messages` / `flush.ms`) asks for an fsync, concurrent appends of the
partition share one (GroupCommit). Loading reads every batch from the log start, skipping
control batches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from broker.coordinator.result import Record
from broker.log import Log, LogConfig
from broker.log.group_commit import GroupCommit
from broker.log.validation import AppendOrigin
from protocol.records import build_batch, decode_batch, iter_batches

_CONTROL = 0x20  # batch attribute: control batch (transaction markers)
_READ_CHUNK = 1 << 20


def internal_topic_log_config(defaults: LogConfig, segment_bytes: int | None = None) -> LogConfig:
    """Kafka's settings for a coordinator topic: compacted, producer compression, and
    `offsets.topic.segment.bytes` segments when given."""
    props: dict[str, str | None] = {"cleanup.policy": "compact", "compression.type": "producer"}
    if segment_bytes is not None:
        props["segment.bytes"] = str(segment_bytes)
    return defaults.with_overrides(props)


class LogPartitionWriter:
    """`log_for(partition)` returns (creating if needed) the partition's Log; `on_append`
    (optional) is told after each append, e.g. to wake fetches of the internal topic."""

    def __init__(
        self,
        log_for: Callable[[int], Log],
        on_append: Callable[[int], None] | None = None,
        existing_log: Callable[[int], Log | None] | None = None,
    ) -> None:
        self._log_for = log_for
        self._on_append = on_append
        # loading must not create logs: Kafka's partitions appear only when the topic is created
        self._existing_log = existing_log or log_for
        self._commits: dict[int, GroupCommit] = {}

    def _commit_for(self, partition: int, log: Log) -> GroupCommit:
        commit = self._commits.get(partition)
        if commit is None:
            commit = self._commits[partition] = GroupCommit(log.flush, log.recovery_point)
        return commit

    async def append(self, partition: int, records: Sequence[Record]) -> int:
        log = self._log_for(partition)
        batch = build_batch([(key, value) for key, value in records])
        log.append(batch, origin=AppendOrigin.COORDINATOR)
        end = log.log_end_offset
        if self._on_append is not None:
            self._on_append(partition)
        if log.needs_flush():
            await self._commit_for(partition, log).commit(end)
        return end

    def read(self, partition: int) -> Iterator[Record]:
        log = self._existing_log(partition)
        if log is None:
            return
        offset = log.log_start_offset
        end = log.log_end_offset
        while offset < end:
            data = log.read_bytes(offset, _READ_CHUNK)
            if not data:
                break
            for pos, header in iter_batches(data):
                if header.next_offset <= offset:
                    continue  # the part of a compacted batch before the start offset
                if not header.attributes & _CONTROL:
                    _, batch_records = decode_batch(data, pos)
                    for r in batch_records:
                        if r.offset >= offset and r.key is not None:
                            yield r.key, r.value
                offset = header.next_offset

