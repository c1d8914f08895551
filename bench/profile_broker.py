"""Where our broker spends its CPU under kbench's produce and consume loads (py-spy sampling).

    python bench/profile_broker.py [--sizes 10240] [--top 25] [--duration 10] [--native]

Starts `python -m broker` (peers.start_ours), runs kbench produce,consume against it and,
following kbench's progress lines, records one py-spy profile per test phase (produce_10KB_acks1,
consume_10KB, ...). Prints, per phase, the functions with the most samples on their own
(self) and including callees (total), as a share of that phase's samples; writes the raw
collapsed stacks (flamegraph.pl / speedscope input) and a JSON summary to bench/results/.
Needs py-spy (pip install py-spy); samples only while the broker runs Python (idle excluded).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import peers  # noqa: E402

BENCH = Path(__file__).resolve().parent
PHASE = re.compile(r"\] ((?:produce|consume)_\S+) \.\.\.$")
FRAME_FILE = re.compile(r"\((.*?)(:\d+)?\)$")


def find_py_spy() -> str | None:
    return shutil.which("py-spy") or next(
        (p for p in [os.path.join(os.path.dirname(sys.executable), "py-spy")] if os.access(p, os.X_OK)), None
    )


def short(frame: str) -> str:
    """'send (/x/site-packages/uvloop/x.py:12)' -> 'send (uvloop/x.py:12)', repo files relative."""
    m = FRAME_FILE.search(frame)
    if not m:
        return frame
    path = m.group(1)
    for marker in ("site-packages/", "lib/python3.11/", str(peers.REPO) + "/"):
        if marker in path:
            path = path.split(marker, 1)[1]
            break
    return frame[: m.start()] + "(" + path + (m.group(2) or "") + ")"


def hotspots(raw: str, top: int) -> dict[str, Any]:
    """Self and inclusive sample counts per function from py-spy's raw (collapsed) output."""
    own: Counter[str] = Counter()
    total: Counter[str] = Counter()
    n = 0
    for line in raw.splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        c = int(count)
        frames = [short(f) for f in stack.split(";")]
        n += c
        own[frames[-1]] += c
        for f in set(frames):
            total[f] += c
    pct = (lambda v: round(100.0 * v / n, 1)) if n else (lambda v: 0.0)
    return {
        "samples": n,
        "self": [(f, pct(v)) for f, v in own.most_common(top)],
        "total": [(f, pct(v)) for f, v in total.most_common(top)],
    }


class Recorder:
    """One py-spy process at a time, attached to the broker; SIGINT makes it write its output."""

    def __init__(self, py_spy: str, pid: int, outdir: Path, rate: int, native: bool = False) -> None:
        self.py_spy, self.pid, self.outdir, self.rate, self.native = py_spy, pid, outdir, rate, native
        self.proc: subprocess.Popen[bytes] | None = None
        self.phase: str | None = None
        self.done: dict[str, Path] = {}

    def start(self, phase: str) -> None:
        self.stop()
        out = self.outdir / ("%s.txt" % phase)
        self.proc = subprocess.Popen(
            [self.py_spy, "record", "--pid", str(self.pid), "--rate", str(self.rate), "--format", "raw",
             "--function", "--output", str(out)] + (["--native"] if self.native else ["--nonblocking"]),
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.phase = phase
        self.done[phase] = out

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None
        self.phase = None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="10240,100")
    ap.add_argument("--acks", default="1,all", help="consume reads the first acks value's topic")
    ap.add_argument("--duration", type=float, default=10.0, help="kbench seconds per produce run")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    ap.add_argument("--native", action="store_true", help="also sample C frames (uvloop, syscalls)")
    ap.add_argument("--hard-timeout", type=float, default=600.0)
    ap.add_argument("--out", default=str(BENCH / "results"))
    a = ap.parse_args()
    py_spy = find_py_spy()
    tools = peers.shared_tools()
    if py_spy is None or tools is None:
        print("needs py-spy (pip install py-spy) and ../shared/tools/kbench.py", file=sys.stderr)
        return 2
    stamp = time.strftime("%Y%m%d-%H%M%S")
    outdir = Path(a.out) / ("profile-%s" % stamp)
    outdir.mkdir(parents=True, exist_ok=True)
    workroot = Path(tempfile.mkdtemp(prefix="bench-profile-"))
    peer = peers.start_ours(workdir=workroot)
    rec = Recorder(py_spy, peer.pid, outdir, a.rate, a.native)
    argv = [sys.executable, str(tools / "kbench.py"), "--bootstrap", peer.bootstrap, "--tests", "produce,consume",
            "--sizes", a.sizes, "--acks", a.acks, "--no-idempotent", "--repeat", "1", "--duration", str(a.duration),
            "--broker-pid", str(peer.pid), "--hard-timeout", "%d" % a.hard_timeout]
    kb = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    deadline = time.monotonic() + a.hard_timeout + 60
    try:
        assert kb.stderr is not None
        for line in kb.stderr:
            sys.stderr.write(line)
            m = PHASE.search(line.rstrip())
            if m:
                rec.start(m.group(1))
            elif "  -> " in line:
                rec.stop()
            if time.monotonic() > deadline:
                kb.kill()
                break
        stdout = kb.communicate(timeout=60)[0]
    finally:
        rec.stop()
        if kb.poll() is None:
            kb.kill()
        peer.stop()
        shutil.rmtree(workroot, ignore_errors=True)
    summary: dict[str, Any] = {"kbench": json.loads(stdout.strip().splitlines()[-1]) if stdout.strip() else None,
                               "phases": {}}
    for phase, path in rec.done.items():
        raw = path.read_text() if path.exists() else ""
        summary["phases"][phase] = hs = hotspots(raw, a.top)
        print("\n=== %s: %d samples (self %% | total %%)" % (phase, hs["samples"]))
        for (f_self, p_self), (f_tot, p_tot) in zip(hs["self"], hs["total"]):
            print("%5.1f  %-62s | %5.1f  %s" % (p_self, f_self[:62], p_tot, f_tot[:70]))
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\nraw stacks and summary: %s" % os.path.relpath(outdir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
