"""Many partitions through a crash: create them, write one record to each, `kill -9`, restart.

    python bench/scale_partitions.py [--partitions 10000,20000] [--per-topic 100] [--nofile 20000]

For each count: a fresh broker (`python -m broker`, data on disk in a temp dir) gets topics of
`--per-topic` partitions and one record in every partition (raw CreateTopics and Produce frames),
is killed with SIGKILL and started again under RLIMIT_NOFILE = `--nofile`. Reported per count:
the restart time (until the port answers, and the broker's own recovery time from its log), the
descriptors and memory after start-up, and whether every record is still there (ListOffsets of
every partition). A clean restart (SIGTERM, start) follows. Everything is bounded in time and the
temp dirs are removed. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import signal
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
from tests.harness import BrokerProcess, RawClient, port_open, wait_for  # noqa: E402

CREATE_TOPICS, PRODUCE, LIST_OFFSETS = 19, 0, 2


class LimitedBroker(BrokerProcess):
    """BrokerProcess started under a descriptor limit (RLIMIT_NOFILE)."""

    def __init__(self, data_dir: Path, nofile: int, overrides: dict[str, str] | None = None) -> None:
        super().__init__(data_dir, overrides=overrides)
        self.nofile = nofile

    def start(self, timeout: float = 300.0) -> LimitedBroker:
        args = [sys.executable, "-m", "broker"]
        for k, v in self.overrides.items():
            args += ["--override", "%s=%s" % (k, v)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        self._log = open(self.log_path, "ab")
        nofile = self.nofile

        def limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (nofile, nofile))

        self.proc = subprocess.Popen(args, cwd=str(ROOT), env=env, stdout=self._log, stderr=subprocess.STDOUT,
                                     preexec_fn=limit)
        wait_for(lambda: port_open(self.port) or self.proc.poll() is not None, timeout, interval=0.01,
                 what="broker to listen")
        if self.proc.poll() is not None:
            raise RuntimeError("broker exited early:\n" + self.log_path.read_text()[-4000:])
        return self


def process_facts(pid: int) -> dict[str, Any]:
    fds = len(os.listdir("/proc/%d/fd" % pid))
    rss = 0
    for line in Path("/proc/%d/status" % pid).read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    return {"fds": fds, "rss_mb": round(rss / 2**20, 1)}


def create_topics(port: int, topics: list[str], per_topic: int) -> None:
    R = M.CreateTopicsRequest
    client = RawClient(port, "scale-setup")
    client.sock.settimeout(300)
    try:
        for i in range(0, len(topics), 10):
            chunk = [R.CreatableTopic(name=t, num_partitions=per_topic, replication_factor=1, assignments=[],
                                      configs=[]) for t in topics[i:i + 10]]
            response = client.call(CREATE_TOPICS, 5, R(topics=chunk, timeout_ms=300000, validate_only=False))
            bad = [(t.name, t.error_code) for t in response.topics if t.error_code]
            assert not bad, bad
    finally:
        client.close()


def produce_one_each(port: int, topics: list[str], per_topic: int) -> None:
    P = M.ProduceRequest
    batch = build_batch([(b"k", b"v" * 100)])
    client = RawClient(port, "scale-setup")
    client.sock.settimeout(300)
    try:
        for i in range(0, len(topics), 20):
            data = [P.TopicProduceData(name=t, partition_data=[P.PartitionProduceData(index=p, records=batch)
                                                                for p in range(per_topic)])
                    for t in topics[i:i + 20]]
            response = client.call(PRODUCE, 9, P(transactional_id=None, acks=-1, timeout_ms=60000, topic_data=data))
            bad = [(t.name, p.index, p.error_code) for t in response.responses for p in t.partition_responses
                   if p.error_code]
            assert not bad, bad[:5]
    finally:
        client.close()


def count_records(port: int, topics: list[str], per_topic: int) -> int:
    """Sum of the log end offsets of every partition (one record each: the partition count)."""
    L = M.ListOffsetsRequest
    client = RawClient(port, "scale-check")
    client.sock.settimeout(300)
    total = 0
    try:
        for i in range(0, len(topics), 50):
            req = L(replica_id=-1, isolation_level=0, topics=[
                L.ListOffsetsTopic(name=t, partitions=[L.ListOffsetsPartition(partition_index=p, timestamp=-1)
                                                       for p in range(per_topic)]) for t in topics[i:i + 50]])
            response = client.call(LIST_OFFSETS, 7, req)
            for t in response.topics:
                for p in t.partitions:
                    assert p.error_code == 0, (t.name, p.partition_index, p.error_code)
                    total += p.offset
    finally:
        client.close()
    return total


def broker_recovery_seconds(output: str) -> float | None:
    found = re.findall(r"recovery_seconds=([0-9.]+)", output)
    return float(found[-1]) if found else None


def restart(kafka: LimitedBroker, how: str) -> dict[str, Any]:
    if how == "kill -9":
        kafka.kill()
    else:
        kafka.stop(timeout=300)
    t0 = time.perf_counter()
    kafka.start()
    listening = time.perf_counter() - t0
    assert kafka.proc is not None
    out: dict[str, Any] = {"restart": how, "listening_s": round(listening, 2),
                           "broker_recovery_s": broker_recovery_seconds(kafka.output())}
    out.update(process_facts(kafka.proc.pid))
    return out


def run(partitions: int, per_topic: int, nofile: int, workdir: Path) -> dict[str, Any]:
    topics = ["scale-%05d" % i for i in range(partitions // per_topic)]
    data = workdir / ("data-%d" % partitions)
    kafka = LimitedBroker(data, nofile)
    result: dict[str, Any] = {"partitions": partitions, "nofile": nofile}
    kafka.start()
    try:
        assert kafka.proc is not None
        result["empty"] = process_facts(kafka.proc.pid)
        t0 = time.perf_counter()
        create_topics(kafka.port, topics, per_topic)
        result["create_s"] = round(time.perf_counter() - t0, 2)
        t0 = time.perf_counter()
        produce_one_each(kafka.port, topics, per_topic)
        result["produce_s"] = round(time.perf_counter() - t0, 2)
        result["before_crash"] = process_facts(kafka.proc.pid)
        try:
            result["after_kill"] = restart(kafka, "kill -9")
        except (RuntimeError, TimeoutError) as exc:
            result["after_kill"] = {"failed": str(exc)[-600:]}
            return result
        result["after_kill"]["records"] = count_records(kafka.port, topics, per_topic)
        result["after_kill"]["after_check"] = process_facts(kafka.proc.pid)
        result["after_clean"] = restart(kafka, "clean")
        result["after_clean"]["records"] = count_records(kafka.port, topics, per_topic)
    finally:
        if kafka.proc is not None and kafka.proc.poll() is None:
            kafka.proc.send_signal(signal.SIGKILL)
            kafka.proc.wait(30)
    return result


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--partitions", default="10000", help="comma-separated partition counts")
    ap.add_argument("--per-topic", type=int, default=100)
    ap.add_argument("--nofile", type=int, default=20000, help="RLIMIT_NOFILE of the restarted broker")
    ap.add_argument("--keep", help="work in this directory and keep the data (for profiling)")
    args = ap.parse_args()
    results = []
    with tempfile.TemporaryDirectory(prefix="scale-partitions-") as tmp:
        workdir = Path(args.keep) if args.keep else Path(tmp)
        for n in (int(x) for x in args.partitions.split(",")):
            results.append(run(n, args.per_topic, args.nofile, workdir))
            print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    print(json.dumps({"cpus": os.cpu_count(), "results": results}, indent=1))


if __name__ == "__main__":
    main()
