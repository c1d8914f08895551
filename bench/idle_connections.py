"""Memory of idle connections (issue 16's bar: at most 16 KB each).

Starts our broker, opens N connections from this process that each send one ApiVersions and read
its answer, waits until they count as quiet (the server's idle sweep runs every
min(connections.max.idle.ms / 4, 10 s) and lets go of the receive buffer of a connection quiet
for a whole period; connections.max.idle.ms is raised so that none is closed), and reports the
broker's RSS before, right after the requests and once they are idle, per connection.

    flock /work/notes/bench.lock python bench/idle_connections.py [--connections 3000]
"""

from __future__ import annotations

import argparse
import json
import socket
import struct
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402

# ApiVersions v0: size, api key 18, version 0, correlation id, client id "idle"
API_VERSIONS = struct.pack(">ihhih", 14, 18, 0, 1, 4) + b"idle"


def rss_kb(pid: int) -> int:
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def open_idle(host: str, port: int, n: int) -> list[socket.socket]:
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, port), timeout=10)
        s.sendall(API_VERSIONS)
        (size,) = struct.unpack(">i", s.recv(4, socket.MSG_WAITALL))
        s.recv(size, socket.MSG_WAITALL)
        socks.append(s)
    return socks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=3000)
    args = parser.parse_args()
    peer = peers.start_ours({"connections.max.idle.ms": "8000000"})
    try:
        host, port = peer.bootstrap.rsplit(":", 1)
        time.sleep(1.0)
        before = rss_kb(peer.pid)
        socks = open_idle(host, int(port), args.connections)
        busy = rss_kb(peer.pid)
        time.sleep(22.0)  # two sweeps 10 s apart: each connection is seen quiet by the second
        idle = rss_kb(peer.pid)
        for s in socks:
            s.close()
        result = {
            "connections": args.connections,
            "rss_before_mb": round(before / 1024, 1),
            "rss_after_requests_mb": round(busy / 1024, 1),
            "rss_idle_mb": round(idle / 1024, 1),
            "kb_per_connection_after_requests": round((busy - before) / args.connections, 1),
            "kb_per_idle_connection": round((idle - before) / args.connections, 1),
        }
    finally:
        peer.stop()
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
