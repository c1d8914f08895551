"""Command line: `python -m broker [--config FILE] [--override key=value ...]`."""

from __future__ import annotations

import argparse
import asyncio
import gc
import signal
import sys

from broker.config import BrokerConfig, help_text
from broker.security.errors import SecurityConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m broker",
        description="A Kafka-compatible broker. Kafka's property names and defaults apply.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=help_text(),
    )
    parser.add_argument("config", nargs="?", help="a server.properties file")
    parser.add_argument("--config", dest="config_opt", help="a server.properties file")
    parser.add_argument(
        "--override", action="append", default=[], metavar="KEY=VALUE", help="set a property (repeatable)"
    )
    return parser.parse_args(argv)


async def serve(config: BrokerConfig) -> None:
    from broker.app import Broker

    broker = Broker(config)
    await broker.start()
    # What start-up built (modules, codecs, metadata, loaded groups) lives as long as the broker:
    # out of the collector's sight, a full collection no longer walks it all (about 13 ms, a
    # stall every request waits out, against well under 1 ms).
    gc.collect()
    gc.freeze()
    loop = asyncio.get_running_loop()
    stopping: list[asyncio.Task[None]] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, lambda: stopping.append(loop.create_task(broker.stop())) if not stopping else None)
    await broker.wait_stopped()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        config = BrokerConfig.load(args.config_opt or args.config, args.override)
    except (OSError, ValueError) as exc:
        print("error: %s" % exc, file=sys.stderr)
        return 2
    from broker.logsetup import configure

    configure(config["log.format"], config["log.level"])
    try:
        import uvloop
    except ImportError:
        run = asyncio.run
    else:
        run = uvloop.run
    try:
        run(serve(config))
    except SecurityConfigError as exc:  # a listener, TLS or SASL setting the broker cannot serve
        print("error: %s" % exc, file=sys.stderr)
        return 2
    return 0
