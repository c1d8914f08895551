"""Real clients over TLS and SASL: each client's configuration for one set of credentials, and a
produce-then-consume round trip per client (confluent-kafka, kafka-python, aiokafka)."""

from __future__ import annotations

import asyncio
import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Creds:
    protocol: str = "PLAINTEXT"  # security.protocol
    ca: Path | None = None  # CA file to verify the broker with
    cert: Path | None = None  # client certificate (mutual TLS)
    key: Path | None = None
    mechanism: str | None = None  # SASL mechanism
    username: str | None = None
    password: str | None = None
    token: str | None = None  # OAUTHBEARER token (kafka-python, aiokafka)


def confluent_conf(bootstrap: str, creds: Creds, **extra: Any) -> dict[str, Any]:
    conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "security.protocol": creds.protocol,
                            "log_level": 0, "socket.timeout.ms": 10000, **extra}
    if creds.ca:
        conf["ssl.ca.location"] = str(creds.ca)
    if creds.cert:
        conf["ssl.certificate.location"] = str(creds.cert)
        conf["ssl.key.location"] = str(creds.key)
    if creds.mechanism:
        conf["sasl.mechanism"] = creds.mechanism
        if creds.mechanism == "OAUTHBEARER":
            conf["enable.sasl.oauthbearer.unsecure.jwt"] = True
            conf["sasl.oauthbearer.config"] = "principal=%s" % creds.username
        else:
            conf["sasl.username"] = creds.username
            conf["sasl.password"] = creds.password
    return conf


def _ssl_context(creds: Creds) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(creds.ca) if creds.ca else None)
    if creds.cert:
        ctx.load_cert_chain(str(creds.cert), str(creds.key))
    return ctx


def _token_provider(token: str, aio: bool) -> Any:
    if aio:
        from aiokafka.abc import AbstractTokenProvider as AioProvider

        class AsyncProvider(AioProvider):
            async def token(self) -> str:
                return token

        return AsyncProvider()
    from kafka.net.sasl.oauth import AbstractTokenProvider

    class Provider(AbstractTokenProvider):
        def token(self) -> str:
            return token

    return Provider()


def python_conf(creds: Creds, aio: bool = False) -> dict[str, Any]:
    """kafka-python / aiokafka keyword arguments."""
    conf: dict[str, Any] = {"security_protocol": creds.protocol}
    if creds.protocol in ("SSL", "SASL_SSL"):
        conf["ssl_context"] = _ssl_context(creds)
    if creds.mechanism:
        conf["sasl_mechanism"] = creds.mechanism
        if creds.mechanism == "OAUTHBEARER":
            assert creds.token is not None
            conf["sasl_oauth_token_provider"] = _token_provider(creds.token, aio)
        else:
            conf["sasl_plain_username"] = creds.username
            conf["sasl_plain_password"] = creds.password
    return conf


def roundtrip_confluent(bootstrap: str, creds: Creds, topic: str, count: int = 20, size: int = 100) -> list[bytes]:
    from confluent_kafka import Consumer, Producer, TopicPartition

    p = Producer(confluent_conf(bootstrap, creds, **{"linger.ms": 5}))
    errors: list[Any] = []
    for i in range(count):
        p.produce(topic, b"%06d" % i + b"x" * (size - 6), on_delivery=lambda err, msg: errors.append(err) if err else None)
    assert p.flush(30) == 0 and not errors, errors
    c = Consumer(confluent_conf(bootstrap, creds, **{"group.id": "rt-" + topic, "enable.auto.commit": False}))
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            msg = c.poll(0.5)
            if msg is not None and not msg.error():
                out.append(msg.value())
        return out
    finally:
        c.close()


def roundtrip_kafka_python(bootstrap: str, creds: Creds, topic: str, count: int = 20) -> list[bytes]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    p = KafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=15000, **python_conf(creds))
    try:
        for f in [p.send(topic, b"%06d" % i) for i in range(count)]:
            f.get(timeout=30)
    finally:
        p.close()
    c = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None, request_timeout_ms=15000,
                      fetch_max_wait_ms=200, **python_conf(creds))
    try:
        c.assign([TopicPartition(topic, 0)])
        c.seek_to_beginning()
        out: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(out) < count and time.monotonic() < deadline:
            for records in c.poll(timeout_ms=500).values():
                out.extend(r.value for r in records)
        return out
    finally:
        c.close()


async def roundtrip_aiokafka(bootstrap: str, creds: Creds, topic: str, count: int = 20) -> list[bytes]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

    p = AIOKafkaProducer(bootstrap_servers=bootstrap, **python_conf(creds, aio=True))
    await p.start()
    try:
        for i in range(count):
            await p.send_and_wait(topic, b"%06d" % i)
    finally:
        await p.stop()
    c = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, group_id=None,
                         auto_offset_reset="earliest", fetch_max_wait_ms=200, **python_conf(creds, aio=True))
    await c.start()
    try:
        c.assign([TopicPartition(topic, 0)])
        await c.seek_to_beginning()
        out: list[bytes] = []

        async def read() -> None:
            while len(out) < count:
                for records in (await c.getmany(timeout_ms=500)).values():
                    out.extend(r.value for r in records)

        await asyncio.wait_for(read(), 30)
        return out
    finally:
        await c.stop()


def expected(count: int) -> list[bytes]:
    return [b"%06d" % i for i in range(count)]
