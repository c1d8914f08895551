"""Shared fixtures for tests with real clients: one broker per test module.

`kafka` is a running broker (broker.testing.EmbeddedBroker, in this process, on an ephemeral
port of 127.0.0.1 with a fresh data dir); tests that stop or kill a broker process use
tests.harness.BrokerProcess themselves. A module changes its settings with a module-level
`BROKER_OVERRIDES = {"property": "value"}`. `create_topic` makes topics with raw CreateTopics
frames, so tests of one client do not depend on another client's admin support; `topic_name`
gives each test its own topic name; the clients a test puts in `closing` are closed after it;
`consume_until` reads a confluent-kafka Consumer until enough messages came.
When the module is done the broker must have logged no error, whatever the clients sent (but
those holding a text of `EXPECTED_BROKER_ERRORS`).
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.testing import EmbeddedBroker
from protocol import messages as M
from tests.harness import BrokerProcess, RawClient

CREATE_TOPICS = 19


class CompatBroker(EmbeddedBroker):
    @property
    def bootstrap(self) -> str:  # BrokerProcess's name for it
        return self.bootstrap_servers


def create_topic(kafka: BrokerProcess | EmbeddedBroker, name: str, partitions: int = 1, configs: dict[str, str] | None = None) -> None:
    """Create a topic through CreateTopics (v5); fails the test on any error."""
    R = M.CreateTopicsRequest
    topic = R.CreatableTopic(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[],
        configs=[R.CreatableTopicConfig(name=k, value=v) for k, v in (configs or {}).items()],
    )
    c = RawClient(kafka.port, "compat-setup")
    try:
        response = c.call(CREATE_TOPICS, 5, R(topics=[topic], timeout_ms=10000, validate_only=False))
    finally:
        c.close()
    result = response.topics[0]
    assert result.error_code == 0, (result.error_code, result.error_message)


def consume_until(consumer: Any, expected: int, timeout: float = 30, num_messages: int = 1000) -> list[Any]:
    """A confluent-kafka Consumer's messages until `expected` arrived or `timeout` passed; an
    error message fails the test."""
    out: list[Any] = []
    deadline = time.monotonic() + timeout
    while len(out) < expected and time.monotonic() < deadline:
        for msg in consumer.consume(num_messages=num_messages, timeout=0.5):
            assert msg.error() is None, msg.error()
            out.append(msg)
    return out


@pytest.fixture(scope="module")
def kafka(request: pytest.FixtureRequest) -> Iterator[CompatBroker]:
    with CompatBroker(dict(getattr(request.module, "BROKER_OVERRIDES", {}))) as broker:
        yield broker
        # whatever the clients sent, the broker never failed unexpectedly
        expected = getattr(request.module, "EXPECTED_BROKER_ERRORS", ())
        errors = [e for e in broker.errors if not any(text in e for text in expected)]
        assert not errors, "\n".join(errors)[-5000:]


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name unique to the test (its node name made legal)."""
    return re.sub(r"[^a-zA-Z0-9._-]", "_", request.node.name)[:200]


@pytest.fixture
def closing() -> Iterator[list[Any]]:
    """Clients closed at the end of the test, whatever happened."""
    made: list[Any] = []
    yield made
    for c in made:
        try:
            c.close()
        except Exception:
            pass
