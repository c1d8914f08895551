"""Partitions: a log, its high watermark, producer state, and the fetch requests waiting on it.

Appends run on the event loop thread without awaiting between the producer-state check and the
write, so each partition has exactly one writer at a time; the data reaches the OS before the
produce is acknowledged (it survives the death of the process), and when the flush policy asks
for an fsync, concurrent appenders share one (GroupCommit). Single node: the high watermark is
the log end offset once the write returns.

Transactions: the producer state tracks the transactions open here; `last_stable_offset` (LSO)
is the first offset of the oldest one, the high watermark when none is open. read_committed reads
stop at the LSO. The transaction coordinator closes a transaction with `write_marker` (a COMMIT
or ABORT control batch); an aborted one is recorded in the segment's aborted-transaction index,
which read_committed fetches return with their data (`aborted_transactions`).

A transactional batch that would open a transaction here must have been verified with the
transaction coordinator first (KIP-890): `start_verification` hands out a guard, the produce path
asks the coordinator, and the append succeeds only if no marker came in between.
"""

from __future__ import annotations

import asyncio
import enum
import uuid
from dataclasses import dataclass
from typing import Protocol

from broker.log import (
    AppendOrigin,
    AppendResult,
    FetchDataInfo,
    Log,
    TimestampAndOffset,
)
from broker.log.group_commit import GroupCommit
from broker.log.log import Buffer
from broker.log.txn_index import AbortedTxn
from broker.observability.logger import get_logger
from broker.partition.producer_snapshot import (
    CorruptSnapshotError,
    delete_snapshot,
    list_snapshots,
    read_snapshot,
    write_snapshot,
)
from broker.partition.producer_state import INT_MAX, ProducerStateManager
from broker.partition.replica import (
    BrokerStatuses,
    Followers,
    IsrState,
    LeaderAndIsr,
    acks_all_outcome,
    can_join_isr,
    high_watermark_candidate,
    out_of_sync_replicas,
)
from protocol.errors import ErrorCode, KafkaError, ProtocolError
from protocol.records import (
    BatchHeader,
    ControlRecordType,
    build_control_batch,
    decode_batch,
    iter_batches,
    parse_control_record,
    validate_batch,
)

logger = get_logger("broker.partition")

READ_UNCOMMITTED = 0
READ_COMMITTED = 1
LOG_END = 2  # not a Kafka isolation level: a follower's fetch reads up to the log end (FetchIsolation.LOG_END)
REPLICA_LAG_TIME_MAX_MS = 30000  # replica.lag.time.max.ms
ALTER_PARTITION_RETRY_S = 0.05  # an ISR change the controller failed unexpectedly is sent again after this


@dataclass
class VerificationState:
    """Kafka's VerificationStateEntry: a transaction about to open here is being verified (or
    added, transactions v2). Batches of that producer must not start past the lowest sequence
    seen meanwhile, and with transactions v2 a producer without state here must start at 0, so
    that a lost first batch cannot leave a transaction hanging (KIP-890)."""

    lowest_sequence: int
    supports_epoch_bump: bool  # transactions v2


@dataclass(frozen=True)
class ProduceResult:
    base_offset: int
    log_append_time: int
    log_start_offset: int


class Role(enum.Enum):
    """A replica's part in its partition (the metadata says which): the leader takes produces and
    serves fetches; a follower copies the leader's log (cluster mode, replication)."""

    LEADER = "leader"
    FOLLOWER = "follower"


class AlterPartitionSubmitter(Protocol):
    """Where a leader sends its ISR changes (broker/cluster/alter_partition.py: Kafka's
    AlterPartitionManager). The future ends with the controller's LeaderAndIsr, or a KafkaError."""

    def submit(self, topic_id: uuid.UUID, topic: str, partition: int,
               leader_and_isr: LeaderAndIsr) -> asyncio.Future[LeaderAndIsr]: ...


class _DelayedProduce:
    """An acks=all produce waiting for the high watermark to pass `required_offset` (Kafka's
    DelayedProduce): its future ends with the error code to answer (NONE when replicated)."""

    __slots__ = ("required_offset", "future")

    def __init__(self, required_offset: int, future: asyncio.Future[ErrorCode]) -> None:
        self.required_offset = required_offset
        self.future = future


