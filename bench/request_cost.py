"""What one request costs the broker: CPU per request and round trip, for requests sent one at a
time over one connection with raw frames (no client library in the way).

    python bench/request_cost.py [--seconds 4] [--apis describe_cluster,metadata,offset_commit]
    python bench/request_cost.py --rounds 3 --root . --root ../main     # two checkouts, alternating
    python bench/request_cost.py --placement same     # broker and client on one CPU (or: apart, free)

Starts `python -m broker` (tests.harness.BrokerProcess, data on disk), warms each request up,
then sends it back to back for `--seconds` and reads the broker's CPU time from /proc. The
difference between a request and DescribeCluster (which does next to nothing) is what its own
handling costs; DescribeCluster itself is the price of the server path (socket, frame, decode,
encode). The heartbeat is a classic group member's (joined and synced first), with
group.heartbeat.hold.ms=0 so that it is answered at once rather than held (the default since
issue 25; set for older checkouts). With several
`--root`s (checkouts of this repository) and `--rounds`, each round runs every checkout's broker
in turn (the order alternating), so that versions compare in the same minutes of a noisy
machine; the medians per checkout come last. `--root tansu` measures Tansu (bench/peers.py) the
same way, for the requests it advertises. Prints one JSON object.

Where the scheduler puts the client relative to the broker moves the figures by 2x on the 2-core
bench VM, more than any version does: on one CPU the response's write wakes the client there (and
the client's request the broker); on two, every request and response wakes a halted vCPU with an
inter-processor interrupt (VM exits) and finds its caches cold. With the default `--placement free`
that choice changes from run to run (a busy machine tends to put both on one CPU: it is then the
cheaper case); `same` pins the broker and the client to the first CPU, `apart` the broker to the
first and the client to the second, so that versions compare in one placement.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from protocol import messages as M  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess, RawClient  # noqa: E402

TOPIC = "request-cost"
GROUP = "request-cost"
MEMBER_GROUP = "request-cost-member"  # the heartbeat's classic group
OC = M.OffsetCommitRequest
REQUESTS: dict[str, tuple[int, int, Any]] = {
    "describe_cluster": (60, 0, M.DescribeClusterRequest()),
    "metadata": (3, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False)),
    "offset_commit": (8, 9, OC(group_id="request-cost", generation_id_or_member_epoch=-1, member_id="", topics=[
        OC.OffsetCommitRequestTopic(name=TOPIC, partitions=[
            OC.OffsetCommitRequestPartition(partition_index=0, committed_offset=1, committed_metadata="")])])),
    "offset_fetch": (9, 8, M.OffsetFetchRequest(groups=[M.OffsetFetchRequest.OffsetFetchRequestGroup(
        group_id="request-cost", topics=[M.OffsetFetchRequest.OffsetFetchRequestTopics(
            name=TOPIC, partition_indexes=[0])])])),
    "heartbeat": (12, 4, M.HeartbeatRequest(group_id=MEMBER_GROUP, generation_id=-1, member_id="")),
}
FIND_COORDINATOR, JOIN_GROUP, SYNC_GROUP = 10, 11, 14
OVERRIDES = {"group.heartbeat.hold.ms": "0"}  # a heartbeat is answered at once
PLACEMENTS = ("free", "same", "apart")
CPUS = sorted(os.sched_getaffinity(0))


def pin_broker(placement: str) -> None:
    """Before the broker starts: it inherits this process's CPUs (the first one, unless free)."""
    if placement != "free":
        os.sched_setaffinity(0, CPUS[:1])


def pin_client(placement: str) -> None:
    """Once the broker runs: this process (the client) goes to the broker's CPU, or to the second."""
    if placement == "same":
        os.sched_setaffinity(0, CPUS[:1])
    elif placement == "apart":
        os.sched_setaffinity(0, CPUS[1:2] or CPUS[:1])


def unpin() -> None:
    os.sched_setaffinity(0, CPUS)


def join_group(port: int) -> tuple[int, str]:
    """Make a one-member classic group (JoinGroup twice: the first asks for a member id, then
    SyncGroup) and return the member's generation and id, for the heartbeats."""
    client = RawClient(port, "request-cost")
    client.sock.settimeout(40)  # Tansu answers the second JoinGroup after about 20 s
    try:
        J = M.JoinGroupRequest
        join = J(group_id=MEMBER_GROUP, session_timeout_ms=45000, rebalance_timeout_ms=10000, member_id="",
                 protocol_type="consumer", protocols=[J.JoinGroupRequestProtocol(name="range", metadata=b"")])
        first = client.call(JOIN_GROUP, 9, join)
        join.member_id = first.member_id
        joined = client.call(JOIN_GROUP, 9, join)
        assert joined.error_code == 0, joined
        S = M.SyncGroupRequest
        synced = client.call(SYNC_GROUP, 5, S(
            group_id=MEMBER_GROUP, generation_id=joined.generation_id, member_id=joined.member_id,
            protocol_type="consumer", protocol_name=joined.protocol_name,
            assignments=[S.SyncGroupRequestAssignment(member_id=joined.member_id, assignment=b"")]))
        assert synced.error_code == 0, synced
        return joined.generation_id, joined.member_id
    finally:
        client.close()


