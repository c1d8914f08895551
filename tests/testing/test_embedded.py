"""EmbeddedBroker itself: what a stop leaves on disk, properties, errors, and a second broker beside it."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.testing import EmbeddedBroker
from protocol.errors import ErrorCode, KafkaError
from tests.compat.conftest import create_topic
from tests.harness import RawClient
from tests.integration.test_server_support import batch, fetch_one, produce

CLEAN_SHUTDOWN = ".kafka_cleanshutdown"


def test_clean_stop_and_kill_leave_what_a_process_would(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with EmbeddedBroker({"log.dirs": str(data)}) as kafka:
        kafka.create_topic("t")
        port = kafka.port
        c = RawClient(port)
        assert produce(c, "t", 0, batch([b"one"])).error_code == 0
        c.close()
        kafka.stop(clean=False)
        assert not (data / CLEAN_SHUTDOWN).exists()  # the next start recovers the logs
        kafka.start()
        assert kafka.port == port
        c = RawClient(port)
        assert produce(c, "t", 0, batch([b"two"])).base_offset == 1
        c.close()
        kafka.stop()
        assert (data / CLEAN_SHUTDOWN).exists()
        kafka.start()
        c = RawClient(kafka.port)
        assert fetch_one(c, "t", 0, 0).high_watermark == 2
        c.close()
    assert data.exists()  # a directory the test gave is kept


def test_properties_temp_dir_and_errors() -> None:
    kafka = EmbeddedBroker({"num.partitions": 2}, auto_create_topics_enable=False, log_level="WARNING")
    assert kafka.properties["num.partitions"] == "2"
    assert kafka.properties["auto.create.topics.enable"] == "false"
    with kafka:
        data = Path(kafka.properties["log.dirs"])
        assert data.is_dir()
        with pytest.raises(KafkaError) as raised:
            kafka.create_topic("bad name")
        assert raised.value.code == ErrorCode.INVALID_TOPIC_EXCEPTION
        with EmbeddedBroker() as other:  # a second broker in the same process
            assert other.port != kafka.port
            create_topic(other, "only-there")
        assert kafka.broker.metadata.topic("only-there") is None
        assert kafka.errors == []
    assert not data.exists()
    with pytest.raises(RuntimeError):
        kafka.broker  # noqa: B018
