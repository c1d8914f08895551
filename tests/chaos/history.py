"""The history of a chaos run: an append-only list of typed events, each stamped with
`time.monotonic()` by the process that saw it (on Linux one clock for every process of the
machine, network namespaces included, so the workers' events, the nemesis' and the runner's
compare), written as JSON lines to one file per run for post-mortem.

An event is {"t": seconds, "kind": Kind, "client": who, ...fields}. The fields of each kind:

| kind | written by | fields |
|---|---|---|
| send | a producer, for every record handed to its client | topic, partition, value, txn (transactional only) |
| ack | a producer, for a delivery report without error | topic, partition, offset, value, txn |
| send_fail | a producer, for a delivery report with an error (outcome unknown) | topic, partition, value, error, txn |
| txn_begin / txn_commit / txn_abort | a transactional producer: a transaction begun, committed (commit_transaction returned), aborted (abort_transaction returned) | txn, t0 (call began) |
| txn_unknown | commit or abort failed: the transaction may have committed or not | txn, error, stage |
| assign / revoke | a consumer group member, from its rebalance callbacks (revoke also for lost partitions) | group, topic, partitions |
| read | a group member or a reader, per record | group (None for a reader), topic, partition, offset, value, isolation |
| commit | a group member, after its synchronous commit returned | group, topic, offsets {partition: offset}, failed {partition: error}, t0, ok (True, False or None: unknown) |
| share_deliver | a share consumer, per record a poll returned | group, topic, partition, offset, value, delivery_count, t0 (poll began) |
| share_ack | a share consumer, per partition of a commit_sync | group, topic, partition, offsets, ack_type, t0 (commit_sync began), ok (True, False, None: unknown), error |
| final_read | the final reader, per record | topic, partition, offset, value, isolation |
| final_end | the final reader, per partition | topic, partition, isolation, position, high_watermark, complete |
| replica_log | the runner, per replica found in a node's log dirs after the run | node, topic, partition, start, end, batches [[base, last, digest]] |
| nemesis | the nemesis: a fault begun or healed | op (start, heal, error), fault, target, detail |
| worker | a worker process: started, stopped, failed | op, role, detail |
| run | the runner: seed, schedule, workload mix, phases | op, detail |

Values are unique in a run (`<client>-<number>`), so a value names one record.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any


class Kind(StrEnum):
    SEND = "send"
    ACK = "ack"
    SEND_FAIL = "send_fail"
    TXN_BEGIN = "txn_begin"
    TXN_COMMIT = "txn_commit"
    TXN_ABORT = "txn_abort"
    TXN_UNKNOWN = "txn_unknown"
    ASSIGN = "assign"
    REVOKE = "revoke"
    READ = "read"
    COMMIT = "commit"
    SHARE_DELIVER = "share_deliver"
    SHARE_ACK = "share_ack"
    FINAL_READ = "final_read"
    FINAL_END = "final_end"
    REPLICA_LOG = "replica_log"
    NEMESIS = "nemesis"
    WORKER = "worker"
    RUN = "run"


@dataclass(frozen=True)
class Event:
    t: float
    kind: Kind
    client: str
    data: Mapping[str, Any] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.data[name]

    def get(self, name: str, default: Any = None) -> Any:
        return self.data.get(name, default)

    def to_json(self) -> str:
        return json.dumps({"t": round(self.t, 6), "kind": str(self.kind), "client": self.client, **self.data},
                          separators=(",", ":"))

    @staticmethod
    def from_json(line: str) -> Event:
        raw = json.loads(line)
        t, kind, client = raw.pop("t"), Kind(raw.pop("kind")), raw.pop("client")
        return Event(float(t), kind, str(client), raw)

    def __str__(self) -> str:
        return self.to_json()


def event(kind: Kind, client: str, t: float | None = None, **data: Any) -> Event:
    return Event(time.monotonic() if t is None else t, kind, client, data)


class History:
    """Thread-safe, append-only; every event also goes to `path` (one JSON line each, flushed),
    in the order it arrived. `events()` returns them in time order."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._events: list[Event] = []
        self._file: IO[str] | None = open(path, "a", encoding="utf-8") if path is not None else None

    def append(self, ev: Event) -> None:
        with self._lock:
            self._events.append(ev)
            if self._file is not None:
                self._file.write(ev.to_json() + "\n")
                self._file.flush()

    def add(self, kind: Kind, client: str, **data: Any) -> Event:
        ev = event(kind, client, **data)
        self.append(ev)
        return ev

    def extend(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.append(ev)

    def events(self) -> list[Event]:
        with self._lock:
            return sorted(self._events, key=lambda e: e.t)

    def __len__(self) -> int:
        return len(self._events)

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None


def load(path: Path) -> list[Event]:
    """A history file read back (lines cut short by a crash are skipped), in time order."""
    found = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                found.append(Event.from_json(line))
            except (ValueError, KeyError):
                continue
    return sorted(found, key=lambda e: e.t)


def of_kind(events: Iterable[Event], *kinds: Kind) -> Iterator[Event]:
    wanted = set(kinds)
    return (e for e in events if e.kind in wanted)
