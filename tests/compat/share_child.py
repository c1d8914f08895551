"""A confluent-kafka ShareConsumer in a child process, so that a test can `kill -9` it.

Run as `python -m tests.compat.share_child '<json spec>'`; spec: bootstrap, group, topic, mode
(implicit/explicit), ack (accept/release/reject/none: what an explicit consumer does with each
record), max (stop after this many records). Every record received is a JSON line on stdout:
{"p": partition, "o": offset, "d": delivery count, "v": value}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from typing import Any

from tests.harness import ROOT

# a share group's heartbeats, sessions and record locks in seconds, not Kafka's tens of seconds
FAST_SHARE_GROUPS = {
    "group.share.heartbeat.interval.ms": "500",
    "group.share.min.heartbeat.interval.ms": "500",
    "group.share.session.timeout.ms": "4000",
    "group.share.min.session.timeout.ms": "1000",
    "group.share.min.record.lock.duration.ms": "1000",
}


def main(spec: dict[str, Any]) -> None:
    from confluent_kafka import AcknowledgeType, ShareConsumer

    conf = {"bootstrap.servers": spec["bootstrap"], "group.id": spec["group"]}
    if spec.get("mode") == "explicit":
        conf["share.acknowledgement.mode"] = "explicit"
    consumer = ShareConsumer(conf)
    consumer.subscribe([spec["topic"]])
    ack = {"accept": AcknowledgeType.ACCEPT, "release": AcknowledgeType.RELEASE,
           "reject": AcknowledgeType.REJECT}.get(spec.get("ack", "none"))
    seen = 0
    deadline = time.monotonic() + spec.get("seconds", 60)
    while time.monotonic() < deadline and seen < spec.get("max", 1 << 30):
        messages = consumer.poll(0.5)
        for m in messages:
            if m.error():
                continue
            print(json.dumps({"p": m.partition(), "o": m.offset(), "d": m.delivery_count(),
                              "v": (m.value() or b"").decode()}), flush=True)
            seen += 1
            if ack is not None:
                consumer.acknowledge(m, ack)
        if messages and ack is not None:
            consumer.commit_sync(10)
    if spec.get("hang"):  # keep the records (and the connection) until killed
        time.sleep(3600)
    consumer.close()


class ShareChild:
    """The child process and the records it reported (read by a thread)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.compat.share_child", json.dumps(spec)],
                                     cwd=str(ROOT), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.records: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.records.append(json.loads(line))

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
