"""Replication (issue 23), measured on one cluster of three broker processes on a test etcd
(tests/cluster/harness.py's ProcessCluster with its FAST settings: 3 s broker session, heartbeats
every 0.5 s, 2 s etcd lease), with topics of replication factor 1 and 3 side by side.

    python bench/replication.py [--parts throughput,latency,failover] [--rounds 3] [--loads single,batched]
                                [--producers 4] [--messages 10000] [--batched-messages 200000] [--size 100]
                                [--partitions 6] [--rate 1000] [--latency-s 10] [--linger-ms 0]
                                [--failover-rate 1000] [--kills 5] [--json PATH]

Each round of a part runs every case once on a fresh topic, in an order reversed from one round
to the next; factor 3 topics have min.insync.replicas 2, factor 1 topics Kafka's default (1).

- throughput: bench/cluster.py's load on a topic of `--partitions` partitions (led evenly by the
  three nodes): `--producers` confluent-kafka producer processes, idempotent, acks=all, all
  starting together once warm; records/s and CPU as bench/cluster.py takes them. Two loads:
  `single`, `--messages` records each, one a batch (batch.num.messages 1, linger.ms 0: a Produce
  request a record, what replication costs a request); `batched`, `--batched-messages` records
  each with librdkafka's defaults (batch.num.messages 10000, linger.ms 5).
- latency: a one-partition topic, a paced producer process (idempotent, acks=all, `--linger-ms`)
  sending one record per produce() at `--rate` records/s for `--latency-s` seconds; a record's
  latency is librdkafka's, from produce() to its delivery report (Message.latency());
  p50/p90/p99/max over every record, and the brokers' CPU meanwhile.
- failover: a one-partition topic of factor 3; a producer process (idempotent, acks=all, linger.ms
  0, message.timeout.ms 120000, librdkafka's other defaults) sends `--failover-rate` records/s the
  whole time while the partition's leader is killed (SIGKILL) `--kills` times. After each kill,
  seconds from the signal until a survivor's Metadata names a new leader, until the first
  acknowledgement after the gap the kill leaves (the longest pause between two delivery reports;
  a record retried on the successor) and until the first acknowledgement of a record sent after
  the kill; then the node is started again and the next kill waits until the partition's ISR
  holds all three replicas again. At the end: records whose delivery failed (0 expected) and the
  partition's high watermark against the records acknowledged (equal: nothing lost, nothing
  written twice).

Prints a table of medians (min-max) and the brokers' warnings and errors; `--json PATH` writes
every round. Needs etcd (Debian's etcd-server, /usr/bin/etcd or ETCD_BIN). BENCH_QUICK=1 (as
`make bench` passes it in quick mode) runs one round, fewer records, 3 s of paced latency and
one kill.
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from cluster import (  # noqa: E402
    EXPECTED_AFTER_KILL,
    Brokers,
    brief,
    cpu_seconds,
    finish,
    high_watermarks,
    load_arguments,
    make_topic,
    metadata,
    poll_until,
    produce_load,
    reap,
    spread,
    start_report,
    wait_for,
)

FACTORS = (1, 3)
LOADS = {"single": (1, 0), "batched": (10000, 5)}  # batch.num.messages, linger.ms (librdkafka's defaults)
MIN_ISR = {"min.insync.replicas": "2"}  # on the factor 3 topics only: a factor 1 partition would refuse acks=all

PACED = r"""
import json, sys, time
from confluent_kafka import Producer
bootstrap, topic = sys.argv[1], sys.argv[2]
rate, seconds = float(sys.argv[3]), float(sys.argv[4])
size, linger = int(sys.argv[5]), int(sys.argv[6])
p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": linger})
latencies, failed = [], []
def report(err, msg):
    if err is None:
        latencies.append(msg.latency())
    else:
        failed.append(str(err))
value = b"x" * size
for _ in range(20):  # warm-up: the connection to the leader, the producer id, the metadata
    p.produce(topic, value, partition=0, on_delivery=report)
warm_left = p.flush(60)
latencies.clear()
print("ready", flush=True)
sys.stdin.readline()
count, late = int(rate * seconds), 0
start = time.monotonic()
for i in range(count):
    due = start + i / rate
    now = time.monotonic()
    while now < due:
        p.poll(due - now)  # serves delivery reports while it waits for the next send
        now = time.monotonic()
    late += now - due > 0.002
    p.produce(topic, value, partition=0, on_delivery=report)
    p.poll(0)