class Partition:
    def __init__(self, topic: str, index: int, topic_id: uuid.UUID, log: Log, high_watermark: int = 0) -> None:
        self.topic = topic
        self.index = index
        self.topic_id = topic_id
        self.log = log
        self.producers = ProducerStateManager()
        self.deleted = False  # its topic was deleted: readers holding it must let go
        if log.epoch_cache.latest_epoch is None:
            # as Kafka does on becoming leader: the epoch starts here, so OffsetForLeaderEpoch
            # answers the log end offset even for a partition that never had data (derived again
            # at every start, so not worth an fsync per new partition)
            log.epoch_cache.assign(log.leader_epoch, log.log_start_offset)
        self.group_commit = GroupCommit(log.flush, log.recovery_point)
        self._waiters: set[asyncio.Future[None]] = set()
        self._verifications: dict[int, VerificationState] = {}  # producer id -> a verification in flight
        self._snapshot_offset = -1  # offset of the last producer snapshot written or loaded
        # replication (cluster mode); a single node leads every partition it has, alone in its ISR
        self.role = Role.LEADER
        self.leader_id = -1  # the leader's node id while this replica follows
        self.partition_epoch = 0
        self.replicas: list[int] = []
        self.isr: list[int] = []
        # the leader side of replication: set by the PartitionManager (cluster mode)
        self.local_id = -1
        self.replica_lag_time_max_ms = REPLICA_LAG_TIME_MAX_MS
        self.broker_statuses: BrokerStatuses | None = None  # None: every follower is ISR-eligible
        self.alter_partition: AlterPartitionSubmitter | None = None
        # None while leading alone (a single node, a replication factor of 1): the high watermark
        # is then the log end offset, as it always was; else the followers' replica states
        self.followers: Followers | None = None
        self.isr_state = IsrState(())
        self.leader_epoch_start_offset = 0
        self._led_epoch = -1  # the leader epoch make_leader last started here (Kafka's in-memory leaderEpoch)
        # the stored high watermark, used while `followers` is set and while following (the
        # follower side keeps it as min(leader's, own log end))
        self._high_watermark = high_watermark  # replication-offset-checkpoint's, until a role is given
        self._restored = True  # until the metadata gives it a role: `_high_watermark` is the checkpoint's
        self._delayed_produces: list[_DelayedProduce] = []

    def __repr__(self) -> str:
        return "Partition(%s-%d)" % (self.topic, self.index)

    @property
    def leader_epoch(self) -> int:
        return self.log.leader_epoch

    def become_leader(self, epoch: int) -> None:
        """Lead from `epoch` on (broker.testing's simulated cluster, whose metadata holds the
        epochs): a newer epoch starts at the log end offset, durably, as when a Kafka replica
        becomes leader."""
        log = self.log
        if epoch > log.leader_epoch:
            log.leader_epoch = epoch
            if log.epoch_cache.assign(epoch, log.log_end_offset):
                log.epoch_cache.write()

    @property
    def is_leader(self) -> bool:
        return self.role is Role.LEADER

    def make_leader(self, epoch: int, partition_epoch: int, replicas: list[int], isr: list[int]) -> None:
        """Lead the partition as the metadata says (cluster mode): from `epoch`, with this ISR.
        As Kafka's makeLeader: a state older than the partition epoch known here (an
        AlterPartition answer may come before the metadata) is ignored; a new leader epoch
        starts at the log end offset and resets the followers' states."""
        if partition_epoch < self.partition_epoch:
            logger.info("leadership state older than the partition's ignored", partition=repr(self),
                        leader_epoch=epoch, partition_epoch=partition_epoch, known_partition_epoch=self.partition_epoch)
            return
        if self.role is not Role.LEADER or epoch != self._led_epoch:
            logger.info("leading", partition=repr(self), leader_epoch=epoch, partition_epoch=partition_epoch,
                        isr=list(isr), log_end_offset=self.log.log_end_offset)
        now = self.log.time()
        hw = self._initial_high_watermark()
        new_leader = self.role is not Role.LEADER or self._led_epoch < 0
        new_epoch = epoch > self._led_epoch
        self.become_leader(epoch)
        self.role, self.leader_id = Role.LEADER, -1
        self.partition_epoch, self.replicas, self.isr = partition_epoch, list(replicas), list(isr)
        self.isr_state = IsrState(tuple(isr))
        if any(r != self.local_id for r in replicas):
            if self.followers is None:
                self.followers = Followers(self.local_id)
            self.followers.assign(replicas)
        else:
            self.followers = None
        self._high_watermark = hw
        if new_epoch:
            self._led_epoch = epoch
            end = self.log.log_end_offset
            self.leader_epoch_start_offset = end
            if self.followers is not None:
                for replica in self.followers.states.values():
                    replica.reset(now, end, new_leader, replica.broker_id in isr)
        self._maybe_increment_high_watermark(now)
        self._complete_delayed_produces()

    def make_follower(self, leader: int, epoch: int, partition_epoch: int, replicas: list[int],
                      isr: list[int]) -> None:
        """Follow `leader` (-1: none yet) in `epoch`, as the metadata says (cluster mode). The
        log's epoch cache learns the leader's epochs from the batches it copies."""
        if self.role is not Role.FOLLOWER or leader != self.leader_id:
            logger.info("following", partition=repr(self), leader=leader, leader_epoch=epoch,
                        partition_epoch=partition_epoch, log_end_offset=self.log.log_end_offset)
        self._high_watermark = self._initial_high_watermark()  # the follower side moves it on
        self.followers = None
        self._led_epoch = -1
        self.isr_state = IsrState(tuple(isr))
        self.role, self.leader_id = Role.FOLLOWER, leader
        self.log.leader_epoch = max(self.log.leader_epoch, epoch)
        self._complete_delayed_produces()  # acks=all produces waiting here: NOT_LEADER_OR_FOLLOWER
        self.partition_epoch, self.replicas, self.isr = partition_epoch, list(replicas), list(isr)

    def _initial_high_watermark(self) -> int:
        """The high watermark a new role starts from: the one kept so far, or at the first role of
        this process the checkpointed one (replication-offset-checkpoint; 0 when none, as Kafka),
        so that records a crashed leader had not replicated stay hidden until they are."""
        if self._restored:
            self._restored = False
            return max(self.log.log_start_offset, min(self._high_watermark, self.log.log_end_offset))
        return self.high_watermark

    @property
    def high_watermark(self) -> int:
        """The offset below which every record is on every in-sync replica: consumers read below
        it. A leader alone (a single node) has it at its log end offset after every append."""
        log = self.log
        if self.leads_alone:
            return log.log_end_offset
        return max(log.log_start_offset, min(self._high_watermark, log.log_end_offset))

    @property
    def last_stable_offset(self) -> int:
        """The LSO: read_committed consumers read below it. The first offset of the oldest
        transaction still open here, else the high watermark."""
        first = self.producers.first_unstable_offset()
        hw = self.high_watermark
        if first is None or first > hw:
            return hw
        return max(first, self.log.log_start_offset)  # retention may have taken the transaction's start

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    # writes ------------------------------------------------------------------------------------
    def append_records(self, records: Buffer, verification: VerificationState | None = None,
                       required_acks: int = 1) -> ProduceResult:
        """Validate producer state, append, update state and wake fetchers (synchronous).
        `verification`: the guard of the verification of a transactional batch that opens a
        transaction here (start_verification). acks=all (`required_acks` -1) is refused while
        the ISR is below min.insync.replicas."""
        self._check_leader()
        self.check_enough_replicas(required_acks)
        try:
            batches = list(iter_batches(records, strict=True))
            headers = [h for _, h in batches]
            crc_checked = any(h.producer_id >= 0 for h in headers)
            if crc_checked:
                # a corrupt batch is reported as such, not judged by the sequence it seems to carry
                for pos, _ in batches:
                    validate_batch(records, pos)
        except ProtocolError as exc:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
        for header in headers:
            duplicate = self.producers.check(header)
            if duplicate is not None:
                return ProduceResult(duplicate.first_offset, -1, self.log.log_start_offset)
            state = self._verifications.get(header.producer_id) if header.is_transactional else None
            if state is not None:
                self._check_verified_sequence(header, state)
            if header.is_transactional and not header.is_control and self.needs_verification(header) and (
                    verification is None or self._verifications.get(header.producer_id) is not verification):
                raise KafkaError(ErrorCode.INVALID_TXN_STATE, "Record was not part of an ongoing transaction")
        generation = self.log.generation
        result: AppendResult = self.log.append(records, crc_checked=crc_checked)
        offset = result.first_offset
        for header in headers:
            if header.producer_id >= 0:
                self.producers.update(header._replace(base_offset=offset))
                if header.is_transactional:
                    self._verifications.pop(header.producer_id, None)
            offset += header.last_offset_delta + 1
        if self.log.generation != generation:
            self.take_snapshot()  # the log rolled a segment
        self.notify()
        return ProduceResult(result.first_offset, result.log_append_time, result.log_start_offset)

    async def append(self, records: Buffer, verification: VerificationState | None = None,
                     required_acks: int = 1) -> ProduceResult:
        """Append and return once the write is durable under the flush policy."""
        result = self.append_records(records, verification, required_acks)
        if self.log.needs_flush():
            await self.group_commit.commit(self.log.log_end_offset)
        return result

    # transactions ------------------------------------------------------------------------------
    def needs_verification(self, header: BatchHeader) -> bool:
        """A transactional batch of a producer without a transaction open here (with its epoch)."""
        return not self.producers.in_transaction(header.producer_id, header.producer_epoch)

    def start_verification(self, producer_id: int, sequence: int | None = None,
                           supports_epoch_bump: bool = False) -> VerificationState:
        """A guard for the verification of a transaction about to open here, by the batch starting
        at `sequence`; a marker for the producer written before the append invalidates it (Kafka's
        VerificationGuard). Requests in flight together share one, which keeps their lowest sequence."""
        lowest = INT_MAX if sequence is None else sequence
        state = self._verifications.get(producer_id)
        if state is None:
            state = self._verifications[producer_id] = VerificationState(lowest, supports_epoch_bump)
        else:
            state.lowest_sequence = min(state.lowest_sequence, lowest)
            state.supports_epoch_bump = state.supports_epoch_bump or supports_epoch_bump
        return state

    def _check_verified_sequence(self, header: BatchHeader, state: VerificationState) -> None:
        """ProducerAppendInfo.checkSequence's checks of a verified transactional batch."""
        first_seq, pid = header.base_sequence, header.producer_id
        where = "producer %d at offset %d in partition %s-%d" % (pid, self.log.log_end_offset, self.topic, self.index)
        if state.supports_epoch_bump and first_seq != 0 and not self.producers.has_state(pid):
            raise KafkaError(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, "Invalid sequence number for %s: %d (incoming seq. "
                             "number). Expected sequence 0 for transactions v2 idempotent producer with no existing "
                             "state." % (where, first_seq))
        if first_seq > state.lowest_sequence:
            raise KafkaError(ErrorCode.OUT_OF_ORDER_SEQUENCE_NUMBER, "Out of order sequence number for %s: %d (incoming "
                             "seq. number), %d (earliest seen sequence)" % (where, first_seq, state.lowest_sequence))

    def append_marker(self, producer_id: int, epoch: int, committed: bool, coordinator_epoch: int = 0,
                      transaction_version: int = 0) -> AppendResult:
        """Close the producer's transaction here with a COMMIT or ABORT marker (synchronous)."""
        self._check_leader()
        self.producers.check_marker(producer_id, epoch, coordinator_epoch, transaction_version)
        kind = ControlRecordType.COMMIT if committed else ControlRecordType.ABORT
        batch = build_control_batch(kind, producer_id, epoch, coordinator_epoch, timestamp=self.log.time())
        generation = self.log.generation
        result = self.log.append(batch, origin=AppendOrigin.COORDINATOR)
        self._verifications.pop(producer_id, None)
        completed = self.producers.apply_marker(producer_id, epoch, coordinator_epoch, result.first_offset,
                                                result.max_timestamp, aborted=not committed)
        if completed is not None and completed.aborted:
            lso = self.producers.last_stable_offset(completed)
            self.log.update_txn_index(result.segment_base_offset, AbortedTxn(
                producer_id, completed.first_offset, completed.last_offset, lso))
        if self.log.generation != generation:
            self.take_snapshot()
        self.notify()
        return result

    async def write_marker(self, producer_id: int, epoch: int, committed: bool, coordinator_epoch: int = 0,
                           transaction_version: int = 0) -> AppendResult:
        """`append_marker`, returning once the marker is durable under the flush policy."""
        result = self.append_marker(producer_id, epoch, committed, coordinator_epoch, transaction_version)
        if self.log.needs_flush():
            await self.group_commit.commit(self.log.log_end_offset)
        return result

    def aborted_transactions(self, fetch_offset: int, upper_bound: int) -> list[AbortedTxn]:
        """The aborted transactions a read_committed fetch of [fetch_offset, upper_bound) returns."""
        return self.log.collect_aborted_txns(fetch_offset, upper_bound)

    # reads -------------------------------------------------------------------------------------
    def fetch_bound(self, isolation_level: int) -> int:
        if isolation_level == LOG_END:
            return self.log.log_end_offset
        return self.last_stable_offset if isolation_level == READ_COMMITTED else self.high_watermark

    def read(self, offset: int, max_bytes: int, isolation_level: int, min_one_message: bool = True) -> FetchDataInfo:
        return self.log.read(offset, max_bytes, self.fetch_bound(isolation_level), min_one_message)

    def offset_for_timestamp(self, timestamp: int) -> TimestampAndOffset | None:
        """The first record at or after `timestamp` (ListOffsets, a share group's by_duration reset)."""
        return self.log.offset_for_timestamp(timestamp)

    def add_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.add(waiter)

    def remove_waiter(self, waiter: asyncio.Future[None]) -> None:
        self._waiters.discard(waiter)

    def notify(self) -> None:
        """The log grew (or the partition changed): a leader with followers sees whether its high
        watermark moves (an ISR of one: to the log end), then every waiting fetch wakes."""
        if self.followers is not None and self.role is Role.LEADER:
            self._maybe_increment_high_watermark(self.log.time())
            self._complete_delayed_produces()
        self._wake_waiters()

    def _wake_waiters(self) -> None:
        if self._waiters:
            for waiter in self._waiters:
                if not waiter.done():
                    waiter.set_result(None)
            self._waiters.clear()

    # replication: the leader side -------------------------------------------------------------
    @property
    def leads_alone(self) -> bool:
        """A leader without followers (a single node, a replication factor of 1): what it
        appends is committed at once."""
        return self.followers is None and self.role is Role.LEADER

    def min_insync_replicas(self) -> int:
        """Kafka's effectiveMinIsr: min.insync.replicas, at most the number of replicas."""
        if self.followers is None:
            return 1
        configured = dict(self.log.config.extra).get("min.insync.replicas")
        return min(int(configured) if configured is not None else 1, len(self.followers.states) + 1)

    def _check_leader(self) -> None:
        """Only the leader appends (Kafka's appendRecordsToLeader, leaderLogIfLocal): whatever sent
        the write (a client, the transaction coordinator's markers, a coordinator's own log) may
        go by a view of the metadata that this replica has not followed yet, and a follower that
        appended in its leader's epoch would hold a batch its leader never wrote, at an offset and
        epoch that truncation cannot tell apart (found by the fault runs: a marker written to a
        follower)."""
        if self.role is not Role.LEADER:
            raise KafkaError(ErrorCode.NOT_LEADER_OR_FOLLOWER, "Leader not local for partition %s-%d" % (
                self.topic, self.index))

    def check_enough_replicas(self, required_acks: int) -> None:
        """Before an acks=all append: NOT_ENOUGH_REPLICAS while the ISR is below
        min.insync.replicas (Kafka's appendRecordsToLeader)."""
        if required_acks == -1 and self.followers is not None and len(self.isr_state.isr) < self.min_insync_replicas():
            raise KafkaError(ErrorCode.NOT_ENOUGH_REPLICAS, "The size of the current ISR %s is insufficient to "
                             "satisfy the min.isr requirement of %d for partition %s-%d" % (
                                 set(self.isr_state.isr), self.min_insync_replicas(), self.topic, self.index))

    def _maybe_increment_high_watermark(self, now_ms: int) -> bool:
        """Move the stored high watermark up to the smallest log end offset of the (maximal) ISR
        and of the caught-up followers that may join it; never back, and not while the ISR is
        below min.insync.replicas (KIP-966). True when it moved."""
        followers = self.followers
        if followers is None or len(self.isr_state.isr) < self.min_insync_replicas():
            return False
        candidate = high_watermark_candidate(self.log.log_end_offset, followers, self.isr_state, now_ms,
                                             self.replica_lag_time_max_ms, self.broker_statuses)
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            return True
        return False

    async def wait_replicated(self, required_offset: int, timeout_s: float) -> ErrorCode:
        """An acks=all produce appended up to `required_offset` (exclusive): wait until the high
        watermark passes it (NONE, or NOT_ENOUGH_REPLICAS_AFTER_APPEND if the ISR fell below
        min.insync.replicas), this node stops leading (NOT_LEADER_OR_FOLLOWER) or the timeout
        (REQUEST_TIMED_OUT), as Kafka's DelayedProduce. No wait when it is already replicated."""
        outcome = self._produce_outcome(required_offset)
        if outcome is not None:
            return outcome
        loop = asyncio.get_running_loop()
        delayed = _DelayedProduce(required_offset, loop.create_future())
        self._delayed_produces.append(delayed)
        # a timer, not asyncio.timeout: request handlers need not run as tasks of their own
        expiry = loop.call_later(timeout_s, _expire, delayed.future)
        try:
            return await delayed.future
        finally:
            expiry.cancel()
            if delayed in self._delayed_produces:
                self._delayed_produces.remove(delayed)

    async def replicated(self, required_offset: int, timeout_s: float, acks_all: bool = True) -> None:
        """`wait_replicated` for a write below `required_offset`: returns once committed, raises
        its error (KafkaError) otherwise. `acks_all` False: a write appended as acks=1 and held
        until committed (a coordinator's, as Kafka's runtime does), which an ISR fallen below
        min.insync.replicas meanwhile does not fail."""
        if self.leads_alone:
            return
        code = await self.wait_replicated(required_offset, timeout_s)
        if code is ErrorCode.NONE or (code is ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND and not acks_all):
            return
        raise KafkaError(code, "offset %d of %r not replicated" % (required_offset - 1, self))

    def _produce_outcome(self, required_offset: int) -> ErrorCode | None:
        if self.role is not Role.LEADER or self.deleted:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        size = len(self.isr_state.maximal_isr) if self.followers is not None else 1
        return acks_all_outcome(self.high_watermark, required_offset, size, self.min_insync_replicas())

    def _complete_delayed_produces(self) -> None:
        if not self._delayed_produces:
            return
        waiting = []
        for delayed in self._delayed_produces:
            outcome = self._produce_outcome(delayed.required_offset)
            if outcome is None:
                waiting.append(delayed)
            elif not delayed.future.done():
                delayed.future.set_result(outcome)
        self._delayed_produces = waiting

    def follower_fetch(self, replica_id: int, broker_epoch: int, current_leader_epoch: int, fetch_offset: int,
                       log_start_offset: int, last_fetched_epoch: int) -> tuple[int, int] | None:
        """Check a follower's Fetch of this partition before its read (Kafka's fetchRecords for a
        follower): this node leads it, the follower is one of its replicas, and its history
        agrees with ours. Returns the diverging epoch (epoch, end offset) the follower must
        truncate to, or None: then read up to the log end and call `update_follower` after."""
        self._check_leader()
        if self.followers is None or self.followers.get(replica_id) is None:
            # with a leader epoch, the (replica, epoch) pair is not known yet (a reassignment): retry
            code = ErrorCode.UNKNOWN_LEADER_EPOCH if current_leader_epoch >= 0 else ErrorCode.NOT_LEADER_OR_FOLLOWER
            raise KafkaError(code, "Replica %d is not recognized as a valid replica of %s-%d in leader epoch %d with "
                             "partition epoch %d" % (replica_id, self.topic, self.index, self.leader_epoch,
                                                     self.partition_epoch))
        if last_fetched_epoch < 0:
            return None
        epoch, end_offset = self.log.end_offset_for_epoch(last_fetched_epoch)
        if epoch < 0 or end_offset < 0:
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, "Could not determine the end offset of the last fetched "
                             "epoch %d from the request" % last_fetched_epoch)
        if fetch_offset < self.log.log_start_offset:
            raise KafkaError(ErrorCode.OFFSET_OUT_OF_RANGE, "Received request for offset %d for partition %s-%d, but "
                             "we only have log segments in the range %d to %d." % (
                                 fetch_offset, self.topic, self.index, self.log.log_start_offset,
                                 self.log.log_end_offset))
        if epoch < last_fetched_epoch or end_offset < fetch_offset:
            return epoch, end_offset
        return None

    def update_follower(self, replica_id: int, broker_epoch: int, fetch_offset: int, log_start_offset: int,
                        leader_end_offset: int) -> None:
        """Record a follower's fetch (its log end is `fetch_offset`; the leader's log ended at
        `leader_end_offset` when the fetch came): it may join the ISR, the high watermark may move
        (waking consumers and acks=all produces). A stale broker epoch (KIP-903):
        NOT_LEADER_OR_FOLLOWER."""
        followers = self.followers
        replica = followers.get(replica_id) if followers is not None else None
        if followers is None or replica is None or self.role is not Role.LEADER:
            return
        now = self.log.time()
        status = self.broker_statuses(replica_id) if self.broker_statuses is not None else None
        previous_end = replica.log_end_offset
        replica.update_fetch_state(fetch_offset, log_start_offset, now, leader_end_offset, broker_epoch,
                                   status.epoch if status is not None else None)
        if can_join_isr(replica, self.isr_state, self.high_watermark, self.leader_epoch_start_offset, followers,
                        self.broker_statuses):
            self._submit_isr_change(self.isr_state.expand(replica_id))
        if previous_end != replica.log_end_offset and self._maybe_increment_high_watermark(now):
            self._complete_delayed_produces()
            self._wake_waiters()

    def maybe_shrink_isr(self) -> None:
        """Take out of the ISR the followers not caught up for replica.lag.time.max.ms (Kafka's
        isr-expiration task calls this every half of it)."""
        if self.followers is None or self.role is not Role.LEADER or self.isr_state.in_flight:
            return
        out = out_of_sync_replicas(self.isr_state, self.followers, self.log.log_end_offset, self.log.time(),
                                   self.replica_lag_time_max_ms)
        if out:
            logger.info("shrinking ISR", partition=repr(self), isr=list(self.isr_state.isr), out_of_sync=sorted(out),
                        high_watermark=self.high_watermark, log_end_offset=self.log.log_end_offset)
            self._submit_isr_change(self.isr_state.shrink(out))

    def _submit_isr_change(self, proposed: IsrState) -> None:
        """Send the ISR change to the controller (AlterPartition); the partition stays in the
        pending state until the answer (or new metadata) comes."""
        self.isr_state = proposed
        sender = self.alter_partition
        if sender is None:
            return  # nobody to ask: pending until the metadata says otherwise
        followers = self.followers
        epochs = []
        for r in proposed.sent_isr:
            replica = followers.get(r) if followers is not None else None
            epoch = replica.broker_epoch if replica is not None else None
            epochs.append(-1 if epoch is None else epoch)  # the local broker's: the manager fills it in
        sent = LeaderAndIsr(self.local_id, self.leader_epoch, proposed.sent_isr, self.partition_epoch, tuple(epochs))
        future = sender.submit(self.topic_id, self.topic, self.index, sent)
        future.add_done_callback(lambda f: self._alter_partition_done(proposed, f))

    def _alter_partition_done(self, proposed: IsrState, future: asyncio.Future[LeaderAndIsr]) -> None:
        """The controller's answer to an ISR change, as Kafka's Partition handles it."""
        if future.cancelled():
            return
        error = future.exception()  # retrieved even when out of date (else asyncio logs it as lost)
        if self.isr_state is not proposed:
            return  # the metadata changed the partition meanwhile: this answer is out of date
        if error is None:
            answer = future.result()
            if answer.leader_epoch != self.leader_epoch or answer.partition_epoch < self.partition_epoch:
                return  # stale: stay pending until the metadata says more
            self.isr_state = IsrState(answer.isr)
            self.isr = list(answer.isr)
            self.partition_epoch = answer.partition_epoch
            logger.info("ISR updated", partition=repr(self), isr=list(answer.isr),
                        partition_epoch=answer.partition_epoch)
            if self._maybe_increment_high_watermark(self.log.time()):
                self._wake_waiters()
            self._complete_delayed_produces()
            return
        code = error.code if isinstance(error, KafkaError) else ErrorCode.UNKNOWN_SERVER_ERROR
        if code in (ErrorCode.OPERATION_NOT_ATTEMPTED, ErrorCode.INELIGIBLE_REPLICA):
            # the controller says the request was not applied: back to the committed ISR
            self.isr_state = proposed.committed()
            logger.info("ISR change refused", partition=repr(self), error=code.name, isr=list(self.isr_state.isr))
        elif code in (ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.UNKNOWN_TOPIC_ID, ErrorCode.FENCED_LEADER_EPOCH,
                      ErrorCode.INVALID_UPDATE_VERSION, ErrorCode.INVALID_REQUEST, ErrorCode.NEW_LEADER_ELECTED):
            # out of sync with the controller: pending until the metadata brings the partition's state
            logger.info("ISR change failed", partition=repr(self), error=code.name)
        else:
            logger.warning("ISR change failed, retrying", partition=repr(self), error=code.name)
            asyncio.get_running_loop().call_later(ALTER_PARTITION_RETRY_S, self._retry_isr_change, proposed)

    def _retry_isr_change(self, proposed: IsrState) -> None:
        if self.isr_state is proposed and self.role is Role.LEADER:
            self._submit_isr_change(proposed)

    # producer-state snapshots ------------------------------------------------------------------
    def take_snapshot(self) -> None:
        """Write the producer state as a `.snapshot` at the log end offset (on the event loop:
        the state must not change while it is written). Never fails the caller."""
        end = self.log.log_end_offset
        if end == self._snapshot_offset or end == self.log.log_start_offset:
            return  # up to date, or nothing to replay
        try:
            write_snapshot(self.log.dir, end, self.producers.producers.values())
            self._snapshot_offset = end
        except OSError as exc:
            logger.warning("producer snapshot not written", partition=repr(self), error=str(exc))

    def _load_snapshot(self, at_most: int) -> int:
        """Start the producer state from the latest snapshot at or below `at_most` (and not below
        the log start); returns its offset, or the log start offset when none serves."""
        directory = self.log.dir
        start = self.log.log_start_offset
        for offset in reversed(list_snapshots(directory, self.log.take_listing())):
            if offset > self.log.log_end_offset:
                delete_snapshot(directory, offset)  # left by a log since truncated
                continue
            if offset > at_most or offset < start:
                continue
            try:
                self.producers.load_entries(read_snapshot(directory, offset))
            except (OSError, CorruptSnapshotError) as exc:
                logger.warning("producer snapshot unusable", partition=repr(self), offset=offset, error=str(exc))
                delete_snapshot(directory, offset)
                continue
            self._snapshot_offset = offset
            return offset
        self.producers.clear()
        return start

    # startup -----------------------------------------------------------------------------------
    def rebuild_producer_state(self) -> None:
        """Load the producer state from the latest snapshot and replay the batches after it; the
        aborted-transaction indexes of segments recovered after a crash are rebuilt on the way
        (the snapshot then comes from before them)."""
        producers = self.producers
        recovered_from = self.log.recovered_from
        start = self._load_snapshot(self.log.log_end_offset if recovered_from is None else recovered_from)
        segments = self.log.segments
        for i, segment in enumerate(segments):
            if i + 1 < len(segments) and segments[i + 1].base_offset <= start:
                continue  # wholly below the snapshot
            rebuild_index = recovered_from is not None and segment.base_offset >= recovered_from
            if rebuild_index:
                segment.txn_index.reset()
            if segment.producer_batches is False or start >= segment.next_offset:
                continue  # nothing to replay here (recovery saw no producer's batch in it)
            position = 0 if segment.base_offset >= start else segment.find_position(start) or 0
            for pos, header in segment.iter_batches_from(position):
                if header.producer_id < 0 or header.base_offset < start:
                    continue
                if not header.is_control:
                    producers.update(header)
                    continue
                marker = _marker(segment.read_batch_bytes(pos, header.size))
                if marker is None:
                    continue
                committed, coordinator_epoch = marker
                completed = producers.apply_marker(header.producer_id, header.producer_epoch, coordinator_epoch,
                                                   header.base_offset, header.max_timestamp, not committed)
                if rebuild_index and completed is not None and completed.aborted:
                    segment.txn_index.append(AbortedTxn(header.producer_id, completed.first_offset,
                                                        completed.last_offset, producers.last_stable_offset(completed)))
        self.log.recovered_from = None

    # a follower's log (cluster mode, replication) ---------------------------------------------
    def append_as_follower(self, records: Buffer) -> AppendResult:
        """Append the leader's batches exactly as they are (offsets, epochs, timestamps, CRCs:
        Kafka's appendAsFollower), an incomplete trailing batch of a fetch response left out. The
        epoch cache learns the batches' leader epochs; the producer state and the aborted-
        transaction index follow them without judging them (the leader did)."""
        view = memoryview(records)
        end = 0
        headers: list[tuple[int, BatchHeader]] = []
        try:
            for pos, header in iter_batches(view):
                headers.append((pos, header))
                end = pos + header.size
        except ProtocolError as exc:
            raise KafkaError(ErrorCode.CORRUPT_MESSAGE, str(exc)) from None
        if not headers:
            return self.log.append_as_follower(b"")
        generation = self.log.generation
        result = self.log.append_as_follower(view[:end])
        for pos, header in headers:
            if header.producer_id < 0:
                continue
            if not header.is_control:
                self.producers.update(header)
                continue
            marker = _marker(bytes(view[pos:pos + header.size]))
            if marker is None:
                continue
            committed, coordinator_epoch = marker
            completed = self.producers.apply_marker(header.producer_id, header.producer_epoch, coordinator_epoch,
                                                    header.base_offset, header.max_timestamp, not committed)
            if completed is not None and completed.aborted:
                self.log.update_txn_index(result.segment_base_offset, AbortedTxn(
                    header.producer_id, completed.first_offset, completed.last_offset,
                    self.producers.last_stable_offset(completed)))
        if self.log.generation != generation:
            self.take_snapshot()  # the log rolled a segment
        return result

    def update_follower_high_watermark(self, leader_high_watermark: int) -> bool:
        """Take the leader's high watermark, never beyond this log's end (Kafka's
        maybeUpdateHighWatermark on a follower); True when it moved."""
        hw = max(min(leader_high_watermark, self.log.log_end_offset), self.log.log_start_offset)
        if hw == self._high_watermark:
            return False
        self._high_watermark = hw
        self.notify()
        return True

    def follow_log_start_offset(self, leader_log_start_offset: int) -> None:
        """The leader's log start moved on (retention, DeleteRecords): so does this copy, up to its
        high watermark (Kafka's maybeIncrementLogStartOffset, LeaderOffsetIncremented)."""
        offset = min(leader_log_start_offset, self.high_watermark)
        if offset > self.log.log_start_offset:
            self.log.delete_records_before(offset, self.high_watermark)

    def truncate_to(self, offset: int) -> None:
        """Remove every batch at or after `offset` (Kafka's truncateTo: segments, indexes, the
        aborted-transaction index and the epoch cache); the producer state is rebuilt from the
        latest snapshot below the new end and the batches after it."""
        removes_batches = offset < self.log.log_end_offset
        self.log.truncate_to(offset)  # at or past the end: only the epoch cache's entries there, if any
        if removes_batches:
            self._after_truncation()

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop the whole log and start it empty at `offset` (the leader's log start is past this
        log's end)."""
        self.log.truncate_fully_and_start_at(offset)
        self._after_truncation()

    def _after_truncation(self) -> None:
        self._verifications.clear()
        self._snapshot_offset = -1
        self.rebuild_producer_state()  # deletes the snapshots beyond the new end
        log = self.log
        self._high_watermark = max(min(self._high_watermark, log.log_end_offset), log.log_start_offset)
        self.group_commit.reset(self.log.recovery_point)


def _expire(future: asyncio.Future[ErrorCode]) -> None:
    if not future.done():
        future.set_result(ErrorCode.REQUEST_TIMED_OUT)


def _marker(batch: bytes) -> tuple[bool, int] | None:
    """(committed, coordinator epoch) of a transaction marker batch; None for another control
    batch (or an empty one, left by the cleaner)."""
    try:
        _, records = decode_batch(batch, verify_crc=False)
        if not records:
            return None
        kind, coordinator_epoch = parse_control_record(records[0])
    except ProtocolError:
        return None
    if kind not in (ControlRecordType.COMMIT, ControlRecordType.ABORT):
        return None
    return kind is ControlRecordType.COMMIT, coordinator_epoch
