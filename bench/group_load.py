"""Loading committed offsets after a restart (issue 16's bar: 10,000 groups with 1,000,000
committed offsets load in at most 3 s, clean or after kill -9, and cost at most 300 MB).

Fills a broker with G groups committing P partitions each (OffsetCommit v8 as a simple consumer),
kills it (kill -9 right after the last commit: its logs are recovered from their last recovery
point) and starts it again on the same data, then stops that one cleanly and starts it once more:
reported for both restarts are the time from the start of the process to every group answering
OffsetFetch without COORDINATOR_LOAD_IN_PROGRESS (its offsets loaded), and the broker's RSS then,
against an empty broker's.

    flock /work/notes/bench.lock python bench/group_load.py [--groups 10000] [--partitions 100]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import peers  # noqa: E402

from protocol import messages as M  # noqa: E402
from tests.harness import RawClient  # noqa: E402

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
LOADING = 14  # COORDINATOR_LOAD_IN_PROGRESS
TOPIC = "group-load"


def create(c: RawClient, partitions: int) -> None:
    R = M.CreateTopicsRequest
    topic = R.CreatableTopic(name=TOPIC, num_partitions=partitions, replication_factor=1, assignments=[], configs=[])
    assert c.call(19, 5, R(topics=[topic], timeout_ms=10000, validate_only=False)).topics[0].error_code == 0


def rss_mb(pid: int) -> float:
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def commit_all(c: RawClient, groups: int, partitions: int) -> None:
    R = M.OffsetCommitRequest
    for g in range(groups):
        request = R(group_id="g%d" % g, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                    topics=[R.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                        R.OffsetCommitRequestPartition(partition_index=p, committed_offset=g + p,
                                                       committed_leader_epoch=-1, committed_metadata="")
                        for p in range(partitions)])])
        response = c.call(OFFSET_COMMIT, 8, request)
        assert all(p.error_code == 0 for t in response.topics for p in t.partitions), response


def all_loaded(c: RawClient, groups: int) -> bool:
    """Whether the groups spread over every __consumer_offsets partition answer (one per 97th)."""
    R = M.OffsetFetchRequest
    for g in range(0, groups, 97):
        request = R(groups=[R.OffsetFetchRequestGroup(group_id="g%d" % g, member_id=None, member_epoch=-1,
                                                      topics=[R.OffsetFetchRequestTopics(name=TOPIC,
                                                                                         partition_indexes=[0])])],
                    require_stable=False)
        answer = c.call(OFFSET_FETCH, 8, request).groups[0]
        if answer.error_code == LOADING or any(p.error_code == LOADING for t in answer.topics for p in t.partitions):
            return False
        if answer.topics[0].partitions[0].committed_offset != g:
            raise AssertionError("group g%d lost its offset: %r" % (g, answer))
    return True


def restart(data: str, groups: int) -> dict[str, Any]:
    started = time.perf_counter()
    peer = peers.start_ours({"log.dirs": data})
    try:
        host, port = peer.bootstrap.rsplit(":", 1)
        c = RawClient(int(port))
        try:
            while not all_loaded(c, groups):
                time.sleep(0.01)
        finally:
            c.close()
        return {"loaded_s": round(time.perf_counter() - started, 2), "rss_mb": round(rss_mb(peer.pid), 1),
                "peer": peer}
    except BaseException:
        peer.stop()
        raise


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--groups", type=int, default=10_000)
    parser.add_argument("--partitions", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data")
        peer = peers.start_ours({"log.dirs": data})
        empty_mb = rss_mb(peer.pid)
        host, port = peer.bootstrap.rsplit(":", 1)

        c = RawClient(int(port))
        create(c, args.partitions)
        t0 = time.perf_counter()
        commit_all(c, args.groups, args.partitions)
        fill_s = time.perf_counter() - t0
        c.close()
        filled_mb = rss_mb(peer.pid)
        os.kill(peer.pid, signal.SIGKILL)
        peer.proc.wait(30)
        killed = restart(data, args.groups)
        killed.pop("peer").stop()
        clean = restart(data, args.groups)
        clean.pop("peer").stop()
    print(json.dumps({
        "groups": args.groups, "offsets": args.groups * args.partitions, "fill_s": round(fill_s, 1),
        "empty_broker_rss_mb": round(empty_mb, 1), "rss_after_fill_mb": round(filled_mb, 1),
        "clean_restart": clean, "after_kill_9": killed,
    }, indent=2))


if __name__ == "__main__":
    main()
