"""The workload of a fault run: real clients (confluent-kafka) in threads of the test process,
each recording what it does and sees into the history (tests/chaos/history.py), stamped when
the client call returned or its callback ran:

- `IdempotentProducer`: acks=all, enable.idempotence, a unique value per record, partitions
  drawn from its seed; every send, acknowledgement and failed delivery.
- `TransactionalProducer`: transactions of 1-4 unique records, a share of them aborted (drawn
  from its seed); begin, every send, commit or abort, and outcomes left unknown.
- `GroupMember`: a member of a classic (`group.protocol=classic`) or KIP-848
  (`group.protocol=consumer`) group, read_committed, committing its position synchronously
  every `commit_every` seconds; assignments, revocations, reads and commits. A member lives for
  a lifetime drawn from its seed, then leaves and a new one takes its place, so groups rebalance.
- `ShareMember`: a share group member (explicit acknowledgement): deliveries, and each
  commit_sync of its acknowledgements (mostly ACCEPT, some RELEASE, few REJECT); lives as a
  group member does.

Clients retry through unavailability as they do by default; a worker never stops on an error
(it records it). `Worker.stop` asks it to finish: producers flush what they hold, members leave.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from confluent_kafka import (
    AcknowledgeType,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    ShareConsumer,
    TopicPartition,
)

from tests.chaos.history import History, Kind

# commit errors after which the commit certainly did not happen (any other: it may have)
NOT_COMMITTED = {KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID, KafkaError.REBALANCE_IN_PROGRESS,
                 KafkaError.STALE_MEMBER_EPOCH, KafkaError.FENCED_MEMBER_EPOCH, KafkaError._ASSIGNMENT_LOST}
DEBUG = "broker,topic,msg,protocol,eos,cgrp,consumer"
LOGS = {"log_level": 2}  # librdkafka logs only critical lines: a fault run makes many errors, all retried
ACK_TYPES = ((AcknowledgeType.ACCEPT, "accept", 0.85), (AcknowledgeType.RELEASE, "release", 0.12),
             (AcknowledgeType.REJECT, "reject", 0.03))


def _error_name(error: Any) -> str:
    if isinstance(error, KafkaException):
        error = error.args[0] if error.args else error
    return error.name() if isinstance(error, KafkaError) else str(error)


class Worker:
    """A thread running one client role until `stop`."""

    role = "worker"
    debug_dir: Path | None = None  # set: each client logs librdkafka's `debug=DEBUG` contexts into <dir>/<client>.log

    def __init__(self, name: str, bootstrap: str, history: History, seed: int) -> None:
        self.name = name
        self.bootstrap = bootstrap
        self.history = history
        self.rng = random.Random("%s/%s" % (seed, name))
        self.stopping = threading.Event()
        self.errors: list[str] = []
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def start(self) -> Worker:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()

    def join(self, timeout: float) -> bool:
        """True once the thread ended."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def _main(self) -> None:
        self.record(Kind.WORKER, op="start", role=self.role, detail=None)
        try:
            self.run()
        except Exception as e:  # in the history and the report: the run goes on without it
            self.errors.append("%s: %s" % (type(e).__name__, e))
            self.record(Kind.WORKER, op="failed", role=self.role, detail=self.errors[-1])
        else:
            self.record(Kind.WORKER, op="stop", role=self.role, detail=None)

    def logs(self, client: str) -> dict[str, Any]:
        """The client's logging properties: critical lines only, or its debug log in `debug_dir`."""
        if self.debug_dir is None:
            return dict(LOGS)
        logger = logging.getLogger("chaos.client.%s" % client)
        if not logger.handlers:
            self.debug_dir.mkdir(parents=True, exist_ok=True)
            handler = logging.FileHandler(self.debug_dir / ("%s.log" % client))
            handler.setFormatter(logging.Formatter("%(created).6f %(message)s"))
            logger.addHandler(handler)
            logger.setLevel(logging.DEBUG)
            logger.propagate = False
        return {"debug": DEBUG, "logger": logger}

    def record(self, kind: Kind, client: str | None = None, **data: Any) -> None:
        self.history.add(kind, client or self.name, **data)

    def run(self) -> None:
        raise NotImplementedError


