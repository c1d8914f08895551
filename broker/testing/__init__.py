"""Kafka for tests: an in-process broker, a pytest plugin (public API).

    from broker.testing import EmbeddedBroker

    with EmbeddedBroker() as kafka:
        kafka.create_topic("events", partitions=3)
        producer = Producer({"bootstrap.servers": kafka.bootstrap_servers})

With the package installed, pytest offers the fixtures `kafka_broker` (a fresh broker per test)
and `kafka_broker_session` (broker.testing.plugin). Importing this package is cheap: the broker
itself is imported when the first EmbeddedBroker is made.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from broker.testing.embedded import EmbeddedBroker

__all__ = ["EmbeddedBroker"]


def __getattr__(name: str) -> Any:
    if name == "EmbeddedBroker":
        from broker.testing.embedded import EmbeddedBroker

        return EmbeddedBroker
    raise AttributeError(name)
