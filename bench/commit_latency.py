"""OffsetCommit round trips, ours against Tansu in interleaved runs (issue 16's bar: our p99 at most
Tansu's in at least 8 of 10 runs).

    python bench/commit_latency.py [--runs 10] [--peers ours,tansu] [--ours-root DIR]
    python bench/commit_latency.py --peers ours,base --ours-root . --base-root ../main

Each run starts every peer afresh in turn (never two at once; the order alternates from one run to
the next so that neither always goes first) and drives it with kbench's `commit` test
(../shared/tools/kbench.py --tests commit --repeat 1: a standalone assign() consumer commits
synchronously 1000 times, then reads the committed offset back 500 times), the same test as
`make bench`'s OffsetCommit row. `base` is our broker from another checkout (`--base-root`), to
compare two versions of ours in the same session. Prints one line per run and a JSON summary.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers  # noqa: E402

KEYS = ("commit_p50_ms", "commit_p99_ms", "fetch_p50_ms", "fetch_p99_ms")


def log(msg: str) -> None:
    print("[commit-bench %s] %s" % (time.strftime("%H:%M:%S"), msg), file=sys.stderr, flush=True)


def start(name: str, a: argparse.Namespace) -> peers.Peer:
    if name == "tansu":
        return peers.start_tansu()
    root = Path(a.base_root if name == "base" else a.ours_root).resolve()
    return peers.start_ours(repo=root)


def run_kbench(name: str, a: argparse.Namespace, kbench: Path) -> dict[str, Any]:
    peer = start(name, a)
    try:
        argv = [sys.executable, str(kbench), "--bootstrap", peer.bootstrap, "--label", name, "--tests", "commit",
                "--repeat", "1", "--broker-pid", str(peer.pid), "--hard-timeout", "%d" % a.timeout]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=a.timeout + 60, stdin=subprocess.DEVNULL)
    finally:
        peer.stop()
        shutil.rmtree(peer.workdir, ignore_errors=True)
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            runs = result.get("runs", {}).get("offset_commit") or [{}]
            return {k: runs[0].get(k) for k in (*KEYS, "commits", "other_cpu_util", "error")}
    return {"error": "no JSON from kbench (rc %s): %s" % (proc.returncode, proc.stderr[-500:])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--peers", default="ours,tansu", help="two or more of ours, base, tansu")
    ap.add_argument("--ours-root", default=str(peers.REPO), help="the checkout whose broker is `ours`")
    ap.add_argument("--base-root", default=None, help="the checkout whose broker is `base`")
    ap.add_argument("--timeout", type=float, default=120.0, help="bound of each kbench run, seconds")
    a = ap.parse_args()
    names = a.peers.split(",")
    if "base" in names and not a.base_root:
        ap.error("--base-root is needed for the peer `base`")
    tools = peers.shared_tools()
    if tools is None:
        sys.exit("kbench.py not found (../shared/tools or $BENCH_SHARED_TOOLS)")
    runs: list[dict[str, Any]] = []
    for i in range(a.runs):
        order = names if i % 2 == 0 else names[::-1]
        run: dict[str, Any] = {}
        for name in order:
            run[name] = run_kbench(name, a, tools / "kbench.py")
        runs.append(run)
        log("run %d: %s" % (i + 1, "  ".join("%s p99 %s ms (p50 %s)" % (
            n, run[n].get("commit_p99_ms"), run[n].get("commit_p50_ms")) for n in names)))
    first, second = names[0], names[1]
    wins = sum(1 for r in runs if r[first].get("commit_p99_ms") is not None
               and r[second].get("commit_p99_ms") is not None
               and r[first]["commit_p99_ms"] <= r[second]["commit_p99_ms"])
    summary: dict[str, Any] = {
        "%s_p99_le_%s" % (first, second): "%d of %d" % (wins, len(runs)),
        "median": {n: {k: statistics.median(v) if (v := [r[n][k] for r in runs if r[n].get(k) is not None]) else None
                       for k in KEYS} for n in names},
        "runs": runs,
    }
    log("%s p99 <= %s in %d of %d runs" % (first, second, wins, len(runs)))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
