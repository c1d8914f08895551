"""What one request costs the broker: CPU per request and round trip, for requests sent one at a
time over one connection with raw frames (no client library in the way).

    python bench/request_cost.py [--seconds 4] [--apis describe_cluster,metadata,offset_commit]

Starts `python -m broker` (tests.harness.BrokerProcess, data on disk), warms each request up,
then sends it back to back for `--seconds` and reads the broker's CPU time from /proc. The
difference between a request and DescribeCluster (which does next to nothing) is what its own
handling costs; DescribeCluster itself is the price of the server path (socket, frame, decode,
encode). Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol import messages as M  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess, RawClient  # noqa: E402

TOPIC = "request-cost"
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
}
FIND_COORDINATOR = 10


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


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--apis", default="describe_cluster,metadata,offset_commit,offset_fetch")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        kafka = BrokerProcess(Path(tmp) / "data").start()
        try:
            create_topic(kafka, TOPIC)
            setup = RawClient(kafka.port, "request-cost")
            setup.call(FIND_COORDINATOR, 3, M.FindCoordinatorRequest(key="request-cost", key_type=0))
            setup.close()
            results = [measure(kafka, name, args.seconds) for name in args.apis.split(",")]
        finally:
            kafka.stop()
    print(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
