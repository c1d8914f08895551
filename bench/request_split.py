"""Where a small request's broker CPU goes on a live connection: user space (the interpreter,
uvloop) against the kernel, by system call (perf sampling).

    python bench/request_split.py [--apis describe_cluster,offset_commit] [--seconds 4] [--root ../main]
                                  [--placement free|same|apart]

Starts `python -m broker` as bench/request_cost.py does, warms each request up, then sends it back
to back for `--seconds` while `perf record -g` samples the broker's threads (kernel stacks have
frame pointers, so each kernel sample shows the system call it belongs to). Prints, per request,
the broker's CPU µs per request (from /proc, perf's own overhead included) and the share of the
samples in user space and in each system call; within the response's write, the share that is
the client's side of loopback TCP (the softirq delivering the segment runs in the sender) and the
wakeup of the client. `--placement` as in request_cost.py. Needs perf (linux-perf) and perf_event_paranoid <= 1 or root.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import request_cost as rc  # noqa: E402

from protocol import messages as M  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess, RawClient  # noqa: E402

# what do_syscall_64 called -> the system call's name
_SYSCALLS = {"ksys_write": "write", "ksys_read": "read", "__x64_sys_epoll_pwait": "epoll_pwait",
             "__x64_sys_epoll_wait": "epoll_wait", "ksys_pwrite64": "pwrite", "__x64_sys_pwrite64": "pwrite",
             "exit_to_user_mode_loop": "preempted on return from a syscall"}


def split(stacks: list[list[tuple[str, bool]]]) -> dict[str, float]:
    """Samples (leaf first: symbol, whether in the kernel) -> share of each part, in %."""
    parts: Counter[str] = Counter()
    for stack in stacks:
        if not stack[0][1]:
            parts["user space"] += 1
            continue
        names = [name for name, _ in stack]
        if "do_syscall_64" not in names:
            parts["kernel, outside syscalls"] += 1
            continue
        i = names.index("do_syscall_64")
        call = _SYSCALLS.get(names[i - 1], names[i - 1]) if i else "syscall entry"
        parts["kernel: " + call] += 1
        if call == "write" and "tcp_v4_rcv" in names:
            parts["kernel: write: the client's receive (softirq)"] += 1
            if "sock_def_readable" in names:
                parts["kernel: write: the client's receive: waking it"] += 1
    total = max(1, len(stacks))
    shares = {k: 100 * v / total for k, v in parts.items()}
    small = [k for k, v in shares.items() if v < 0.5 and k.startswith("kernel: ")]  # folded: noise
    if small:
        shares["kernel: other syscalls"] = shares.get("kernel: other syscalls", 0.0) + sum(shares.pop(k) for k in small)
    return {k: round(v, 1) for k, v in sorted(shares.items(), key=lambda kv: -kv[1])}


def read_stacks(data: Path) -> list[list[tuple[str, bool]]]:
    out = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym,dso"], capture_output=True, text=True,
                         check=True).stdout
    stacks: list[list[tuple[str, bool]]] = []
    stack: list[tuple[str, bool]] = []
    for line in out.splitlines() + [""]:
        fields = line.split()
        if not fields:
            if stack:
                stacks.append(stack)
            stack = []
        elif len(fields) >= 3:
            stack.append((fields[1], "kernel" in fields[-1]))
    return stacks


def measure(kafka: BrokerProcess, name: str, seconds: float, workdir: Path) -> dict[str, Any]:
    key, version, request = rc.REQUESTS[name]
    client = RawClient(kafka.port, "request-split")
    data = workdir / ("%s.perf" % name)
    try:
        for _ in range(1000):
            client.call(key, version, request)
        assert kafka.proc is not None
        perf = subprocess.Popen(["perf", "record", "-q", "-F", "999", "-g", "-o", str(data), "-p", str(kafka.proc.pid)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(0.5)  # perf attaches
        cpu0, t0, n = rc.cpu_seconds(kafka.proc.pid), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            client.call(key, version, request)
            n += 1
        cpu = rc.cpu_seconds(kafka.proc.pid) - cpu0
        perf.send_signal(signal.SIGINT)
        perf.wait(60)
    finally:
        client.close()
    return {"api": name, "requests": n, "broker_cpu_us": round(cpu / n * 1e6, 1), "share_pct": split(read_stacks(data))}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--apis", default="describe_cluster,offset_commit")
    ap.add_argument("--root", default=str(ROOT), help="the checkout whose broker to measure")
    ap.add_argument("--placement", choices=rc.PLACEMENTS, default="free")
    args = ap.parse_args()
    apis = args.apis.split(",")
    with tempfile.TemporaryDirectory(prefix="request-split-") as tmp:
        rc.pin_broker(args.placement)
        try:
            kafka = BrokerProcess(Path(tmp) / "data", overrides=rc.OVERRIDES, root=Path(args.root).resolve()).start()
        finally:
            rc.unpin()
        rc.pin_client(args.placement)
        try:
            create_topic(kafka, rc.TOPIC)
            setup = RawClient(kafka.port, "request-split")
            setup.call(rc.FIND_COORDINATOR, 3, M.FindCoordinatorRequest(key=rc.GROUP, key_type=0))
            setup.close()
            if "heartbeat" in apis:
                heartbeat = rc.REQUESTS["heartbeat"][2]
                heartbeat.generation_id, heartbeat.member_id = rc.join_group(kafka.port)
            results = [measure(kafka, name, args.seconds, Path(tmp)) for name in apis]
        finally:
            rc.unpin()
            kafka.stop()
    print(json.dumps({"cpus": os.cpu_count(), "placement": args.placement, "results": results}, indent=1))


if __name__ == "__main__":
    main()
