"""Partitions across several `log.dirs`: AlterReplicaLogDirs moves and what DescribeLogDirs sees.

A move is Kafka's future replica: the answer to AlterReplicaLogDirs comes at once, the copy runs in
the background (broker.log.mover: bulk copy in a worker thread while appends go on, then a short
catch-up on the event loop with the log standing still), and the partition switches to its new
directory in one step. Until then DescribeLogDirs lists the copy in the target dir as the future
replica (IsFutureKey) with its lag in offsets. A move that fails leaves the partition where it was.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

from broker.log import LogManager
from broker.log.loader import load_log
from broker.log.mover import FUTURE_DIR_SUFFIX, Copy, abandon, catch_up, copy_bulk, start_copy
from broker.observability.logger import get_logger
from broker.partition import Partition, PartitionManager
from protocol.errors import ErrorCode, KafkaError

log = get_logger("broker.partition.log_dirs")

MAX_DIR_NAME = 255  # Kafka refuses a move whose future directory name would be longer (KAFKA-4893)


@dataclass
class FutureReplica:
    target: str
    copy: Copy | None
    task: asyncio.Task[None]
    start_offset: int  # the log end offset the copy is known to hold (once the bulk copy is done)
    bulk_done: bool = False


class LogDirMover:
    def __init__(self, logs: LogManager, partitions: PartitionManager) -> None:
        self.logs = logs
        self.partitions = partitions
        self.futures: dict[tuple[str, int], FutureReplica] = {}

    def alter(self, topic: str, index: int, target: str) -> None:
        """Start moving the partition to `target` (ReplicaManager.alterReplicaLogDirs' checks and
        errors, raised as KafkaError)."""
        if len("%s-%d.%s%s" % (topic, index, "0" * 32, FUTURE_DIR_SUFFIX)) > MAX_DIR_NAME:
            raise KafkaError(ErrorCode.INVALID_TOPIC_EXCEPTION, "The topic name is too long.")
        target = os.path.abspath(target)
        if target not in self.logs.log_dirs:
            raise KafkaError(ErrorCode.LOG_DIR_NOT_FOUND, "Log dir %s is not found in the config." % target)
        partition = self.partitions.get(topic, index)
        if partition is None or partition.deleted:
            raise KafkaError(ErrorCode.REPLICA_NOT_AVAILABLE, "The replica is not available for the requested "
                             "topic-partition.")
        current = self.futures.get((topic, index))
        if current is not None:
            if current.target == target:
                return
            current.task.cancel()  # a new destination replaces the move under way, as in Kafka
        if self.logs.log_dir_of(topic, index) == target:
            return
        task = asyncio.get_running_loop().create_task(self._move(partition, target))
        self.futures[(topic, index)] = FutureReplica(target, None, task, partition.log.log_end_offset)

    async def _move(self, partition: Partition, target: str) -> None:
        key = (partition.topic, partition.index)
        await asyncio.sleep(0)  # the caller registers the future replica first
        future = self.futures.get(key)
        source = partition.log
        copy = await asyncio.to_thread(start_copy, source.dir, target, partition.topic, partition.index)
        if future is not None:
            future.copy = copy
        moved = False
        try:
            await asyncio.to_thread(copy_bulk, copy)
            if future is not None:
                future.start_offset = source.log_end_offset  # what the bulk copy certainly holds
                future.bulk_done = True
            await partition.group_commit.idle()
            # From here to the swap nothing awaits: appends (on this loop) cannot come in between,
            # and the lock keeps the background threads (flusher, retention, cleaner) out.
            with source.lock:
                catch_up(copy)
                moved = True
                new_log, _ = load_log(copy.final_dir, source.config, had_clean_shutdown=True,
                                      log_start_offset=source.log_start_offset, time=source.time)
                new_log.cleaner_checkpoint = source.cleaner_checkpoint
                self.logs.replace_log(partition.topic, partition.index, new_log, target)
                partition.log = new_log
                partition.group_commit.retarget(new_log.flush, new_log.recovery_point)
                source.close_handles()
            log.info("partition moved", partition=repr(partition), log_dir=target, bytes=copy.bytes_copied)
            # shielded: once moved, the old directory must go even if the move is cancelled now
            await asyncio.shield(asyncio.to_thread(self.logs.remove_moved_dir, source))
        except asyncio.CancelledError:
            if not moved:
                await asyncio.to_thread(abandon, copy)
            raise
        except Exception as exc:
            log.error("moving a partition between log dirs failed", partition=repr(partition), log_dir=target,
                      error=str(exc))
            if not moved:
                await asyncio.to_thread(abandon, copy)
        finally:
            if self.futures.get(key) is future:
                self.futures.pop(key, None)

    def future_of(self, topic: str, index: int) -> tuple[str, int, int] | None:
        """(target dir, bytes copied, offset lag) of the partition's future replica, if moving."""
        future = self.futures.get((topic, index))
        if future is None:
            return None
        partition = self.partitions.get(topic, index)
        if partition is None:
            return None
        held = future.start_offset if future.bulk_done else partition.log.log_start_offset
        copied = future.copy.bytes_copied if future.copy is not None else 0
        return future.target, copied, max(0, partition.log.log_end_offset - held)

    def cancel_topic(self, topic: str) -> None:
        """The topic is being deleted: its moves stop."""
        for (t, _), future in list(self.futures.items()):
            if t == topic:
                future.task.cancel()

    def cancel(self, topic: str, index: int) -> None:
        """The partition's replica is going (reassigned away): its move stops."""
        future = self.futures.get((topic, index))
        if future is not None:
            future.task.cancel()

    async def stop(self) -> None:
        tasks = [f.task for f in self.futures.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
