"""A long fault run (issue 23, item 6): tests/chaos/runner.py's workload, nemesis and checker on a
three-node cluster on etcd, for as long as asked, reproducible from its seed.

    python bench/chaos.py --seed N [--duration 120] [--faults kill,pause,etcd_kill,etcd_pause]
                          [--replication-factor 1] [--min-insync-replicas 1] [--partitions 3]
                          [--producers 2] [--members 2] [--rate 30] [--etcd-members 1] [--keep DIR]
                          [--json PATH]

Prints the fault schedule the seed draws, what the run did (records acknowledged, read, committed,
delivered to share members, transactions committed and aborted, faults done), how long each
phase took, and every violation the checker found; exits 1 on a violation or a stuck worker. The
history (one JSON line per event) stays in `--keep DIR` (default: a temporary directory, removed
when the run passes) for post-mortem: `python -c "from tests.chaos.history import load; ..."`.

Faults: kill (kill -9 and restart of a broker node), kill_leader (of the node leading a partition
of the workload: the same as kill until partitions have replicas), pause (SIGSTOP/SIGCONT),
etcd_kill, etcd_pause (of one member, drawn from the seed, with `--etcd-members 3`); network partitions (the brokers and etcd then run each in a network
namespace of tests/chaos/network.py; root, ip and iptables): isolate (a node cut off from the other
brokers and etcd, its clients still reaching it), isolate_leader (the same, of a partition's
leader), cut (a node's link down); reassign (a partition's replicas moved away from its leader
by AlterPartitionReassignments, and back). With replication factor 1 every fault but the loss of a disk
is survivable without losing an acknowledged record; `--replication-factor 3
--min-insync-replicas 2 --faults kill_leader,pause,isolate,isolate_leader,cut` is the run
replication (issue 23) must pass.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.chaos.nemesis import Fault  # noqa: E402
from tests.chaos.runner import SAFE_WITH_ONE_REPLICA, RunConfig, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, required=True)
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of workload under faults")
    parser.add_argument("--faults", default=",".join(SAFE_WITH_ONE_REPLICA),
                        help="comma-separated, of: " + ", ".join(Fault))
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--min-insync-replicas", type=int, default=1)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--producers", type=int, default=2)
    parser.add_argument("--members", type=int, default=2)
    parser.add_argument("--rate", type=float, default=30.0, help="records/s of each idempotent producer")
    parser.add_argument("--etcd-members", type=int, default=1,
                        help="an etcd cluster of this many members (not with network faults)")
    parser.add_argument("--client-debug", action="store_true",
                        help="each client's librdkafka debug log into <keep>/clients/<client>.log")
    parser.add_argument("--keep", type=Path, help="directory for the cluster's data and the history (kept)")
    parser.add_argument("--json", type=Path, help="write the result here")
    args = parser.parse_args(argv)

    faults = tuple(Fault(f.strip()) for f in args.faults.split(",") if f.strip())
    config = RunConfig(seed=args.seed, duration=args.duration, faults=faults, nodes=args.nodes,
                       replication_factor=args.replication_factor, min_insync_replicas=args.min_insync_replicas,
                       partitions=args.partitions, producers=args.producers, members=args.members, rate=args.rate,
                       client_debug=args.client_debug, etcd_members=args.etcd_members)
    base = args.keep or Path(tempfile.mkdtemp(prefix="chaos-%d-" % args.seed))
    result = run(config, base)
    print(result.report())
    failed = bool(result.violations or result.stuck or result.unhealthy)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "config": json.loads(json.dumps(asdict(config), default=str)), "counts": result.counts,
            "faults_done": result.faults_done, "seconds": result.seconds, "stuck": result.stuck, "unhealthy": result.unhealthy,
            "unanswered": ["%s %s-%d: %d" % (*k, n) for k, (n, _) in result.unanswered.items()],
            "worker_errors": result.worker_errors, "violations": [str(v) for v in result.violations],
            "history": str(result.history_path)}, indent=2))
    if args.keep is None and not failed:
        shutil.rmtree(base, ignore_errors=True)
    print("PASS" if not failed else "FAIL: %d violations, %d stuck workers, cluster %s (history kept: %s)" % (
        len(result.violations), len(result.stuck), "not recovered" if result.unhealthy else "recovered",
        result.history_path))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
