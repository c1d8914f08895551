"""Command line: `python -m broker [--config FILE] [--override key=value ...] [--fault SPEC ...]`."""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

from broker.cluster.errors import ClusterStartError
from broker.config import BrokerConfig, help_text
from broker.gc_policy import CollectorPolicy
from broker.observability.logger import get_logger
from broker.security.errors import SecurityConfigError
from broker.testing.faults import Faults, parse_fault_spec

log = get_logger("broker")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m broker",
        description="A Kafka-compatible broker. Kafka's property names and defaults apply; KAFKA_* environment "
                    "variables set properties as in apache/kafka's image (KAFKA_LOG_DIRS: log.dirs), between the "
                    "properties file and --override.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=help_text(),
    )
    parser.add_argument("config", nargs="?", help="a server.properties file")
    parser.add_argument("--config", dest="config_opt", help="a server.properties file")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="set a property (repeatable)"
    )
    parser.add_argument(
        "--fault", action="append", default=[], metavar="SPEC",
        help="arm a fault from the start (repeatable), as key=value pairs or a JSON object: "
             "api=Produce,error=NOT_LEADER_OR_FOLLOWER,times=2 | action=delay,api=Fetch,ms=500 | "
             "action=disconnect,api=Metadata | action=drop,api=JoinGroup | action=fail_disk,topic=t,partition=0",
    )
    return parser.parse_args(argv)


EXIT_SHUTDOWN_FAILED = 1
EXIT_FORCED = 3  # a second signal ended the process before the shutdown finished


async def serve(config: BrokerConfig, faults: Faults | None = None) -> int:
    """Run the broker until SIGTERM or SIGINT; the process's exit code.

    The first signal starts a clean shutdown; if it fails (a log dir removed under the broker, a
    disk error) the error is logged and the exit code is 1. A second signal ends the process at
    once, whatever the shutdown is doing: acknowledged writes are on disk already, the next start
    recovers the rest as after a crash.
    """
    from broker.app import Broker

    broker = Broker(config, faults=faults)
    await broker.start()  # with the collector paused (Broker.start)
    # What start-up built lives as long as the broker: frozen out of the collector's sight, a full
    # collection no longer walks it all (about 13 ms, a stall every request waits out, against well
    # under 1 ms); what survives later full collections is frozen too (broker/gc_policy.py).
    CollectorPolicy().install()
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []

    def on_signal(sig: signal.Signals) -> None:
        if stopping:
            log.warning("second signal: exiting before the shutdown finished", signal=sig.name)
            sys.stderr.flush()
            os._exit(EXIT_FORCED)
        log.info("shutting down", signal=sig.name)
        stopping.append(loop.create_task(broker.stop()))

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)
    await broker.wait_stopped()
    if not stopping:
        return 0
    try:
        await stopping[0]
    except Exception as exc:
        log.error("shutdown failed", error=repr(exc))
        return EXIT_SHUTDOWN_FAILED
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = BrokerConfig.load(args.config_opt or args.config, args.override, os.environ)
        faults = Faults()
        for spec in args.fault:
            faults.arm(parse_fault_spec(spec))
    except (OSError, ValueError) as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    from broker.observability.log_setup import configure

    configure(config["log.format"], config["log.level"])
    try:
        import uvloop
    except ImportError:
        run = asyncio.run
    else:
        run = uvloop.run
    try:
        return run(serve(config, faults))
    except (SecurityConfigError, ClusterStartError) as exc:  # a setting the broker cannot serve, or
        print("error: %s" % exc, file=sys.stderr)  # a cluster it cannot join (etcd unreachable, ...)
        return 2