def cpu_seconds(pid: int) -> float:
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(kafka: BrokerProcess, name: str, seconds: float) -> dict[str, Any]:
    key, version, request = REQUESTS[name]
    client = RawClient(kafka.port, "request-cost")
    try:
        for _ in range(1000):
            client.call(key, version, request)
        cpu0, t0, n = cpu_seconds(kafka.proc.pid), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            client.call(key, version, request)
            n += 1
        elapsed, cpu = time.perf_counter() - t0, cpu_seconds(kafka.proc.pid) - cpu0
    finally:
        client.close()
    return {"api": name, "requests": n, "round_trip_us": round(elapsed / n * 1e6, 1),
            "broker_cpu_us": round(cpu / n * 1e6, 1)}


class _Tansu:
    """Tansu (bench/peers.py) where measure() expects a BrokerProcess: a port and a process."""

    def __init__(self) -> None:
        import peers

        self.peer = peers.start_tansu()
        self.port = int(self.peer.bootstrap.rsplit(":", 1)[1])
        self.proc = self.peer.proc
        self.keys = peers.api_keys(self.peer.bootstrap) or set()

    def stop(self) -> None:
        self.peer.stop()
        shutil.rmtree(self.peer.workdir, ignore_errors=True)


def run_broker(root: Path, apis: list[str], seconds: float, placement: str = "free") -> list[dict[str, Any]]:
    """Start the broker of the checkout `root` (or Tansu, for the root "tansu") and measure each
    request against it (requests Tansu does not advertise give null)."""
    with tempfile.TemporaryDirectory() as tmp:
        pin_broker(placement)
        try:
            if str(root) == "tansu":
                kafka: Any = _Tansu()
                apis = [a if REQUESTS[a][0] in kafka.keys else "" for a in apis]
            else:
                kafka = BrokerProcess(Path(tmp) / "data", overrides=OVERRIDES, root=root.resolve()).start()
        finally:
            unpin()
        pin_client(placement)
        try:
            create_topic(kafka, TOPIC)
            setup = RawClient(kafka.port, "request-cost")
            setup.call(FIND_COORDINATOR, 3, M.FindCoordinatorRequest(key=GROUP, key_type=0))
            setup.close()
            if "heartbeat" in apis:
                try:
                    generation, member = join_group(kafka.port)
                except (AssertionError, OSError):
                    if not isinstance(kafka, _Tansu):
                        raise
                    apis = ["" if a == "heartbeat" else a for a in apis]  # Tansu's groups rebalance on and on
                else:
                    heartbeat = REQUESTS["heartbeat"][2]
                    heartbeat.generation_id, heartbeat.member_id = generation, member
            return [measure(kafka, name, seconds) if name else {"broker_cpu_us": None} for name in apis]
        finally:
            unpin()
            kafka.stop()


def _median(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.median(known) if known else None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--apis", default="describe_cluster,metadata,offset_commit,offset_fetch,heartbeat")
    ap.add_argument("--root", action="append", default=[],
                    help="a checkout whose broker to measure, or `tansu` (repeatable)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--placement", choices=PLACEMENTS, default="free",
                    help="the broker and the client: where the scheduler puts them, on one CPU, or on two")
    args = ap.parse_args()
    roots = [Path(r) for r in args.root] or [ROOT]
    apis = args.apis.split(",")
    rounds = []
    for i in range(args.rounds):
        order = roots if i % 2 == 0 else roots[::-1]
        rounds.append({str(root): run_broker(root, apis, args.seconds, args.placement) for root in order})
    out: dict[str, Any] = {"cpus": os.cpu_count(), "placement": args.placement}
    if len(roots) == 1 and args.rounds == 1:
        out["results"] = rounds[0][str(roots[0])]
    else:
        out["rounds"] = rounds
        out["median_broker_cpu_us"] = {
            str(root): {api: _median([r[str(root)][i]["broker_cpu_us"] for r in rounds]) for i, api in enumerate(apis)}
            for root in roots
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