sent_s = time.monotonic() - start
left = p.flush(60)
print(json.dumps({"latencies": latencies, "failed": len(failed), "first_error": failed[:1],
                  "undelivered": left + warm_left, "sent_s": sent_s, "late_sends": late}), flush=True)
"""

STEADY = r"""
import select, sys, time
from confluent_kafka import Producer
bootstrap, topic, rate, size = sys.argv[1], sys.argv[2], float(sys.argv[3]), int(sys.argv[4])
p = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 0,
              "message.timeout.ms": 120000})
out = sys.stdout
def report(err, msg, sent):  # one line a record: ok|fail, its send time, its report time (monotonic)
    out.write("%s %.6f %.6f %s\n" % ("ok" if err is None else "fail", sent, time.monotonic(),
                                     "" if err is None else str(err).replace("\n", " ")))
value = b"x" * size
start, i = time.monotonic(), 0
while True:
    due = start + i / rate
    now = time.monotonic()
    while now < due:
        p.poll(due - now)
        now = time.monotonic()
    p.produce(topic, value, partition=0, on_delivery=lambda err, msg, t=now: report(err, msg, t))
    p.poll(0)
    out.flush()
    i += 1
    if i % 50 == 0 and select.select([sys.stdin], [], [], 0)[0]:
        break
left = p.flush(180)
out.write("done %d\n" % left)
out.flush()
"""


def log(msg: str) -> None:
    print("[replication %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest rank of `q` (0-100) in an ascending list."""
    return ordered[min(len(ordered) - 1, max(0, int(round(q / 100 * len(ordered) + 0.5)) - 1))]


def partition_state(brokers: Brokers, node: int, topic: str) -> tuple[int, tuple[int, ...]]:
    """(leader, ISR) of `topic`'s partition 0 as `node` answers Metadata."""
    found = [t for t in metadata(brokers.nodes[node], [topic]).topics if t.name == topic and t.error_code == 0]
    if not found:
        return -1, ()
    p = next(p for p in found[0].partitions if p.partition_index == 0)
    return int(p.leader_id), tuple(sorted(p.isr_nodes))


def fully_replicated(brokers: Brokers, topic: str) -> int | None:
    """The leader of partition 0 once every node sees the same leader and all of them in its ISR."""
    states = {partition_state(brokers, n, topic) for n in brokers.nodes}
    if len(states) != 1:
        return None
    leader, isr = states.pop()
    return leader if leader >= 0 and isr == tuple(sorted(brokers.nodes)) else None


def new_topic(brokers: Brokers, kind: str, factor: int, round_no: int, partitions: int) -> tuple[str, dict[int, int]]:
    name = "%s-rf%d-r%d" % (kind, factor, round_no)
    placement = make_topic(brokers, name, partitions, factor=factor, configs=MIN_ISR if factor > 1 else None)
    wait_for(lambda: isr_whole(brokers, name, factor), 30, "%s's ISRs whole" % name)  # before the load
    return name, placement


def isr_whole(brokers: Brokers, topic: str, factor: int) -> bool:
    found = [t for t in metadata(brokers.nodes[1], [topic]).topics if t.name == topic and t.error_code == 0]
    return bool(found) and all(len(p.isr_nodes) == factor for p in found[0].partitions)


# ------------------------------------------------------------------------------------ throughput


def throughput_round(brokers: Brokers, load: str, factor: int, round_no: int, a: argparse.Namespace) -> dict[str, Any]:
    batch_messages, linger_ms = LOADS[load]
    topic, placement = new_topic(brokers, load, factor, round_no, a.partitions)
    out: dict[str, Any] = {"load": load, "factor": factor,
                           "partitions_per_leader": dict(sorted(Counter(placement.values()).items()))}
    shape = {"messages": a.messages if load == "single" else a.batched_messages, "batch_messages": batch_messages}
    out.update(produce_load(brokers, topic, argparse.Namespace(**{**vars(a), **shape}), linger_ms=linger_ms))
    return out


# ------------------------------------------------------------------------------------ latency


