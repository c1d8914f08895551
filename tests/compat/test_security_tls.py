"""TLS with real clients: an SSL listener (CA verified, client certificate requested) and a mutual
TLS listener (client certificate required) beside PLAINTEXT, certificates made by the test.

Also: Metadata advertises the listener a client came in on, a plaintext client on the TLS port
and a TLS client on the plaintext port are closed with a log line and disturb nobody, and
settings the broker cannot serve stop its start with a clear message.
"""

from __future__ import annotations

import socket
import ssl
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import frames  # noqa: E402
from protocol import messages as M  # noqa: E402

pytest.importorskip("cryptography")
from tests.compat.conftest import create_topic  # noqa: E402
from tests.harness import ROOT, BrokerProcess, RawClient, free_port, port_open, wait_for  # noqa: E402
from tests.integration.test_server_support import API_VERSIONS  # noqa: E402
from tests.security.certs import TestCA  # noqa: E402
from tests.security.clients import (  # noqa: E402
    Creds,
    confluent_conf,
    expected,
    roundtrip_aiokafka,
    roundtrip_confluent,
    roundtrip_kafka_python,
)


class TlsBroker:
    def __init__(self, proc: BrokerProcess, ssl_port: int, mtls_port: int, ca: TestCA, client: Path, key: Path) -> None:
        self.proc, self.ssl_port, self.mtls_port, self.ca = proc, ssl_port, mtls_port, ca
        self.client_cert, self.client_key = client, key

    @property
    def ssl_bootstrap(self) -> str:
        return "127.0.0.1:%d" % self.ssl_port

    @property
    def mtls_bootstrap(self) -> str:
        return "127.0.0.1:%d" % self.mtls_port

    def creds(self) -> Creds:
        return Creds("SSL", ca=self.ca.path)

    def mtls_creds(self) -> Creds:
        return Creds("SSL", ca=self.ca.path, cert=self.client_cert, key=self.client_key)


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    base = tmp_path_factory.mktemp("tls")
    ca = TestCA(base / "certs")
    server = ca.issue("server", server=True, password="key-secret", CN="localhost")
    client = ca.issue("client", C="US", O="Org", OU="Eng", CN="alice")
    ssl_port, mtls_port = free_port(), free_port()
    proc = BrokerProcess(base / "data")
    proc.overrides.update({
        "listeners": "PLAINTEXT://127.0.0.1:%d,SSL://127.0.0.1:%d,MTLS://127.0.0.1:%d" % (proc.port, ssl_port, mtls_port),
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SSL:SSL,MTLS:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(server.combined),
        "ssl.key.password": "key-secret",
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(ca.path),
        "ssl.client.auth": "requested",
        # the mutual TLS listener: inline PEM key store, client certificate required
        "listener.name.mtls.ssl.keystore.location": "",
        "listener.name.mtls.ssl.keystore.key": server.key_pem.decode(),
        "listener.name.mtls.ssl.keystore.certificate.chain": server.cert_pem.decode(),
        "listener.name.mtls.ssl.client.auth": "required",
        "listener.name.mtls.ssl.principal.mapping.rules": "RULE:^CN=(.*?),OU=.*$/$1/L,DEFAULT",
    })
    proc.start()
    wait_for(lambda: port_open(ssl_port) and port_open(mtls_port), 10, what="TLS listeners")
    try:
        yield TlsBroker(proc, ssl_port, mtls_port, ca, client.cert, client.key)
    finally:
        output = proc.stop_cleanly()
    assert "key-secret" not in output and "PRIVATE KEY" not in output  # no secret in a log


def test_confluent_over_ssl(tls: TlsBroker, topic_name: str) -> None:
    create_topic(tls.proc, topic_name)
    out = roundtrip_confluent(tls.ssl_bootstrap, tls.creds(), topic_name, count=50, size=10_000)
    assert [v[:6] for v in out] == expected(50)


def test_kafka_python_over_ssl(tls: TlsBroker, topic_name: str) -> None:
    create_topic(tls.proc, topic_name)
    assert roundtrip_kafka_python(tls.ssl_bootstrap, tls.creds(), topic_name) == expected(20)


async def test_aiokafka_over_ssl(tls: TlsBroker, topic_name: str) -> None:
    create_topic(tls.proc, topic_name)
    assert await roundtrip_aiokafka(tls.ssl_bootstrap, tls.creds(), topic_name) == expected(20)