class IdempotentProducer(Worker):
    role = "idempotent producer"

    def __init__(self, name: str, bootstrap: str, history: History, seed: int, topic: str, partitions: int,
                 rate: float = 40.0, flush_timeout: float = 30.0) -> None:
        super().__init__(name, bootstrap, history, seed)
        self.topic, self.partitions, self.rate, self.flush_timeout = topic, partitions, rate, flush_timeout
        self.unflushed = 0

    def _producer(self) -> Producer:
        return Producer({"bootstrap.servers": self.bootstrap, "client.id": self.name, "acks": "all", **self.logs(self.name),
                         "enable.idempotence": True, "linger.ms": 5, "message.timeout.ms": 60000,
                         "error_cb": self._on_error})

    def _on_error(self, error: KafkaError) -> None:
        if error.fatal():
            self.errors.append("fatal: %s" % error)
            self.record(Kind.WORKER, op="fatal", role=self.role, detail=str(error))

    def _delivered(self, error: KafkaError | None, msg: Any) -> None:
        value = msg.value().decode()
        if error is None:
            self.record(Kind.ACK, topic=msg.topic(), partition=msg.partition(), offset=msg.offset(), value=value,
                        txn=None)
        else:
            self.record(Kind.SEND_FAIL, topic=msg.topic(), partition=msg.partition(), value=value,
                        error=error.name(), txn=None)

    def run(self) -> None:
        producer = self._producer()
        fatal = len(self.errors)
        n = 0
        next_send = time.monotonic()
        while not self.stopping.is_set():
            if len(self.errors) > fatal:  # a fatal idempotence error: this producer is done, a new one goes on
                producer.flush(5)
                producer = self._producer()
                fatal = len(self.errors)
            value = "%s-%d" % (self.name, n)
            partition = self.rng.randrange(self.partitions)
            self.record(Kind.SEND, topic=self.topic, partition=partition, value=value, txn=None)
            while True:
                try:
                    producer.produce(self.topic, value=value.encode(), partition=partition,
                                     on_delivery=self._delivered)
                    break
                except BufferError:
                    producer.poll(0.1)
            n += 1
            next_send += 1.0 / self.rate
            while not self.stopping.is_set() and time.monotonic() < next_send:
                producer.poll(max(0.0, next_send - time.monotonic()))  # serves callbacks until the next send
        self.unflushed = producer.flush(self.flush_timeout)


class TransactionalProducer(Worker):
    role = "transactional producer"

    def __init__(self, name: str, bootstrap: str, history: History, seed: int, topic: str, partitions: int,
                 abort_ratio: float = 0.3, pause: float = 0.1) -> None:
        super().__init__(name, bootstrap, history, seed)
        self.topic, self.partitions, self.abort_ratio, self.pause = topic, partitions, abort_ratio, pause
        self.committed = self.aborted = self.unknown = 0

    def _producer(self) -> Producer:
        """A producer with its transactional id initialized, tried again (a new client each time:
        an error can leave one unusable) until it works or the worker is asked to stop."""
        while True:
            producer = Producer({"bootstrap.servers": self.bootstrap, "client.id": self.name, **self.logs(self.name),
                                 "transactional.id": self.name, "transaction.timeout.ms": 20000, "linger.ms": 5,
                                 "message.timeout.ms": 20000})
            try:
                producer.init_transactions(20)
                return producer
            except KafkaException as e:
                if self.stopping.is_set():
                    raise
                self.record(Kind.WORKER, op="retry", role=self.role, detail="init_transactions: %s" % e)
                self.stopping.wait(0.5)

    def _delivered(self, txn: str) -> Any:
        def delivered(error: KafkaError | None, msg: Any) -> None:
            if error is None:
                self.record(Kind.ACK, topic=msg.topic(), partition=msg.partition(), offset=msg.offset(),
                            value=msg.value().decode(), txn=txn)
            else:
                self.record(Kind.SEND_FAIL, topic=msg.topic(), partition=msg.partition(),
                            value=msg.value().decode(), error=error.name(), txn=txn)
        return delivered

    def run(self) -> None:
        producer = self._producer()
        n = 0
        while not self.stopping.is_set():
            txn = "%s-t%d" % (self.name, n)
            n += 1
            abort = self.rng.random() < self.abort_ratio
            try:
                producer.begin_transaction()
                self.record(Kind.TXN_BEGIN, txn=txn, t0=time.monotonic())
                for k in range(self.rng.randint(1, 4)):
                    partition = self.rng.randrange(self.partitions)
                    value = "%s-%d" % (txn, k)
                    self.record(Kind.SEND, topic=self.topic, partition=partition, value=value, txn=txn)
                    producer.produce(self.topic, value=value.encode(), partition=partition,
                                     on_delivery=self._delivered(txn))
                producer.poll(0)
                if not self._finish(producer, txn, abort):
                    producer = self._replace(producer)
            except KafkaException as e:
                self.record(Kind.TXN_UNKNOWN, txn=txn, error=_error_name(e), stage="produce")
                self.unknown += 1
                producer = self._replace(producer)
            self.stopping.wait(self.pause)

    def _finish(self, producer: Producer, txn: str, abort: bool) -> bool:
        """Commit or abort `txn`, following librdkafka's advice on errors (retry a retriable one,
        abort after an abortable one); False when the producer is unusable (fatal error)."""
        stage = "abort" if abort else "commit"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            t0 = time.monotonic()
            try:
                if stage == "abort":
                    producer.abort_transaction(20)
                    self.record(Kind.TXN_ABORT, txn=txn, t0=t0)
                    self.aborted += 1
                else:
                    producer.commit_transaction(20)
                    self.record(Kind.TXN_COMMIT, txn=txn, t0=t0)
                    self.committed += 1
                return True
            except KafkaException as e:
                error = e.args[0]
                self.record(Kind.TXN_UNKNOWN, txn=txn, error=_error_name(e), stage=stage)
                if error.fatal():
                    self.unknown += 1
                    return False
                if error.txn_requires_abort():
                    stage = "abort"
                elif not error.retriable():
                    self.unknown += 1
                    return False
        self.unknown += 1
        return False

    def _replace(self, producer: Producer) -> Producer:
        """A new producer with the same transactional id: init_transactions fences the old one
        and ends its open transaction (aborted or completed as it was decided)."""
        producer.flush(1)
        return self._producer()