def latency_round(brokers: Brokers, factor: int, round_no: int, a: argparse.Namespace) -> dict[str, Any]:
    """A paced producer on a fresh one-partition topic: every record's latency."""
    topic, placement = new_topic(brokers, "paced", factor, round_no, 1)
    argv = [sys.executable, "-c", PACED, brokers.bootstrap, topic, str(a.rate), str(a.latency_s), str(a.size),
            str(a.linger_ms)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        if not ready or proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the paced producer did not warm up")
        pids = brokers.pids()
        cpu0, t0 = sum(cpu_seconds(pid) for pid in pids), time.monotonic()
        proc.stdin.write("go\n")
        proc.stdin.flush()
        result = json.loads(proc.communicate(timeout=a.latency_s + 90)[0].splitlines()[-1])
        window = time.monotonic() - t0
        broker_cores = (sum(cpu_seconds(pid) for pid in pids) - cpu0) / window
    finally:
        reap(proc)
    ms = sorted(v * 1000 for v in result.pop("latencies"))
    out = {"factor": factor, "leader": placement[0], "records": len(ms), "broker_cores": round(broker_cores, 3),
           "sent_per_s": round(a.rate * a.latency_s / result["sent_s"]), **result}
    if ms:
        out.update({"p50_ms": round(percentile(ms, 50), 2), "p90_ms": round(percentile(ms, 90), 2),
                    "p99_ms": round(percentile(ms, 99), 2), "max_ms": round(ms[-1], 2)})
    return out


# ------------------------------------------------------------------------------------ failover


class Reports:
    """The steady producer's delivery reports as they come (a reader thread of its stdout)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.acks: list[tuple[float, float]] = []  # (sent, reported), in report order
        self.fails: list[tuple[float, float, str]] = []
        self.undelivered: int | None = None
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            kind, _, rest = line.rstrip("\n").partition(" ")
            with self.lock:
                if kind == "ok":
                    sent, reported = rest.split(" ", 1)
                    self.acks.append((float(sent), float(reported)))
                elif kind == "fail":
                    sent, reported, err = rest.split(" ", 2)
                    self.fails.append((float(sent), float(reported), err))
                elif kind == "done":
                    self.undelivered = int(rest)

    def acked_since(self, t: float, sent: bool = False) -> int:
        with self.lock:
            return sum(1 for s, r in self.acks if (s if sent else r) >= t)

    def after_kill(self, t_kill: float) -> dict[str, Any]:
        """The acknowledgements around a kill at `t_kill`: the longest gap between two reports that
        ends after it (the failover), and the first report of a record sent after it."""
        with self.lock:
            times = sorted(r for _, r in self.acks)
            sent_after = [r for s, r in self.acks if s >= t_kill]
            fails = sum(1 for _, r, _ in self.fails if r >= t_kill)
        before = [r for r in times if r < t_kill][-1:]
        after = [r for r in times if r >= t_kill]
        steps = [(b - a_, a_, b) for a_, b in zip(before + after, after)]
        gap, gap_from, gap_to = max(steps) if steps else (None, None, None)
        return {
            "ack_gap_s": None if gap is None else round(gap, 3),
            "first_ack_after_gap_s": None if gap_to is None else round(gap_to - t_kill, 3),
            "acks_before_gap": None if gap_from is None else sum(1 for r in after if r <= gap_from),
            "first_ack_sent_after_kill_s": round(min(sent_after) - t_kill, 3) if sent_after else None,
            "failed_reports": fails,
        }


def kill_leader(brokers: Brokers, topic: str, reports: Reports, a: argparse.Namespace) -> dict[str, Any]:
    victim = wait_for(lambda: fully_replicated(brokers, topic), 60, "%s led with all three in its ISR" % topic)
    settled = time.monotonic()
    wait_for(lambda: reports.acked_since(settled) >= a.failover_rate * 0.5, 30, "acknowledgements before the kill")
    survivors = [n for n in brokers.nodes if n != victim]
    marks = brokers.sigkill(victim)
    deadline = marks.t0 + a.failover_timeout

    def elected() -> None:
        for n in survivors:
            leader, isr = partition_state(brokers, n, topic)
            if leader not in (-1, victim):
                marks.mark("leader_elected")
            if leader not in (-1, victim) and victim not in isr:
                marks.mark("victim_out_of_isr")

    watcher = threading.Thread(target=poll_until, args=(
        deadline, lambda: marks.has("leader_elected", "victim_out_of_isr"), elected, 0.01))
    watcher.start()
    brokers.reap(victim)
    wait_for(lambda: reports.acked_since(marks.t0, sent=True), a.failover_timeout,
             "an acknowledgement of a record sent after the kill")
    watcher.join()
    out: dict[str, Any] = {"killed": victim, "leader_elected_s": marks.seen.get("leader_elected"),
                           "victim_out_of_isr_s": marks.seen.get("victim_out_of_isr"), **reports.after_kill(marks.t0)}
    if out["leader_elected_s"] is not None and out["first_ack_after_gap_s"] is not None:
        # the client's part: librdkafka asks for metadata again at growing intervals (up to 1 s)
        out["first_ack_after_election_s"] = round(out["first_ack_after_gap_s"] - out["leader_elected_s"], 3)
    began = time.monotonic()
    brokers.nodes[victim].start(timeout=40)
    out["restart_listening_s"] = round(time.monotonic() - began, 3)
    wait_for(lambda: fully_replicated(brokers, topic), 60, "%s's ISR whole again" % topic)
    out["restart_in_isr_s"] = round(time.monotonic() - began, 3)
    return out


def failover_part(brokers: Brokers, a: argparse.Namespace) -> dict[str, Any]:
    topic, placement = new_topic(brokers, "kills", 3, 0, 1)
    argv = [sys.executable, "-c", STEADY, brokers.bootstrap, topic, str(a.failover_rate), str(a.size)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    reports = Reports(proc)
    kills: list[dict[str, Any]] = []
    out: dict[str, Any] = {"kills": kills}
    try:
        for k in range(a.kills):
            try:
                kills.append(kill_leader(brokers, topic, reports, a))
            except Exception as exc:  # reported; the remaining kills need a whole cluster
                kills.append({"error": repr(exc)})
                log("kill %d: %r" % (k + 1, exc))
                break
            log("kill %d: %s" % (k + 1, brief(kills[-1])))
        assert proc.stdin is not None
        proc.stdin.write("stop\n")
        proc.stdin.flush()
        proc.wait(200)
        reports.thread.join(10)
        leader = wait_for(lambda: fully_replicated(brokers, topic), 60, "%s led at the end" % topic)
        hw = high_watermarks(brokers.nodes[leader], topic, [0])
        acked = len(reports.acks)
        out.update({"acked": acked, "failed": len(reports.fails), "first_error": reports.fails[0][2] if reports.fails
                    else None, "undelivered": reports.undelivered,
                    "high_watermark": hw[0] if hw else None,
                    "log_matches_acks": hw is not None and hw[0] == acked})
    finally:
        reap(proc)
    return out


# ------------------------------------------------------------------------------------ report

THROUGHPUT_KEYS = ("records_per_s", "records_per_request", "broker_cpu_us_per_record", "producers_cpu_us_per_record",
                   "broker_cores", "producer_cores", "other_cores")
LATENCY_KEYS = ("p50_ms", "p90_ms", "p99_ms", "max_ms", "sent_per_s", "late_sends", "broker_cores")
FAILOVER_KEYS = ("leader_elected_s", "victim_out_of_isr_s", "first_ack_after_gap_s", "first_ack_sent_after_kill_s",
                 "first_ack_after_election_s", "ack_gap_s", "acks_before_gap", "failed_reports", "restart_listening_s", "restart_in_isr_s")


def table(title: str, runs: dict[str, list[dict[str, Any]]], keys: Sequence[str]) -> list[str]:
    lines = [title, "%-34s %s" % ("", "".join("%-26s" % label for label in runs))]
    for key in keys:
        lines.append("%-34s %s" % (key, "".join("%-26s" % spread([r.get(key) for r in rs]) for rs in runs.values())))
    return lines


def summary(report: dict[str, Any]) -> str:
    args, lines = report["args"], []
    if report.get("throughput"):
        lines += table("acks=all throughput, medians (min-max) of %d rounds; %d producers, records of %d B, %d partitions;"
                       " single: %d records each, one a batch, linger.ms 0; batched: %d records each, "
                       "batch.num.messages 10000, linger.ms 5" % (args["rounds"], args["producers"], args["size"],
                                                                  args["partitions"], args["messages"],
                                                                  args["batched_messages"]),
                       report["throughput"], THROUGHPUT_KEYS) + [""]
    if report.get("latency"):
        lines += table("produce latency at %g records/s for %g s (one record a send, linger.ms %d), ms, medians "
                       "(min-max) of %d rounds" % (args["rate"], args["latency_s"], args["linger_ms"], args["rounds"]),
                       report["latency"], LATENCY_KEYS) + [""]
    fail = report.get("failover")
    if fail:
        kills = [k for k in fail["kills"] if "error" not in k]
        lines.append("kill -9 of the leader of a factor 3 partition (min.insync.replicas 2) under %g records/s, "
                     "seconds from the signal, medians (min-max) of %d kills" % (args["failover_rate"], len(kills)))
        for key in FAILOVER_KEYS:
            lines.append("%-34s %s" % (key, spread([k.get(key) for k in kills])))
        lines.append("%-34s %s acknowledged, %s failed, high watermark %s%s" % (
            "records", fail.get("acked"), fail.get("failed"), fail.get("high_watermark"),
            "" if fail.get("log_matches_acks") else " (differs from the acknowledged count)"))
    for note in report.get("notes", []):
        lines.append("note: " + note)
    return "\n".join(lines)


def notes(report: dict[str, Any]) -> list[str]:
    out = []
    for part in ("throughput", "latency"):
        for label, rs in (report.get(part) or {}).items():
            for r in rs:
                for k in ("undelivered", "failed", "error"):
                    if r.get(k):
                        out.append("%s %s: %s %s %s" % (part, label, k, r[k], r.get("first_error") or ""))
    fail = report.get("failover") or {}
    for k in fail.get("kills", []):
        if k.get("error"):
            out.append("failover: %s" % k["error"])
    for k in ("failed", "undelivered", "error"):
        if fail.get(k):
            out.append("failover: %s %s %s" % (k, fail[k], fail.get("first_error") or ""))
    if report.get("stopped", {}).get("killed_after_sigterm"):
        out.append("nodes %s still running 5 s after SIGTERM (killed)" % report["stopped"]["killed_after_sigterm"])
    out += [p for p in report.get("problems", []) if EXPECTED_AFTER_KILL not in p]
    return list(dict.fromkeys(out))


def main(argv: Sequence[str] | None = None) -> int:
    quick = os.environ.get("BENCH_QUICK", "") not in ("", "0")
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="throughput,latency,failover")
    load_arguments(ap, quick, messages=3000 if quick else 10000, partitions=6, idle_s=1.0)
    ap.add_argument("--batched-messages", type=int, default=50000 if quick else 200000,
                    help="records per producer of the batched load")
    ap.add_argument("--loads", default=",".join(LOADS), help="throughput loads: single (a record a batch), batched")
    ap.add_argument("--rate", type=float, default=1000.0, help="records/s of the paced producer (latency)")
    ap.add_argument("--latency-s", type=float, default=3.0 if quick else 10.0)
    ap.add_argument("--linger-ms", type=int, default=0, help="linger.ms of the paced producer (latency)")
    ap.add_argument("--failover-rate", type=float, default=1000.0, help="records/s produced through the kills")
    ap.add_argument("--kills", type=int, default=1 if quick else 5)
    ap.add_argument("--failover-timeout", type=float, default=60.0)
    a, report = start_report(ap, argv, "bench/replication.py")
    if report is None:
        return 0
    parts = a.parts.split(",")
    began = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="bench-replication-"))
    brokers = Brokers("cluster_3", workdir)
    try:
        brokers.start()
        cases: dict[str, list[tuple[str, Callable[[int], dict[str, Any]]]]] = {
            "throughput": [("RF%d %s" % (f, load), partial(throughput_round, brokers, load, f, a=a))
                           for load in a.loads.split(",") for f in FACTORS],
            "latency": [("RF%d" % f, partial(latency_round, brokers, f, a=a)) for f in FACTORS]}
        for part in (p for p in cases if p in parts):
            runs: dict[str, list[dict[str, Any]]] = {label: [] for label, _ in cases[part]}
            for r in range(a.rounds):
                for label, run_round in cases[part] if r % 2 == 0 else cases[part][::-1]:  # alternate the order
                    try:
                        runs[label].append(run_round(r))
                    except Exception as exc:  # a failed round is reported, the others still run
                        runs[label].append({"error": repr(exc)})
                    log("%s %s round %d: %s" % (part, label, r + 1, brief(runs[label][-1])))
            report[part] = runs
        if "failover" in parts:
            try:
                report["failover"] = failover_part(brokers, a)
            except Exception as exc:
                report["failover"] = {"kills": [], "error": repr(exc)}
    finally:
        report["problems"] = brokers.problems()
        report["stopped"] = brokers.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    return finish(report, began, a.json, summary, notes)


if __name__ == "__main__":
    sys.exit(main())
