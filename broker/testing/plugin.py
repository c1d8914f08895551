"""The pytest plugin (entry point `pytest11`): Kafka brokers as fixtures.

    def test_orders(kafka_broker):                  # a fresh broker for this test
        producer = Producer({"bootstrap.servers": kafka_broker.bootstrap_servers})

    @pytest.mark.kafka_broker({"num.partitions": 3}, auto_create_topics_enable=False)
    def test_strict(kafka_broker): ...

    def test_fast(kafka_broker_session): ...        # one broker shared by the whole session

Broker properties come from the ini option `kafka_broker_properties` (one `key=value` a line),
then from `kafka_broker` markers (module, class, then the test itself: the closest wins; the
session broker takes the ini option only). Faults armed on the session broker are disarmed
after each test. Nothing of the broker is imported until a fixture is used.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from broker.testing.embedded import EmbeddedBroker

INI = "kafka_broker_properties"
MARKER = "kafka_broker"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(INI, "broker properties (key=value, one a line) of the kafka_broker fixtures", type="linelist",
                  default=[])


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "%s(properties=None, **props): broker properties of the kafka_broker fixture" % MARKER
    )


def ini_properties(config: pytest.Config) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in config.getini(INI):
        key, sep, value = str(line).partition("=")
        if not sep:
            raise pytest.UsageError("%s: expected key=value, got %r" % (INI, line))
        out[key.strip()] = value.strip()
    return out


def marker_properties(node: pytest.Item) -> dict[str, str]:
    from broker.testing.embedded import broker_properties

    out: dict[str, str] = {}
    for marker in reversed(list(node.iter_markers(MARKER))):  # farthest first: the closest wins
        out.update(broker_properties(*marker.args, keywords=marker.kwargs))
    return out


@pytest.fixture
def kafka_broker(request: pytest.FixtureRequest) -> Iterator[EmbeddedBroker]:
    """A broker of its own for the test, stopped and removed afterwards."""
    from broker.testing.embedded import EmbeddedBroker

    properties: dict[str, Any] = ini_properties(request.config)
    properties.update(marker_properties(request.node))
    with EmbeddedBroker(properties) as broker:
        yield broker


_session_brokers: list[EmbeddedBroker] = []


@pytest.fixture(scope="session")
def kafka_broker_session(request: pytest.FixtureRequest) -> Iterator[EmbeddedBroker]:
    """One broker for the whole test session (tests share its topics and groups)."""
    from broker.testing.embedded import EmbeddedBroker

    with EmbeddedBroker(ini_properties(request.config)) as broker:
        _session_brokers.append(broker)
        try:
            yield broker
        finally:
            _session_brokers.remove(broker)


def pytest_runtest_teardown(item: pytest.Item) -> None:
    for broker in _session_brokers:  # a test's faults must not hit the next test
        if broker.faults.armed:
            broker.faults.clear()
