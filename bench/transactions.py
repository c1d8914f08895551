"""Transactions benchmark: our broker beside Tansu, in the same run (confluent-kafka clients by default).

    python bench/transactions.py                  # 3 rounds, ours and tansu alternating
    python bench/transactions.py --client kafka-python --records 50000   # or aiokafka
    python bench/transactions.py --rounds 1 --records 20000
    python bench/transactions.py --peers ours,tansu,mock   # and librdkafka's mock broker
    python bench/transactions.py --peers ours,ours@../main,tansu  # and main's broker, in turn

Per round and broker (each started afresh on 127.0.0.1, never two at once):
  idempotent   `records` records of 1 KB, acks=all, enable.idempotence, linger 10 ms, batch.size
               1 MB (--batch-size), 1 partition
  txn          the same records in transactions of 1000 (begin, produce, commit), acks=all; the
               time of each commit_transaction() after a flush() is the EndTxn round trip seen by
               the client (the produce requests are all answered before it starts)
  consume      the transactional topic read from its start by an assign() consumer, once with
               isolation.level=read_uncommitted and once with read_committed (order alternates),
               after one untimed read of it all: the first read after producing pays for first
               touches (the consumer process's memory, the broker's cold paths), whichever
               isolation level it has, by up to half its rate

The goals (issue 11): transactional produce >= 80 % of the idempotent rate of the same client,
EndTxn p99 <= 5 ms, read_committed >= 90 % of read_uncommitted. Output: a table on stderr, one
JSON object on stdout. Every phase is bounded in records and wall-clock time.

`mock` (librdkafka's mock cluster from ../shared/tools/mock_cluster.py, a C broker in memory
whose commit_transaction() takes about 0.17 ms) is the client's own ceiling: librdkafka runs a
transaction one step after the other (AddPartitionsToTxn about 1 ms after the first record, then
the batches, then EndTxn), so its ratio to the pipelined idempotent rate is bounded by the client
whatever the broker, and the faster a broker's idempotent produce, the lower its ratio.

`--client kafka-python|aiokafka` runs the same steps with that client's producer and consumer
(bench/txn_pyclients.py): its own linger (0) and batch size (16 KB for both) unless --batch-size.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402
from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition  # noqa: E402
from confluent_kafka.admin import AdminClient, NewTopic  # noqa: E402

VALUE = b"v" * 1024
PER_TXN = 1000
PHASE_LIMIT_S = 120.0
BATCH_SIZE = [1 << 20]  # the producers' batch.size (--batch-size)


def log(msg: str) -> None:
    print("[txn-bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def create_topics(peer: peers.Peer, names: list[str]) -> None:
    if peer.control is not None:  # the mock has no CreateTopics: its control port makes topics
        host, port = peer.control.rsplit(":", 1)
        for n in names:
            with socket.create_connection((host, int(port)), timeout=10) as s:
                s.sendall(b"CREATE %s 1\n" % n.encode())
                if not s.recv(100).startswith(b"OK"):
                    raise RuntimeError("the mock refused topic %s" % n)
        return
    admin = AdminClient({"bootstrap.servers": peer.bootstrap})
    futures = admin.create_topics([NewTopic(n, 1, 1) for n in names], operation_timeout=30)
    for f in futures.values():
        f.result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # wait until the topics are served
        md = admin.list_topics(timeout=10)
        if all(n in md.topics and md.topics[n].error is None for n in names):
            return
        time.sleep(0.1)
    raise RuntimeError("topics not ready")


def producer_config(bootstrap: str, **extra: Any) -> dict[str, Any]:
    return {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 10, "batch.size": BATCH_SIZE[0],
            "queue.buffering.max.messages": 200000, "message.timeout.ms": 60000, **extra}


def warm_up(p: Producer, topic: str) -> None:
    """One record first, so that connections, metadata and the producer id are not timed."""
    p.produce(topic, b"warm-up", partition=0)
    if p.flush(30):
        raise RuntimeError("warm-up record not delivered")


def produce_idempotent(bootstrap: str, topic: str, records: int) -> float:
    p = Producer(producer_config(bootstrap, **{"enable.idempotence": True}))
    warm_up(p, topic)
    errors: list[Any] = []
    start = time.perf_counter()
    for _ in range(records):
        while True:
            try:
                p.produce(topic, VALUE, partition=0, on_delivery=lambda e, m: e and errors.append(e))
                break
            except BufferError:
                p.poll(0.01)
        p.poll(0)
    remaining = p.flush(PHASE_LIMIT_S)
    elapsed = time.perf_counter() - start
    if remaining or errors:
        raise RuntimeError("idempotent produce: %d undelivered, errors %s" % (remaining, errors[:3]))
    return records / elapsed


def produce_transactional(bootstrap: str, topic: str, records: int, tid: str) -> tuple[float, list[float]]:
    p = Producer(producer_config(bootstrap, **{"transactional.id": tid}))
    p.init_transactions(30)
    p.begin_transaction()
    warm_up(p, topic)
    p.commit_transaction(30)
    commits: list[float] = []
    start = time.perf_counter()
    sent = 0
    while sent < records:
        p.begin_transaction()
        for _ in range(min(PER_TXN, records - sent)):
            while True:
                try:
                    p.produce(topic, VALUE, partition=0)
                    break
                except BufferError:
                    p.poll(0.01)
            p.poll(0)
        sent += min(PER_TXN, records - sent)
        if p.flush(PHASE_LIMIT_S):
            raise RuntimeError("transactional produce: undelivered records")
        t0 = time.perf_counter()
        p.commit_transaction(30)
        commits.append((time.perf_counter() - t0) * 1000)
        if time.perf_counter() - start > PHASE_LIMIT_S:
            raise RuntimeError("transactional produce took longer than %.0f s" % PHASE_LIMIT_S)
    return records / (time.perf_counter() - start), commits


def consume(bootstrap: str, topic: str, isolation: str, expected: int, group: str | None = None) -> float:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "txn-bench-" + (group or isolation),
                  "enable.auto.commit": False,
                  "isolation.level": isolation, "fetch.max.bytes": 50 << 20,
                  "max.partition.fetch.bytes": 10 << 20, "fetch.wait.max.ms": 100})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        got = 0
        deadline = time.perf_counter() + PHASE_LIMIT_S
        while not got:  # the first record (the warm-up one) starts the clock
            if time.perf_counter() > deadline:
                raise RuntimeError("%s: no record read in %.0f s" % (isolation, PHASE_LIMIT_S))
            for msg in c.consume(num_messages=1, timeout=1):
                got += msg.error() is None
        start = time.perf_counter()
        deadline = start + PHASE_LIMIT_S
        while got < expected and time.perf_counter() < deadline:
            for msg in c.consume(num_messages=10000, timeout=0.5):
                if msg.error() is None:
                    got += 1
        elapsed = time.perf_counter() - start
        if got < expected:
            raise RuntimeError("%s: %d of %d records read" % (isolation, got, expected))
        return got / elapsed
    finally:
        c.close()


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


CLIENTS = ("confluent", "kafka-python", "aiokafka")


class Steps:
    """One client's three timed steps (confluent-kafka's are the functions above)."""

    def __init__(self, client: str, batch_size: int | None) -> None:
        self.client = client
        self.errors: tuple[type[BaseException], ...] = (RuntimeError, KafkaException)
        self.produce_idempotent: Callable[[str, str, int], float] = produce_idempotent
        self.produce_transactional: Callable[[str, str, int, str], tuple[float, list[float]]] = (
            produce_transactional)
        self.consume: Callable[..., float] = consume  # (bootstrap, topic, isolation, expected, group=None)
        if client == "confluent":
            return
        import asyncio

        import aiokafka.errors
        import kafka.errors
        import txn_pyclients as py

        self.errors = (RuntimeError, kafka.errors.KafkaError, aiokafka.errors.KafkaError, asyncio.TimeoutError)
        idem, txn, cons = ((py.kp_produce_idempotent, py.kp_produce_transactional, py.kp_consume)
                           if client == "kafka-python" else
                           (py.aio_produce_idempotent, py.aio_produce_transactional, py.aio_consume))
        self.produce_idempotent = lambda b, t, n: idem(b, t, n, batch_size, PHASE_LIMIT_S)
        self.produce_transactional = lambda b, t, n, tid: txn(b, t, n, tid, batch_size, PHASE_LIMIT_S)
        self.consume = lambda b, t, iso, n, group=None: cons(b, t, iso, n, PHASE_LIMIT_S)  # no group: assign()


def run_round(name: str, records: int, round_no: int, workroot: Path, steps: Steps) -> dict[str, Any]:
    starters: dict[str, Callable[..., peers.Peer]] = {
        "ours": peers.start_ours, "tansu": peers.start_tansu, "mock": peers.start_mock}
    if name.startswith("ours@"):  # another checkout's broker
        peer = peers.start_ours(workdir=workroot, repo=Path(name[len("ours@"):]).resolve())
    else:
        peer = starters[name](workdir=workroot)
    try:
        bootstrap = peer.bootstrap
        idem, txn = "idem-%d" % round_no, "txn-%d" % round_no
        create_topics(peer, [idem, txn])
        out: dict[str, Any] = {}
        try:
            # the two producers take turns going first; the transactional topic holds the warm-up
            # record, then `records` in transactions
            if round_no % 2 == 0:
                out["idempotent_msgs_per_s"] = steps.produce_idempotent(bootstrap, idem, records)
            rate, commits = steps.produce_transactional(bootstrap, txn, records, "bench-%d" % round_no)
            if round_no % 2 == 1:
                out["idempotent_msgs_per_s"] = steps.produce_idempotent(bootstrap, idem, records)
            out["txn_msgs_per_s"] = rate
            out["endtxn_ms"] = {"p50": statistics.median(commits), "p99": pct(commits, 0.99), "max": max(commits),
                                "n": len(commits)}
            if name == "mock":
                return out  # its fetches do not give the log back from the start: produce only
            steps.consume(bootstrap, txn, "read_uncommitted", records + 1, "warm-up")
            order = ["read_uncommitted", "read_committed"]
            if round_no % 2:
                order.reverse()
            for isolation in order:
                out["consume_%s_msgs_per_s" % isolation] = steps.consume(bootstrap, txn, isolation, records + 1)
        except steps.errors as exc:
            out["error"] = str(exc) if steps.client == "confluent" else "%s: %s" % (type(exc).__name__, exc)
        return out
    finally:
        peer.stop()
        # the logs written (about 2 x records KB a round) go; the broker's own log stays
        shutil.rmtree(peer.workdir / "data", ignore_errors=True)


def summary(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    def med(key: str) -> float | None:
        values = [r[key] for r in rounds if key in r]
        return statistics.median(values) if values else None

    idem, txn = med("idempotent_msgs_per_s"), med("txn_msgs_per_s")
    ru, rc = med("consume_read_uncommitted_msgs_per_s"), med("consume_read_committed_msgs_per_s")
    p99s = [r["endtxn_ms"]["p99"] for r in rounds if "endtxn_ms" in r]
    p50s = [r["endtxn_ms"]["p50"] for r in rounds if "endtxn_ms" in r]
    return {
        "idempotent_msgs_per_s": idem, "txn_msgs_per_s": txn,
        "txn_over_idempotent": txn / idem if idem and txn else None,
        "endtxn_p50_ms": statistics.median(p50s) if p50s else None,
        "endtxn_p99_ms": statistics.median(p99s) if p99s else None,
        "consume_read_uncommitted_msgs_per_s": ru, "consume_read_committed_msgs_per_s": rc,
        "read_committed_over_uncommitted": rc / ru if ru and rc else None,
        "errors": [r["error"] for r in rounds if "error" in r],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--records", type=int, default=100000)
    ap.add_argument("--peers", default="ours,tansu")
    ap.add_argument("--batch-size", type=int, default=None,
                    help="the producers' batch size (default: confluent 1 MB, about librdkafka's; "
                         "kafka-python and aiokafka their own, 16 KB)")
    ap.add_argument("--client", choices=CLIENTS, default="confluent",
                    help="whose producer and consumer (default confluent-kafka)")
    args = ap.parse_args()
    if args.client == "confluent":
        args.batch_size = args.batch_size or 1 << 20
        BATCH_SIZE[0] = args.batch_size
    steps = Steps(args.client, args.batch_size)
    names = [n for n in args.peers.split(",") if n]
    if "tansu" in names and peers.find_tansu() is None:
        log("no tansu binary: skipped")
        names.remove("tansu")
    if "mock" in names and peers.shared_tools() is None:
        log("no ../shared/tools/mock_cluster.py: mock skipped")
        names.remove("mock")
    import tempfile

    workroot = Path(tempfile.mkdtemp(prefix="txn-bench-"))
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    unserved: set[str] = set()
    for r in range(args.rounds):
        for name in names if r % 2 == 0 else list(reversed(names)):
            if name in unserved:
                continue
            log("round %d: %s" % (r + 1, name))
            out = run_round(name, args.records, r, workroot, steps)
            results[name].append(out)
            if args.client != "confluent" and set(out) == {"error"}:  # not one step went through
                unserved.add(name)
                log("%s cannot serve %s (%s): skipped in the next rounds" % (name, args.client, out["error"]))
    report = {n: {"summary": summary(rs), "rounds": rs} for n, rs in results.items()}
    rows = [("transactional produce msg/s", "txn_msgs_per_s", "%.0f"),
            ("idempotent produce msg/s", "idempotent_msgs_per_s", "%.0f"),
            ("txn / idempotent (goal >= 0.80)", "txn_over_idempotent", "%.2f"),
            ("EndTxn p50 ms", "endtxn_p50_ms", "%.2f"),
            ("EndTxn p99 ms (goal <= 5)", "endtxn_p99_ms", "%.2f"),
            ("read_uncommitted msg/s", "consume_read_uncommitted_msgs_per_s", "%.0f"),
            ("read_committed msg/s", "consume_read_committed_msgs_per_s", "%.0f"),
            ("committed / uncommitted (goal >= 0.90)", "read_committed_over_uncommitted", "%.2f")]
    width = max(len(r[0]) for r in rows)
    cols = [max(12, len(n)) for n in names]
    print("%-*s  %s" % (width, "", "  ".join("%*s" % (w, n) for w, n in zip(cols, names))), file=sys.stderr)
    for label, key, fmt in rows:
        cells = []
        for w, n in zip(cols, names):
            v = report[n]["summary"][key]
            cells.append("%*s" % (w, fmt % v if v is not None else "-"))
        print("%-*s  %s" % (width, label, "  ".join(cells)), file=sys.stderr)
    for n in names:
        for e in report[n]["summary"]["errors"]:
            print("%s: %s" % (n, e), file=sys.stderr)
    head: dict[str, Any] = {"records": args.records, "per_txn": PER_TXN, "rounds": args.rounds,
                            "batch_size": args.batch_size or 16384}
    if args.client != "confluent":
        head["client"] = args.client
    json.dump({**head, "results": report}, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
