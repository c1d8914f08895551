"""Importing the broker imports only what every broker runs; the rest comes when configured or
first used (issue 24). Not a timing test: it checks which modules a fresh interpreter holds, so
that an import added at the top of a module cannot silently bring a subsystem back
(bench/import_time.py measures what that costs)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# imported by none of `import broker.app`, nor by a started broker that does not use them
NOT_AT_START = [
    "broker.security.sasl.authenticator",  # the first connection on a SASL listener
    "broker.security.sasl.mechanisms",
    "broker.security.sasl.client",  # a node of a cluster with a SASL inter-broker listener
    "broker.security.interbroker",  # etcd.endpoints
    "broker.network.http",  # metrics.port
    "prometheus_client",  # the first scrape
    "broker.testing.simulated",  # simulated.brokers
    "broker.cluster.node",  # etcd.endpoints
    "broker.cluster.etcd_http",
    "broker.coordinator.txn.remote",
    "broker.share.persister",
    "broker.observability.telemetry.client",  # the first telemetry request
    "broker.observability.telemetry.otlp",
    "structlog",  # an embedded broker logs through the logging module
    "rich",
]
# imported by a started broker (its handlers, its coordinators), never by `import broker.app`
NOT_AT_IMPORT = [
    *NOT_AT_START,
    "broker.apis.produce",  # the handlers: loaded by Broker.start
    "broker.coordinator.txn",
    "broker.coordinator.share",
    "broker.share.manager",
    "broker.share.engine",
    "broker.share.dlq",
    "broker.security.authorizer",
    "broker.observability.telemetry",
    "broker.testing.faults",
    "crc32c",  # at the first checksum
]


def imported(code: str) -> dict[str, object]:
    """Run `code` in a fresh interpreter on this checkout; it leaves its findings in `out`."""
    script = "import json, sys\nout = {}\n%s\nout['modules'] = sorted(sys.modules)\nprint(json.dumps(out))\n" % code
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # this checkout, whichever is installed
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0, done.stderr
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_import_broker_app_leaves_subsystems_alone() -> None:
    found = imported("import broker.app\nfrom protocol import codecs\n"
                     "out['classes'] = [n for n, c in codecs.CODECS._made.items() if c._classes is not None]")
    modules = set(found["modules"])  # type: ignore[arg-type]
    assert "broker.app" in modules
    assert [m for m in NOT_AT_IMPORT if m in modules] == []
    # message classes are built when first named, not every definition at import
    assert len(found["classes"]) < 20, found["classes"]  # type: ignore[arg-type]


def test_started_broker_imports_what_it_uses() -> None:
    found = imported(
        "from broker.testing.embedded import EmbeddedBroker\n"
        "with EmbeddedBroker() as kafka:\n"
        "    out['started'] = sorted(sys.modules)\n"
        "    out['telemetry'] = type(kafka.broker.telemetry).__name__\n"
    )
    started = set(found["started"])  # type: ignore[arg-type]
    assert "broker.apis.produce" in started and "broker.coordinator.txn" in started
    assert [m for m in NOT_AT_START if m in started] == []
    assert found["telemetry"] == "ClientTelemetry"  # made at first use
