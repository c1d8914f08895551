"""SASL with real clients: confluent-kafka, kafka-python and aiokafka over SASL_PLAINTEXT (PLAIN,
SCRAM-SHA-256, SCRAM-SHA-512, OAUTHBEARER with unsecured tokens) and SASL_SSL, wrong passwords,
SCRAM credentials managed with confluent-kafka's admin client, and librdkafka re-authenticating
(KIP-368) on a listener with connections.max.reauth.ms."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest

pytest.importorskip("cryptography")
from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import BrokerProcess, free_port, port_open, wait_for  # noqa: E402
from tests.security.certs import TestCA  # noqa: E402
from tests.security.clients import (  # noqa: E402
    Creds,
    confluent_conf,
    expected,
    roundtrip_aiokafka,
    roundtrip_confluent,
    roundtrip_kafka_python,
)
from tests.security.inprocess import PLAIN_JAAS, unsecured_jws  # noqa: E402

MECHANISMS = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"]
CLIENTS = ["confluent", "kafka-python", "aiokafka"]


class SaslBroker:
    def __init__(self, proc: BrokerProcess, ports: dict[str, int], ca: TestCA) -> None:
        self.proc, self.ports, self.ca = proc, ports, ca

    def bootstrap(self, listener: str) -> str:
        return "127.0.0.1:%d" % self.ports[listener]


@pytest.fixture(scope="module")
def sasl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SaslBroker]:
    base = tmp_path_factory.mktemp("sasl")
    ca = TestCA(base / "certs")
    server = ca.issue("server", server=True, CN="localhost")
    proc = BrokerProcess(base / "data")
    ports = {"PLAINTEXT": proc.port, "SASL_PLAINTEXT": free_port(), "SASL_SSL": free_port(), "REAUTH": free_port()}
    proc.overrides.update({
        "listeners": ",".join("%s://127.0.0.1:%d" % item for item in ports.items()),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,SASL_SSL:SASL_SSL,"
                                          "REAUTH:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": ",".join(MECHANISMS),
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.sasl_ssl.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.reauth.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.reauth.connections.max.reauth.ms": "1000",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.combined),
    })
    proc.start()
    wait_for(lambda: all(port_open(p) for p in ports.values()), 10, what="listeners")
    _create_scram_users(proc.bootstrap)
    try:
        yield SaslBroker(proc, ports, ca)
    finally:
        output = proc.stop_cleanly()
    for secret in ("alice-secret", "admin-secret", "wrong-secret"):
        assert secret not in output  # no secret in a log


def _create_scram_users(bootstrap: str) -> None:
    """SCRAM credentials through confluent-kafka's admin client (AlterUserScramCredentials)."""
    from confluent_kafka.admin import (
        AdminClient,
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    admin = AdminClient({"bootstrap.servers": bootstrap})
    for mechanism in (ScramMechanism.SCRAM_SHA_256, ScramMechanism.SCRAM_SHA_512):
        # one alteration per user and request, as Kafka requires
        upsert = UserScramCredentialUpsertion("alice", ScramCredentialInfo(mechanism, 4096), b"alice-secret")
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(30)
    described = admin.describe_user_scram_credentials(["alice"])
    infos = described["alice"].result(30).scram_credential_infos
    assert sorted((i.mechanism, i.iterations) for i in infos) == [(ScramMechanism.SCRAM_SHA_256, 4096),
                                                                 (ScramMechanism.SCRAM_SHA_512, 4096)]


def _creds(protocol: str, mechanism: str, ca: Any = None, password: str = "alice-secret") -> Creds:
    return Creds(protocol, ca=ca, mechanism=mechanism, username="alice", password=password,
                 token=unsecured_jws("alice", 3600))


def _roundtrip(client: str, bootstrap: str, creds: Creds, topic: str) -> list[bytes]:
    if client == "confluent":
        return [v[:6] for v in roundtrip_confluent(bootstrap, creds, topic)]
    if client == "kafka-python":
        return roundtrip_kafka_python(bootstrap, creds, topic)
    return asyncio.run(roundtrip_aiokafka(bootstrap, creds, topic))


@pytest.mark.parametrize("mechanism", MECHANISMS)
@pytest.mark.parametrize("client", CLIENTS)
def test_sasl_plaintext(sasl: SaslBroker, client: str, mechanism: str, topic_name: str) -> None:
    create_topic(sasl.proc, topic_name)
    creds = _creds("SASL_PLAINTEXT", mechanism)
    assert _roundtrip(client, sasl.bootstrap("SASL_PLAINTEXT"), creds, topic_name) == expected(20)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
@pytest.mark.parametrize("client", CLIENTS)
def test_sasl_ssl(sasl: SaslBroker, client: str, mechanism: str, topic_name: str) -> None:
    create_topic(sasl.proc, topic_name)
    creds = _creds("SASL_SSL", mechanism, ca=sasl.ca.path)
    assert _roundtrip(client, sasl.bootstrap("SASL_SSL"), creds, topic_name) == expected(20)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_wrong_password_with_each_client(sasl: SaslBroker, mechanism: str) -> None:
    from confluent_kafka import KafkaError, Producer

    bootstrap = sasl.bootstrap("SASL_PLAINTEXT")
    creds = _creds("SASL_PLAINTEXT", mechanism, password="wrong-secret")
    errors: list[Any] = []
    producer = Producer(confluent_conf(bootstrap, creds, error_cb=errors.append))
    deadline = time.monotonic() + 10
    while not errors and time.monotonic() < deadline:
        producer.poll(0.2)
    assert errors and errors[0].code() == KafkaError._AUTHENTICATION, errors
    assert "Authentication failed" in errors[0].str()

    import kafka.errors as kerrors
    from kafka import KafkaConsumer

    from tests.security.clients import python_conf

    with pytest.raises(kerrors.KafkaError):
        KafkaConsumer(bootstrap_servers=bootstrap, request_timeout_ms=5000, api_version_auto_timeout_ms=5000,
                      **python_conf(creds)).topics()

    from aiokafka import AIOKafkaProducer
    from aiokafka.errors import KafkaError as AioKafkaError

    async def aio() -> None:
        p = AIOKafkaProducer(bootstrap_servers=bootstrap, request_timeout_ms=5000, **python_conf(creds, aio=True))
        try:
            await p.start()
        finally:
            await p.stop()

    with pytest.raises(AioKafkaError):
        asyncio.run(aio())
    wait_for(lambda: "authentication failed" in sasl.proc.output(), 10, what="the failure's log line")


def test_librdkafka_reauthenticates(sasl: SaslBroker, topic_name: str) -> None:
    """connections.max.reauth.ms=1000: librdkafka re-authenticates on its open connections and
    keeps producing; none of them is closed as expired."""
    from confluent_kafka import Producer

    create_topic(sasl.proc, topic_name)
    creds = _creds("SASL_PLAINTEXT", "SCRAM-SHA-512")
    p = Producer(confluent_conf(sasl.bootstrap("REAUTH"), creds, **{"linger.ms": 0}))
    errors: list[Any] = []
    deadline = time.monotonic() + 3.5
    sent = 0
    while time.monotonic() < deadline:
        p.produce(topic_name, b"%06d" % sent, on_delivery=lambda err, msg: errors.append(err) if err else None)
        sent += 1
        p.flush(10)
        time.sleep(0.05)
    assert p.flush(10) == 0 and not errors, errors
    assert "session expired" not in sasl.proc.output()