class GroupMember(Worker):
    """One consumer group slot: a member that leaves after its lifetime and is replaced by a new
    one (`<name>.<incarnation>` in the history)."""

    def __init__(self, name: str, bootstrap: str, history: History, seed: int, group: str, protocol: str,
                 topics: list[str], lifetime: tuple[float, float] = (3.0, 8.0), commit_every: float = 0.5) -> None:
        super().__init__(name, bootstrap, history, seed)
        self.group, self.protocol, self.topics = group, protocol, topics
        self.lifetime, self.commit_every = lifetime, commit_every
        self.role = "%s group member" % protocol
        self.reads = self.commits = 0

    def _config(self, client: str) -> dict[str, Any]:
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": client, **self.logs(client),
                                "group.protocol": self.protocol, "enable.auto.commit": False,
                                "auto.offset.reset": "earliest", "isolation.level": "read_committed"}
        if self.protocol == "classic":
            conf.update({"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        return conf

    def run(self) -> None:
        incarnation = 0
        while not self.stopping.is_set():
            self._live("%s.%d" % (self.name, incarnation), self.rng.uniform(*self.lifetime))
            incarnation += 1

    def _live(self, client: str, lifetime: float) -> None:
        owned: dict[tuple[str, int], int] = {}  # (topic, partition) -> the next offset to commit (-1: none read)

        def by_topic(partitions: Iterable[Any]) -> dict[str, list[int]]:
            found: dict[str, list[int]] = defaultdict(list)
            for tp in partitions:
                found[tp.topic].append(tp.partition)
            return found

        def assigned(consumer: Any, partitions: list[Any]) -> None:
            for topic, ps in by_topic(partitions).items():
                self.record(Kind.ASSIGN, client, group=self.group, topic=topic, partitions=sorted(ps))
                for p in ps:
                    owned[(topic, p)] = -1

        def revoked(consumer: Any, partitions: list[Any]) -> None:
            for topic, ps in by_topic(partitions).items():
                self.record(Kind.REVOKE, client, group=self.group, topic=topic, partitions=sorted(ps))
                for p in ps:
                    owned.pop((topic, p), None)

        consumer = Consumer(self._config(client))
        consumer.subscribe(self.topics, on_assign=assigned, on_revoke=revoked, on_lost=revoked)
        ends = time.monotonic() + lifetime
        next_commit = time.monotonic() + self.commit_every
        try:
            while not self.stopping.is_set() and time.monotonic() < ends:
                received: list[Any] = consumer.consume(100, 0.2)  # Message's getters are Optional in the stubs
                for msg in received:
                    if msg.error() is not None:
                        continue  # librdkafka's own retries go on; the history judges the outcome
                    key = (msg.topic(), msg.partition())
                    self.record(Kind.READ, client, group=self.group, topic=msg.topic(), partition=msg.partition(),
                                offset=msg.offset(), value=msg.value().decode(), isolation="read_committed")
                    self.reads += 1
                    if key in owned:
                        owned[key] = msg.offset() + 1
                if time.monotonic() >= next_commit:
                    self._commit(consumer, client, owned)
                    next_commit = time.monotonic() + self.commit_every
            self._commit(consumer, client, owned)
        finally:
            consumer.close()

    def _commit(self, consumer: Consumer, client: str, owned: dict[tuple[str, int], int]) -> None:
        wanted = {key: offset for key, offset in owned.items() if offset >= 0}
        if not wanted:
            return
        t0 = time.monotonic()
        errors: dict[tuple[str, int], KafkaError] = {}
        try:
            result = consumer.commit(offsets=[TopicPartition(t, p, o) for (t, p), o in wanted.items()],
                                     asynchronous=False)
            for tp in result or []:
                if tp.error is not None:
                    errors[(tp.topic, tp.partition)] = tp.error
        except KafkaException as e:
            errors = {key: e.args[0] for key in wanted}
        # refused for certain: not committed; any other error: it may have landed
        definite = all(error.code() in NOT_COMMITTED for error in errors.values())
        ok: bool | None = True if not errors or definite else None
        self.commits += 1
        for topic in sorted({t for t, _ in wanted}):
            offsets = {p: o for (t, p), o in wanted.items() if t == topic}
            failed = {p: _error_name(error) for (t, p), error in errors.items() if t == topic}
            self.record(Kind.COMMIT, client, group=self.group, topic=topic, offsets=offsets, failed=failed, t0=t0,
                        ok=ok)
        for key in wanted:  # committed (or tried): the next commit is for what is read after
            if owned.get(key) == wanted[key]:
                owned[key] = -1


class ShareMember(Worker):
    role = "share group member"

    def __init__(self, name: str, bootstrap: str, history: History, seed: int, group: str, topics: list[str],
                 lifetime: tuple[float, float] = (3.0, 8.0)) -> None:
        super().__init__(name, bootstrap, history, seed)
        self.group, self.topics, self.lifetime = group, topics, lifetime
        self.deliveries = self.acks = 0

    def run(self) -> None:
        incarnation = 0
        while not self.stopping.is_set():
            self._live("%s.%d" % (self.name, incarnation), self.rng.uniform(*self.lifetime))
            incarnation += 1

    def _ack_type(self) -> tuple[Any, str]:
        roll = self.rng.random()
        for kind, name, share in ACK_TYPES:
            if roll < share:
                return kind, name
            roll -= share
        return ACK_TYPES[0][0], ACK_TYPES[0][1]

    def _live(self, client: str, lifetime: float) -> None:
        consumer = ShareConsumer({"bootstrap.servers": self.bootstrap, "group.id": self.group, "client.id": client, **self.logs(client),
                                  "share.acknowledgement.mode": "explicit"})
        consumer.subscribe(self.topics)
        ends = time.monotonic() + lifetime
        try:
            while not self.stopping.is_set() and time.monotonic() < ends:
                t0 = time.monotonic()
                try:
                    messages = consumer.poll(0.3)
                except KafkaException as e:
                    self.record(Kind.WORKER, client, op="poll_error", role=self.role, detail=str(e))
                    if e.args and isinstance(e.args[0], KafkaError) and e.args[0].fatal():
                        return  # this client is done; the next incarnation takes over
                    self.stopping.wait(0.1)
                    continue
                acked: dict[tuple[str, int, str], list[int]] = defaultdict(list)
                delivered: list[Any] = list(messages)  # Message's getters are Optional in the stubs
                for msg in delivered:
                    if msg.error() is not None:
                        continue
                    self.record(Kind.SHARE_DELIVER, client, group=self.group, topic=msg.topic(),
                                partition=msg.partition(), offset=msg.offset(), value=msg.value().decode(),
                                delivery_count=msg.delivery_count(), t0=t0)
                    self.deliveries += 1
                    kind, name = self._ack_type()
                    consumer.acknowledge(msg, kind)
                    acked[(msg.topic(), msg.partition(), name)].append(msg.offset())
                if acked:
                    self._commit(consumer, client, acked)
        finally:
            try:
                consumer.close()
            except KafkaException as e:
                self.record(Kind.WORKER, client, op="close_error", role=self.role, detail=_error_name(e))

    def _commit(self, consumer: ShareConsumer, client: str, acked: dict[tuple[str, int, str], list[int]]) -> None:
        t0 = time.monotonic()
        errors: dict[tuple[str, int], str | None] = {}
        try:
            for tp, error in consumer.commit_sync(10).items():
                errors[(tp.topic, tp.partition)] = None if error is None else _error_name(error)
            outcome = None
        except KafkaException as e:
            outcome = _error_name(e)
        self.acks += 1
        for (topic, partition, name), offsets in sorted(acked.items()):
            refused = errors.get((topic, partition), outcome or "no answer")
            self.record(Kind.SHARE_ACK, client, group=self.group, topic=topic, partition=partition, offsets=offsets,
                        ack_type=name, t0=t0, ok=refused is None, error=refused)
