"""kcat (Debian's 1.7.1 on librdkafka 2.0.2): metadata listing, producing and consuming."""

from __future__ import annotations

import json
import shutil
import subprocess

import pytest

from tests.compat.conftest import create_topic
from tests.harness import BrokerProcess

KCAT = shutil.which("kcat") or shutil.which("kafkacat")
pytestmark = pytest.mark.skipif(KCAT is None, reason="kcat is not installed")


def kcat(broker: BrokerProcess, *args: str, stdin: bytes | None = None, timeout: float = 30) -> str:
    assert KCAT is not None
    cmd = [KCAT, "-b", broker.bootstrap, "-X", "socket.timeout.ms=10000", *args]
    done = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    assert done.returncode == 0, (cmd, done.stderr.decode(errors="replace"))
    return done.stdout.decode()


def test_list_metadata(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 3)
    text = kcat(kafka, "-L")
    assert "1 brokers:" in text and "broker 1 at 127.0.0.1:%d" % kafka.port in text
    assert 'topic "%s" with 3 partitions:' % topic_name in text
    listing = json.loads(kcat(kafka, "-L", "-J", "-t", topic_name))
    assert [b["id"] for b in listing["brokers"]] == [1]
    [topic] = listing["topics"]
    assert topic["topic"] == topic_name
    assert [(p["partition"], p["leader"], p.get("error")) for p in topic["partitions"]] == [
        (0, 1, None), (1, 1, None), (2, 1, None)]


def test_produce_and_consume(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 2)
    lines = "".join("key%d:value %d\n" % (i, i) for i in range(50))
    kcat(kafka, "-P", "-t", topic_name, "-p", "1", "-K", ":", "-H", "source=kcat", stdin=lines.encode())
    out = kcat(kafka, "-C", "-t", topic_name, "-p", "1", "-o", "beginning", "-e", "-f", "%o|%k|%s|%h\n")
    rows = [line.split("|") for line in out.splitlines()]
    assert rows == [[str(i), "key%d" % i, "value %d" % i, "source=kcat"] for i in range(50)]
    # partition 0 is empty: kcat exits at its end
    assert kcat(kafka, "-C", "-t", topic_name, "-p", "0", "-o", "beginning", "-e") == ""


def test_null_values_and_offsets(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    kcat(kafka, "-P", "-t", topic_name, "-Z", "-K", ":", stdin=b"a:1\nb:\nc:3\n")
    out = kcat(kafka, "-C", "-t", topic_name, "-o", "1", "-e", "-Z", "-f", "%o %k %s\n")
    assert out.splitlines() == ["1 b NULL", "2 c 3"]
    tail = kcat(kafka, "-C", "-t", topic_name, "-o", "-1", "-e", "-f", "%s\n")  # the last message
    assert tail.splitlines() == ["3"]


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_compression(kafka: BrokerProcess, topic_name: str, codec: str) -> None:
    create_topic(kafka, topic_name, 1)
    lines = "".join("line %d %s\n" % (i, "x" * 50) for i in range(200))
    kcat(kafka, "-P", "-t", topic_name, "-X", "compression.codec=%s" % codec, stdin=lines.encode())
    out = kcat(kafka, "-C", "-t", topic_name, "-o", "beginning", "-e")
    assert out == lines


def test_consume_with_json_envelope(kafka: BrokerProcess, topic_name: str) -> None:
    create_topic(kafka, topic_name, 1)
    kcat(kafka, "-P", "-t", topic_name, stdin=b"hello\n")
    [line] = kcat(kafka, "-C", "-t", topic_name, "-o", "beginning", "-e", "-J").splitlines()
    msg = json.loads(line)
    assert (msg["topic"], msg["partition"], msg["offset"], msg["payload"]) == (topic_name, 0, 0, "hello")
    assert msg["tstype"] == "create" and msg["ts"] > 0
