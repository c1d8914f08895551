"""Security benchmarks (issue 13): what TLS and the authorizer cost, side by side in one run.

    python bench/security.py tls   [--repeat 3] [--duration 6]
    python bench/security.py authz [--seconds 4] [--acls 1000] [--rounds 3]

`tls`: one broker with a PLAINTEXT and an SSL listener (certificates made for the run);
../shared/tools/kbench.py produces and consumes 10 KB records (acks=1, one partition) over each
in turn, alternating, `--repeat` times; prints MB/s and MB per broker CPU-second for both and
the TLS/plaintext ratio (goal: at least 0.5).

`authz`: CPU per request (raw frames, one request at a time, from /proc as request_cost.py) of
Metadata for one topic, Produce (one small batch, acks=1) and OffsetCommit on a broker without an
authorizer and on one with StandardAuthorizer semantics and `--acls` ACLs (the allowing ones
among them), alternating brokers `--rounds` times; prints both and the difference (goal: at
most +5 %).

Run under `flock /work/notes/bench.lock` when other benchmarks may run. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from protocol import messages as M  # noqa: E402
from protocol.records import build_batch  # noqa: E402
from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess, RawClient, free_port, port_open, wait_for  # noqa: E402

KBENCH = Path(os.environ.get("BENCH_SHARED_TOOLS", ROOT.parent.parent / "shared" / "tools")) / "kbench.py"
TOPIC = "security-bench"


def cpu_seconds(pid: int) -> float:
    fields = Path("/proc/%d/stat" % pid).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ----- TLS against plaintext -------------------------------------------------------------------
def kbench(bootstrap: str, pid: int, duration: float, conf: dict[str, str]) -> dict[str, Any]:
    args = [sys.executable, str(KBENCH), "--bootstrap", bootstrap, "--broker-pid", str(pid), "--tests",
            "produce,consume", "--sizes", "10240", "--acks", "1", "--no-idempotent", "--repeat", "1",
            "--duration", str(duration), "--hard-timeout", "300"]
    for k, v in conf.items():
        args += ["--client-conf", "%s=%s" % (k, v)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=400)
    summary = json.loads(done.stdout)["summary"]
    out = {}
    for name, values in summary.items():
        kind = "produce" if name.startswith("produce") else "consume"
        out[kind] = {"MB_per_s": values["MB_per_s"]["median"],
                     "MB_per_broker_cpu_s": values["MB_per_broker_cpu_s"]["median"]}
    return out


def bench_tls(repeat: int, duration: float) -> dict[str, Any]:
    from tests.security.certs import TestCA

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        ca = TestCA(base / "certs")
        server = ca.issue("server", server=True, CN="localhost")
        ssl_port = free_port()
        kafka = BrokerProcess(base / "data")
        kafka.overrides.update({
            "listeners": "PLAINTEXT://127.0.0.1:%d,SSL://127.0.0.1:%d" % (kafka.port, ssl_port),
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(server.combined),
        })
        kafka.start()
        wait_for(lambda: port_open(ssl_port), 10, what="the SSL listener")
        assert kafka.proc is not None
        runs: dict[str, list[dict[str, Any]]] = {"plaintext": [], "tls": []}
        try:
            for _ in range(repeat):
                runs["plaintext"].append(kbench(kafka.bootstrap, kafka.proc.pid, duration, {}))
                runs["tls"].append(kbench("127.0.0.1:%d" % ssl_port, kafka.proc.pid, duration,
                                          {"security.protocol": "SSL", "ssl.ca.location": str(ca.path)}))
        finally:
            kafka.stop()
    result: dict[str, Any] = {"runs": runs}
    for kind in ("produce", "consume"):
        for metric in ("MB_per_s", "MB_per_broker_cpu_s"):
            plain = statistics.median(r[kind][metric] for r in runs["plaintext"])
            tls = statistics.median(r[kind][metric] for r in runs["tls"])
            result["%s_%s" % (kind, metric)] = {"plaintext": plain, "tls": tls, "tls/plaintext": round(tls / plain, 3)}
    return result


# ----- authorization CPU per request ---------------------------------------------------------
def _requests() -> dict[str, tuple[int, int, Any]]:
    P, OC = M.ProduceRequest, M.OffsetCommitRequest
    batch = build_batch([(None, b"x" * 100)], base_timestamp=None)
    return {
        "metadata": (3, 12, M.MetadataRequest(topics=[M.MetadataRequest.MetadataRequestTopic(name=TOPIC)],
                                              allow_auto_topic_creation=False)),
        "produce": (0, 9, P(transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
            P.TopicProduceData(name=TOPIC, partition_data=[P.PartitionProduceData(index=0, records=batch)])])),
        "offset_commit": (8, 9, OC(group_id="bench-group", generation_id_or_member_epoch=-1, member_id="", topics=[
            OC.OffsetCommitRequestTopic(name=TOPIC, partitions=[
                OC.OffsetCommitRequestPartition(partition_index=0, committed_offset=1, committed_metadata="")])])),
    }


def _acls(count: int) -> list[Any]:
    """`count` ACLs: the few the benchmark's principal needs, the rest for other principals and
    resources (literal and prefixed, topics and groups), as a busy cluster holds them."""
    C = M.CreateAclsRequest.AclCreation
    allow = [C(resource_type=2, resource_name=TOPIC, resource_pattern_type=3, principal="User:ANONYMOUS", host="*",
               operation=2, permission_type=3),
             C(resource_type=3, resource_name="bench-", resource_pattern_type=4, principal="User:ANONYMOUS", host="*",
               operation=3, permission_type=3)]
    others = [C(resource_type=2 if i % 3 else 3, resource_name="%s-%05d" % ("app" if i % 2 else "team", i),
                resource_pattern_type=3 if i % 4 else 4, principal="User:user%d" % i, host="*",
                operation=(3, 4, 8)[i % 3], permission_type=3 if i % 10 else 2)
              for i in range(count - len(allow))]
    return allow + others


def _start(base: Path, secured: bool, acls: int) -> BrokerProcess:
    kafka = BrokerProcess(base / ("secured" if secured else "open"))
    if secured:
        # the setup client is a super user for as long as the ACLs are written
        kafka.overrides.update({"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                                "super.users": "User:ANONYMOUS"})
    kafka.start()
    create_topic(kafka, TOPIC)
    setup = RawClient(kafka.port, "bench-setup")
    setup.call(10, 3, M.FindCoordinatorRequest(key="bench-group", key_type=0))
    if secured:
        creations = _acls(acls)
        for i in range(0, len(creations), 500):
            response = setup.call(30, 3, M.CreateAclsRequest(creations=creations[i:i + 500]))
            assert all(r.error_code == 0 for r in response.results)
    setup.close()
    # both restart (the same start-up state); the secured one without its super user, so that
    # every request is decided by the ACLs
    kafka.stop()
    kafka.overrides.pop("super.users", None)
    kafka.start()
    return kafka


def _cost(kafka: BrokerProcess, key: int, version: int, request: Any, seconds: float) -> float:
    assert kafka.proc is not None
    client = RawClient(kafka.port, "request-cost")
    try:
        for _ in range(500):
            response = client.call(key, version, request)
        cpu0, t0, n = cpu_seconds(kafka.proc.pid), time.perf_counter(), 0
        while time.perf_counter() - t0 < seconds:
            client.call(key, version, request)
            n += 1
        cpu = cpu_seconds(kafka.proc.pid) - cpu0
    finally:
        client.close()
    _check_allowed(response)
    return cpu / n * 1e6


def _check_allowed(response: Any) -> None:
    text = repr(response)
    assert "AUTHORIZATION" not in text and "error_code=29" not in text and "error_code=30" not in text, text[:300]


def bench_authz(seconds: float, acls: int, rounds: int) -> dict[str, Any]:
    requests = _requests()
    costs: dict[str, dict[str, list[float]]] = {name: {"open": [], "secured": []} for name in requests}
    with tempfile.TemporaryDirectory() as tmp:
        brokers = {"open": _start(Path(tmp), False, acls), "secured": _start(Path(tmp), True, acls)}
        try:
            for i in range(rounds):
                for name, (key, version, request) in requests.items():
                    for label in ("open", "secured") if i % 2 == 0 else ("secured", "open"):  # each goes first
                        costs[name][label].append(_cost(brokers[label], key, version, request, seconds))
        finally:
            for kafka in brokers.values():
                kafka.stop()
    out: dict[str, Any] = {"acls": acls}
    for name, by in costs.items():
        # the minimum is the figure least disturbed by other work on a shared machine
        entry: dict[str, Any] = {}
        for stat in (min, statistics.median):
            open_us, secured_us = stat(by["open"]), stat(by["secured"])
            entry[stat.__name__] = {"open_cpu_us": round(open_us, 1), "authorizer_cpu_us": round(secured_us, 1),
                                    "difference_pct": round((secured_us / open_us - 1) * 100, 1)}
        entry["runs"] = {k: [round(v, 1) for v in vs] for k, vs in by.items()}
        out[name] = entry
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("what", choices=["tls", "authz"])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--duration", type=float, default=6.0)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--acls", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    if args.what == "tls":
        result = bench_tls(args.repeat, args.duration)
    else:
        result = bench_authz(args.seconds, args.acls, args.rounds)
    print(json.dumps({"cpus": os.cpu_count(), args.what: result}, indent=1))


if __name__ == "__main__":
    main()
