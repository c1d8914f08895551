"""A broker as a client of another broker's inter-broker listener (broker/security/interbroker.py
and broker/cluster/client.py's NodeClient): the settings Kafka's ChannelBuilders takes for it,
refused at start-up when they cannot work, and real connections to an in-process broker over
SASL (PLAIN, SCRAM made with AlterUserScramCredentials first, re-authentication on the same
connection) and TLS (the key store as the client certificate and the principal it maps to, the
trust store, host name verification), each failure logged with the reason."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from broker.cluster.client import NodeClient
from broker.config import BrokerConfig
from broker.security.errors import SecurityConfigError
from broker.security.interbroker import InterBrokerSecurity, inter_broker_security
from broker.security.sasl.scram import SCRAM_SHA_512, salted_password
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError
from tests.security.inprocess import PLAIN_JAAS, SecureBrokerThread

pytest.importorskip("cryptography")
from tests.security.certs import TestCA  # noqa: E402

E = ErrorCode
DESCRIBE_ACLS, ALTER_SCRAM = 29, 51
AUTHZ = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
         "super.users": "User:admin;User:broker-1"}
BROKER_JAAS = ('org.apache.kafka.common.security.plain.PlainLoginModule required username="%s" password="%s" '
               'user_admin="admin-secret" user_alice="alice-secret";')
SCRAM_JAAS = 'org.apache.kafka.common.security.scram.ScramLoginModule required username="%s" password="%s";'


def describe_acls_filter() -> M.DescribeAclsRequest:
    """DescribeAcls of everything: DESCRIBE on the cluster, else CLUSTER_AUTHORIZATION_FAILED."""
    return M.DescribeAclsRequest(resource_type_filter=1, resource_name_filter=None, pattern_type_filter=1,
                                 principal_filter=None, host_filter=None, operation=1, permission_type=1)


def call(client: NodeClient, api_key: int, version: int, request: Any) -> Any:
    async def go() -> Any:
        try:
            return await client.call(api_key, version, request)
        finally:
            client.close()

    return asyncio.run(go())


def describe_acls(client: NodeClient) -> int:
    return int(call(client, DESCRIBE_ACLS, 3, describe_acls_filter()).error_code)


# settings ----------------------------------------------------------------------------------------
SASL_LISTENER = {"listeners": "SASL_PLAINTEXT://127.0.0.1:9092", "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
                 "sasl.mechanism.inter.broker.protocol": "PLAIN",
                 "listener.name.sasl_plaintext.plain.sasl.jaas.config": BROKER_JAAS % ("admin", "admin-secret")}


def test_plaintext_listener_is_plain_tcp() -> None:
    security = inter_broker_security(BrokerConfig({}), "PLAINTEXT")
    assert security == InterBrokerSecurity("PLAINTEXT", "PLAINTEXT")
    assert security.ssl_context is None and not security.uses_sasl


def test_sasl_settings_from_the_listeners_jaas_entry() -> None:
    security = inter_broker_security(BrokerConfig(SASL_LISTENER), "sasl_plaintext")
    assert (security.listener, security.protocol, security.mechanism) == ("SASL_PLAINTEXT", "SASL_PLAINTEXT", "PLAIN")
    assert security.credentials["username"] == "admin"
    assert "admin-secret" not in repr(security)  # a settings object printed never shows the password
    scram = inter_broker_security(BrokerConfig({
        **SASL_LISTENER, "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
        "listener.name.sasl_plaintext.scram-sha-512.sasl.jaas.config": SCRAM_JAAS % ("broker", "pw")}),
        "SASL_PLAINTEXT")
    assert scram.mechanism == "SCRAM-SHA-512" and scram.credentials["username"] == "broker"


@pytest.mark.parametrize("changes, message", [
    ({"sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-256"},
     "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms"),
    ({"sasl.mechanism.inter.broker.protocol": None},  # Kafka's default, GSSAPI
     "sasl.mechanism.inter.broker.protocol must be included in sasl.enabled.mechanisms"),
    ({"listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS.replace('password="admin-secret" ', "")},
     "needs the username and password options"),
    ({"sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512"}, "needs the username and password options"),
    ({"sasl.enabled.mechanisms": "PLAIN,OAUTHBEARER", "sasl.mechanism.inter.broker.protocol": "OAUTHBEARER",
      "listener.name.sasl_plaintext.oauthbearer.sasl.jaas.config":
          "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required;"},
     "needs a principal"),
])
def test_settings_that_cannot_work_are_refused(changes: dict[str, Any], message: str) -> None:
    values = {**SASL_LISTENER, **changes}
    with pytest.raises(SecurityConfigError, match=message):
        inter_broker_security(BrokerConfig({k: v for k, v in values.items() if v is not None}), "SASL_PLAINTEXT")


def test_tls_settings() -> None:
    with pytest.raises(SecurityConfigError, match="No security protocol defined for listener INTERNAL"):
        inter_broker_security(BrokerConfig({}), "INTERNAL")
    tls = {"listener.security.protocol.map": "INTERNAL:SSL", "ssl.truststore.type": "PEM"}
    assert inter_broker_security(BrokerConfig(tls), "INTERNAL").ssl_context.check_hostname  # type: ignore[union-attr]
    off = inter_broker_security(BrokerConfig({**tls, "listener.name.internal.ssl.endpoint.identification.algorithm":
                                              ""}), "INTERNAL")
    assert off.ssl_context is not None and not off.ssl_context.check_hostname
    with pytest.raises(SecurityConfigError, match="ssl.endpoint.identification.algorithm"):
        inter_broker_security(BrokerConfig({**tls, "ssl.endpoint.identification.algorithm": "ldap"}), "INTERNAL")


# SASL, for real --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def sasl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBrokerThread]:
    bt = SecureBrokerThread(tmp_path_factory.mktemp("interbroker-sasl"), {
        **AUTHZ,
        "listeners": "SASL_PLAINTEXT://127.0.0.1:0,REAUTH://127.0.0.1:0",
        "listener.security.protocol.map": "SASL_PLAINTEXT:SASL_PLAINTEXT,REAUTH:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-512",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": BROKER_JAAS % ("admin", "admin-secret"),
        "listener.name.reauth.plain.sasl.jaas.config": BROKER_JAAS % ("admin", "admin-secret"),
        "listener.name.reauth.connections.max.reauth.ms": "1200",
        "connection.failed.authentication.delay.ms": "10",
    }).start()
    try:
        yield bt
    finally:
        bt.close()


def sasl_client(bt: SecureBrokerThread, mechanism: str, user: str, password: str,
                listener: str = "SASL_PLAINTEXT") -> NodeClient:
    jaas = (BROKER_JAAS if mechanism == "PLAIN" else SCRAM_JAAS) % (user, password)
    config = BrokerConfig({**SASL_LISTENER, "listeners": "%s://127.0.0.1:0" % listener,
                           "listener.security.protocol.map": "%s:SASL_PLAINTEXT" % listener,
                           "sasl.mechanism.inter.broker.protocol": mechanism,
                           "listener.name.%s.%s.sasl.jaas.config" % (listener.lower(), mechanism.lower()): jaas})
    port = bt.port_of(listener)
    return NodeClient(lambda: ("127.0.0.1", port), "broker-2", security=inter_broker_security(config, listener),
                      node=1)


def test_plain_authenticates_as_the_inter_broker_principal(sasl: SecureBrokerThread) -> None:
    assert describe_acls(sasl_client(sasl, "PLAIN", "admin", "admin-secret")) == E.NONE  # User:admin: a super user
    assert describe_acls(sasl_client(sasl, "PLAIN", "alice", "alice-secret")) == E.CLUSTER_AUTHORIZATION_FAILED


def test_wrong_credentials_fail_the_call_with_a_log_line(sasl: SecureBrokerThread) -> None:
    client = sasl_client(sasl, "PLAIN", "admin", "not-the-password")
    with structlog.testing.capture_logs() as logs, pytest.raises(KafkaError) as failure:
        call(client, DESCRIBE_ACLS, 3, describe_acls_filter())
    assert failure.value.code is E.COORDINATOR_NOT_AVAILABLE  # what the caller asked unreachable nodes to give
    (line,) = [entry for entry in logs if entry["log_level"] == "error"]
    assert line["event"] == ("connection to node 1 (127.0.0.1:%d) failed authentication due to: Authentication "
                             "failed: Invalid username or password" % sasl.port_of("SASL_PLAINTEXT"))
    assert line["mechanism"] == "PLAIN" and "not-the-password" not in str(logs)


def test_scram_user_made_with_alter_user_scram_credentials(sasl: SecureBrokerThread) -> None:
    scram = sasl_client(sasl, "SCRAM-SHA-512", "broker-1", "broker-secret")
    with pytest.raises(KafkaError):  # no such user yet
        call(scram, DESCRIBE_ACLS, 3, describe_acls_filter())
    salt = b"0123456789abcdef"
    R = M.AlterUserScramCredentialsRequest
    response = call(sasl_client(sasl, "PLAIN", "admin", "admin-secret"), ALTER_SCRAM, 0, R(deletions=[], upsertions=[
        R.ScramCredentialUpsertion(name="broker-1", mechanism=SCRAM_SHA_512.type, iterations=4096, salt=salt,
                                   salted_password=salted_password(SCRAM_SHA_512, "broker-secret", salt, 4096))]))
    assert [r.error_code for r in response.results] == [0]
    assert describe_acls(scram) == E.NONE  # User:broker-1, a super user


def test_reauthenticates_on_the_same_connection_before_the_session_ends(sasl: SecureBrokerThread) -> None:
    client = sasl_client(sasl, "PLAIN", "admin", "admin-secret", listener="REAUTH")

    async def go() -> None:
        request = describe_acls_filter()
        try:
            assert (await client.call(DESCRIBE_ACLS, 3, request)).error_code == 0
            streams = client._streams
            due = client._reauthenticate_at
            assert streams is not None and due is not None
            assert 0.85 * 1.2 - 0.1 <= due - time.monotonic() <= 0.95 * 1.2
            await asyncio.sleep(1.3)  # past the session's end (1.2 s): the server would close it
            assert (await client.call(DESCRIBE_ACLS, 3, request)).error_code == 0
            assert client._streams is streams  # the same connection, authenticated again
            assert client._reauthenticate_at is not None and client._reauthenticate_at > due
        finally:
            client.close()

    asyncio.run(go())


# TLS, for real ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> TestCA:
    return TestCA(tmp_path_factory.mktemp("interbroker-certs"))


def tls_settings(ca: TestCA, stem: str, hosts: tuple[str, ...] = ("localhost", "127.0.0.1")) -> dict[str, str]:
    cert = ca.issue(stem, server=True, client_too=True, hosts=hosts, O="Brokers", CN=stem)
    return {"listeners": "INTERNAL://127.0.0.1:0", "listener.security.protocol.map": "INTERNAL:SSL",
            "ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.combined),
            "ssl.truststore.type": "PEM", "ssl.truststore.location": str(ca.path)}


def tls_client(port: int, settings: dict[str, str]) -> NodeClient:
    security = inter_broker_security(BrokerConfig(settings), "INTERNAL")
    return NodeClient(lambda: ("127.0.0.1", port), "broker-2", security=security, node=1)


def test_mutual_tls_principal_is_the_certificates_mapped_name(tmp_path: Path, ca: TestCA) -> None:
    bt = SecureBrokerThread(tmp_path, {
        **AUTHZ, **tls_settings(ca, "broker-0"), "ssl.client.auth": "required",
        "ssl.principal.mapping.rules": "RULE:^CN=(.*?),O=.*$/$1/,DEFAULT"}).start()
    try:
        port = bt.port_of("INTERNAL")
        assert describe_acls(tls_client(port, tls_settings(ca, "broker-1"))) == E.NONE  # User:broker-1
        assert describe_acls(tls_client(port, tls_settings(ca, "broker-2"))) == E.CLUSTER_AUTHORIZATION_FAILED
        other = TestCA(tmp_path / "other", name="Other CA")  # a server this trust store does not trust
        with structlog.testing.capture_logs() as logs, pytest.raises(KafkaError):
            describe_acls(tls_client(port, {**tls_settings(ca, "broker-1"), "ssl.truststore.location":
                                            str(other.path)}))
        (line,) = [entry for entry in logs if entry["log_level"] == "error"]
        assert "TLS handshake failed" in line["event"] and "certificate verify failed" in line["event"], line
    finally:
        bt.close()


def test_host_name_verification(tmp_path: Path, ca: TestCA) -> None:
    """The other broker's certificate names another host: refused unless
    ssl.endpoint.identification.algorithm is empty (the chain is still verified)."""
    bt = SecureBrokerThread(tmp_path, {**AUTHZ, **tls_settings(ca, "elsewhere", hosts=("broker.example",)),
                                       "super.users": "User:ANONYMOUS"}).start()
    try:
        port = bt.port_of("INTERNAL")
        with structlog.testing.capture_logs() as logs, pytest.raises(KafkaError):
            describe_acls(tls_client(port, tls_settings(ca, "broker-1")))
        assert any("IP address mismatch" in entry["event"] for entry in logs), logs
        unchecked = {**tls_settings(ca, "broker-1"), "ssl.endpoint.identification.algorithm": ""}
        assert describe_acls(tls_client(port, unchecked)) == E.NONE
    finally:
        bt.close()
