"""EmbeddedBroker: the real broker inside the test process, in a thread with its own event loop.

The broker listens on 127.0.0.1 (a free port unless `listeners` says otherwise) with its own
temporary data directory, so tests in one process never share state. The thread keeps the
broker serving while the test's code blocks (a synchronous client waiting for a message) or runs
its own event loop (aiokafka). Every method is called from the test's thread; each one runs its
work on the broker's loop and waits for it.

`restart()` keeps the data directory and the ports, so connected clients reconnect to the same
address: clean (as SIGTERM: logs flushed, clean-shutdown markers written) or, with
`clean=False`, as after `kill -9` (connections cut, nothing flushed; the next start recovers the
logs from what reached the OS).

`faults` (broker.testing.faults.Faults) makes the broker fail on purpose; what is armed stays
armed across restarts.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine, Mapping
from types import TracebackType
from typing import Any, Self

from broker.app import Broker
from broker.config import BrokerConfig, parse_listener
from broker.observability.log_setup import configure_embedded
from broker.observability.logger import stop_logging_to_standard_logging
from broker.testing.faults import Faults
from protocol.errors import ErrorCode, KafkaError

# Kafka's defaults except where a test wants otherwise: a free port on the loopback interface,
# and a new group's first rebalance at once (as Kafka's own test setups and docker examples do).
TEST_DEFAULTS = {
    "listeners": "PLAINTEXT://127.0.0.1:0",
    "group.initial.rebalance.delay.ms": "0",
}
START_TIMEOUT_S = 30.0


def property_text(value: Any) -> str:
    """A property value as a properties file would hold it (Java's spelling of booleans)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return ",".join(property_text(v) for v in value)
    return str(value)


def broker_properties(*sources: Mapping[str, Any] | None, keywords: Mapping[str, Any] | None = None) -> dict[str, str]:
    """Merge property mappings, later ones winning, then `keywords`, whose names may use `_` for
    `.` (`num_partitions=3`): Kafka's property names have no underscores outside listener names."""
    out: dict[str, str] = {}
    for source in sources:
        for key, value in (source or {}).items():
            out[key] = property_text(value)
    for key, value in (keywords or {}).items():
        out[key.replace("_", ".")] = property_text(value)
    return out


class _ErrorRecorder(logging.Handler):
    """Keeps what the broker's thread logs at ERROR or above (other brokers in the process log
    through the same loggers from their own threads)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.thread_id: int | None = None
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.thread == self.thread_id:
            self.lines.append(self.format(record))


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's when it is installed (as `python -m broker` runs), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class EmbeddedBroker:
    """A running broker for a test: `with EmbeddedBroker() as kafka: ... kafka.bootstrap_servers`.

    `properties` (and keyword arguments, `num_partitions=3` for `num.partitions`) are broker
    properties with Kafka's names; without `log.dirs`/`log.dir` a temporary directory is used and
    removed by `close()`.
    """

    loop_factory: Callable[[], asyncio.AbstractEventLoop] = staticmethod(new_event_loop)

    def __init__(self, properties: Mapping[str, Any] | None = None, /, **props: Any) -> None:
        self.properties = broker_properties(TEST_DEFAULTS, properties, keywords=props)
        self._temp_dir: str | None = None
        if "log.dirs" not in self.properties and "log.dir" not in self.properties:
            self._temp_dir = tempfile.mkdtemp(prefix="kafka-broker-")
            self.properties["log.dirs"] = self._temp_dir
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._broker: Broker | None = None
        self._errors = _ErrorRecorder()
        self.faults = Faults()  # armed faults outlive a restart
        self._node_ports: dict[int, dict[str, int]] = {}  # a simulated cluster's nodes: listener -> port

    # lifecycle -----------------------------------------------------------------------------------
    def start(self) -> Self:
        """Start the broker (returns once it accepts connections)."""
        if self._broker is not None:
            return self
        if self._loop is None:
            self._loop = self.loop_factory()
            self._thread = threading.Thread(target=self._run_loop, name="kafka-broker", daemon=True)
            self._thread.start()
            self._errors.thread_id = self._thread.ident
            logging.getLogger("broker").addHandler(self._errors)
        broker = self.call(self._new_broker(), START_TIMEOUT_S)
        if broker.simulated is not None:
            broker.simulated.ports.update(self._node_ports)  # the other nodes come back on their ports
        self.call(broker.start(), START_TIMEOUT_S)
        self._broker = broker
        self._pin_ports(broker)
        if broker.simulated is not None:
            self._node_ports = {node: dict(ports) for node, ports in broker.simulated.ports.items()}
        return self

    async def _new_broker(self) -> Broker:
        """Made on the broker's thread, where every line it logs goes to the logging module."""
        return Broker(BrokerConfig(self.properties), faults=self.faults)

    def _run_loop(self) -> None:
        loop = self._loop
        assert loop is not None
        configure_embedded(self.properties.get("log.level", "INFO"))
        asyncio.set_event_loop(loop)
        loop.set_exception_handler(self._unhandled)
        try:
            loop.run_forever()
            pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
            for task in pending:
                task.cancel()
            loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            loop.close()
            stop_logging_to_standard_logging()

    def _unhandled(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        """An exception nothing in the broker caught (a task's): recorded, then logged as asyncio does."""
        exc = context.get("exception")
        self._errors.lines.append("%s: %r" % (context.get("message", "unhandled exception"), exc))
        loop.default_exception_handler(context)

    def _pin_ports(self, broker: Broker) -> None:
        """Listeners on port 0 keep the port they were given, so a restart comes back on it."""
        listeners = [parse_listener(uri) for uri in self.properties["listeners"].split(",") if uri.strip()]
        bound = {name.upper(): port for name, port in broker.bound_ports.items()}
        if any(listener.port == 0 for listener in listeners):
            self.properties["listeners"] = ",".join(
                "%s://%s:%d" % (listener.name, listener.host, listener.port or bound[listener.name.upper()])
                for listener in listeners
            )

    def stop(self, clean: bool = True) -> None:
        """Stop the broker, keeping its thread, ports and data: `start()` brings it back."""
        broker, self._broker = self._broker, None
        if broker is not None:
            self.call(broker.stop(clean=clean), START_TIMEOUT_S)

    def restart(self, clean: bool = True) -> Self:
        """Stop and start again on the same ports and data: clean, or as after `kill -9`."""
        self.stop(clean)
        return self.start()

    def close(self) -> None:
        """Stop the broker and its thread; remove the temporary data directory. Idempotent."""
        try:
            self.stop()
        finally:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
            if loop is not None and thread is not None:
                loop.call_soon_threadsafe(loop.stop)
                thread.join(START_TIMEOUT_S)
                logging.getLogger("broker").removeHandler(self._errors)
            if self._temp_dir is not None:
                shutil.rmtree(self._temp_dir, ignore_errors=True)
                self._temp_dir = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await asyncio.to_thread(self.close)

    # what tests use ------------------------------------------------------------------------------
    @property
    def broker(self) -> Broker:
        """The running Broker (its state is the broker loop's: read it through `call`)."""
        if self._broker is None:
            raise RuntimeError("the broker is not running")
        return self._broker

    @property
    def port(self) -> int:
        return int(self.broker.ports[0])

    @property
    def bootstrap_servers(self) -> str:
        """host:port of the broker (of every node of a simulated cluster, comma-separated)."""
        return ",".join("%s:%d" % (host, port) for _, host, port in self.call(self._nodes()))

    async def _nodes(self) -> list[tuple[int, str, int]]:
        return self.broker.topology.live_brokers(None)

    @property
    def errors(self) -> list[str]:
        """What the broker logged at ERROR or above so far (tracebacks included), and exceptions
        no part of it caught: a test can assert that whatever its clients did, nothing failed."""
        return list(self._errors.lines)

    def call(self, coro: Coroutine[Any, Any, Any], timeout: float | None = 30.0) -> Any:
        """Run a coroutine on the broker's event loop and return its result."""
        if self._loop is None:
            coro.close()
            raise RuntimeError("the broker is not running")
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    def create_topic(self, name: str, partitions: int = 1, replication_factor: int = 1, **configs: Any) -> None:
        """Create a topic; `configs` are topic configs (`cleanup_policy="compact"` or
        `**{"cleanup.policy": "compact"}`); a replication factor above 1 needs a simulated
        cluster. Raises protocol.errors.KafkaError as Kafka answers."""
        broker = self.broker
        if replication_factor > broker.topology.broker_count():
            raise KafkaError(ErrorCode.INVALID_REPLICATION_FACTOR, "replication factor %d > %d broker(s)"
                             % (replication_factor, broker.topology.broker_count()))
        self.call(broker.create_topic(name, partitions, broker_properties(keywords=configs),
                                      replication_factor=replication_factor))

    def __repr__(self) -> str:
        state = self.bootstrap_servers if self._broker is not None else "stopped"
        return "EmbeddedBroker(%s)" % state