def test_mutual_tls_with_each_client(tls: TlsBroker, topic_name: str) -> None:
    import asyncio

    for client in ("confluent", "kafka-python", "aiokafka"):
        create_topic(tls.proc, "%s-%s" % (topic_name, client))
    creds = tls.mtls_creds()
    out = roundtrip_confluent(tls.mtls_bootstrap, creds, topic_name + "-confluent")
    assert [v[:6] for v in out] == expected(20)
    assert roundtrip_kafka_python(tls.mtls_bootstrap, creds, topic_name + "-kafka-python") == expected(20)
    assert asyncio.run(roundtrip_aiokafka(tls.mtls_bootstrap, creds, topic_name + "-aiokafka")) == expected(20)


def test_mutual_tls_refuses_a_client_without_certificate(tls: TlsBroker) -> None:
    ctx = ssl.create_default_context(cafile=str(tls.ca.path))
    with socket.create_connection(("127.0.0.1", tls.mtls_port), timeout=10) as raw:
        try:
            with ctx.wrap_socket(raw, server_hostname="localhost") as s:
                s.sendall(b"\x00\x00\x00\x01x")
                assert s.recv(10) == b""  # TLS 1.3: the refusal arrives after the client's handshake
        except (ssl.SSLError, ConnectionError):
            pass
    wait_for(lambda: "TLS handshake failed" in tls.proc.output(), 10, what="the handshake failure log line")


def test_metadata_advertises_the_listener_used(tls: TlsBroker) -> None:
    from confluent_kafka.admin import AdminClient

    for bootstrap, creds, port in [
        (tls.proc.bootstrap, Creds(), tls.proc.port),
        (tls.ssl_bootstrap, tls.creds(), tls.ssl_port),
        (tls.mtls_bootstrap, tls.mtls_creds(), tls.mtls_port),
    ]:
        brokers = AdminClient(confluent_conf(bootstrap, creds)).list_topics(timeout=10).brokers
        assert [(b.host, b.port) for b in brokers.values()] == [("127.0.0.1", port)]


def test_plaintext_on_tls_port_and_tls_on_plaintext_port(tls: TlsBroker) -> None:
    bystander = RawClient(tls.proc.port)  # an open connection that must not notice
    # a Kafka request in clear text on the TLS port
    with socket.create_connection(("127.0.0.1", tls.ssl_port), timeout=10) as s:
        frame = frames.encode_request_header(18, 0, 1, "clear") + M.encode(M.ApiVersionsRequest(), 0)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        while s.recv(100):  # a TLS alert at most, then the close
            pass
    # a TLS handshake on the plaintext port
    ctx = ssl.create_default_context(cafile=str(tls.ca.path))
    with socket.create_connection(("127.0.0.1", tls.proc.port), timeout=10) as raw, pytest.raises(
            (ssl.SSLError, ConnectionError, OSError)):
        ctx.wrap_socket(raw, server_hostname="localhost")
    wait_for(lambda: "TLS handshake failed" in tls.proc.output(), 10, what="log line for clear text on TLS")
    wait_for(lambda: "tls_on_plaintext_port" in tls.proc.output(), 10, what="log line for TLS on the plaintext port")
    assert bystander.call(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t",
                                                                 client_software_version="1")).error_code == 0
    bystander.close()


@pytest.mark.parametrize("overrides, message", [
    ({"ssl.keystore.type": "JKS", "ssl.keystore.location": "/nonexistent/server.jks",
      "ssl.keystore.password": "pw"}, "ssl.keystore.type=JKS is not supported"),
    ({"ssl.keystore.type": "PEM"}, "needs a key store"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/nonexistent.pem", "ssl.keystore.password": "pw"},
     "SSL key store password cannot be specified with PEM format"),
    ({"listener.security.protocol.map": "PLAINTEXT:PLAINTEXT"}, "No security protocol defined for listener SSL"),
    ({"ssl.keystore.type": "PEM", "ssl.keystore.location": "/nonexistent.pem", "ssl.client.auth": "sometimes"},
     "Invalid value sometimes for configuration ssl.client.auth"),
])
def test_unservable_settings_stop_the_start(tmp_path: Path, overrides: dict[str, str], message: str) -> None:
    args = [sys.executable, "-m", "broker", "--override", "listeners=SSL://127.0.0.1:%d" % free_port(),
            "--override", "log.dirs=%s" % (tmp_path / "data")]
    for k, v in overrides.items():
        args += ["--override", "%s=%s" % (k, v)]
    done = subprocess.run(args, cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    assert message in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert "pw" not in done.stderr.replace("password", "")
