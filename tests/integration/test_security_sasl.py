"""SASL over raw frames: the authenticator's states, every mechanism, SCRAM credential APIs,
re-authentication (KIP-368), and bad input (garbage, oversized tokens, requests before
authentication), each closing only its own connection, with a log line and no secret in it."""

from __future__ import annotations

import logging
import os
import socket
import struct
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from protocol import messages as M
from protocol.errors import ErrorCode
from tests.harness import RawClient, wait_for
from tests.security.inprocess import (
    API_VERSIONS,
    METADATA,
    PLAIN_JAAS,
    SASL_AUTHENTICATE,
    ScramClient,
    SecureBrokerThread,
    authenticate,
    handshake,
    oauth_token,
    plain_login,
    scram_login,
    unsecured_jws,
)

E = ErrorCode
DESCRIBE_SCRAM, ALTER_SCRAM = 50, 51
MECHANISMS = "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512,OAUTHBEARER"


@pytest.fixture(scope="module")
def sasl(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBrokerThread]:
    with SecureBrokerThread(tmp_path_factory.mktemp("sasl"), {
        "listeners": "PLAINTEXT://127.0.0.1:0,SASL_PLAINTEXT://127.0.0.1:0,REAUTH://127.0.0.1:0",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT,REAUTH:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": MECHANISMS,
        "listener.name.sasl_plaintext.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.reauth.plain.sasl.jaas.config": PLAIN_JAAS,
        "listener.name.reauth.connections.max.reauth.ms": "1500",
        "connection.failed.authentication.delay.ms": "50",
    }) as bt:
        c = bt.client()
        response = c.call(ALTER_SCRAM, 0, M.AlterUserScramCredentialsRequest(deletions=[], upsertions=[
            upsertion("alice", 1, "alice-secret"), upsertion("alice", 2, "alice-secret")]))
        assert [(r.user, r.error_code) for r in response.results] == [("alice", E.DUPLICATE_RESOURCE)]
        response = c.call(ALTER_SCRAM, 0, M.AlterUserScramCredentialsRequest(deletions=[], upsertions=[
            upsertion("alice", 2, "alice-secret"), upsertion("bob", 1, "bob-secret", 8192)]))
        assert [r.error_code for r in response.results] == [0, 0]
        response = c.call(ALTER_SCRAM, 0, M.AlterUserScramCredentialsRequest(deletions=[], upsertions=[
            upsertion("alice", 1, "alice-secret")]))
        assert [r.error_code for r in response.results] == [0]
        c.close()
        yield bt


def upsertion(name: str, mechanism: int, password: str, iterations: int = 4096) -> Any:
    import hashlib

    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac("sha256" if mechanism == 1 else "sha512", password.encode(), salt, iterations)
    return M.AlterUserScramCredentialsRequest.ScramCredentialUpsertion(
        name=name, mechanism=mechanism, iterations=iterations, salt=salt, salted_password=salted)


def api_versions(c: RawClient) -> Any:
    return c.call(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1"))


def metadata(c: RawClient) -> Any:
    return c.call(METADATA, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False))


def closed(c: RawClient) -> bool:
    return c.is_closed(5)


# ----- mechanisms ------------------------------------------------------------------------------
@pytest.mark.parametrize("version", [0, 1, 2])
def test_plain(sasl: SecureBrokerThread, version: int) -> None:
    c = sasl.connect("SASL_PLAINTEXT")
    assert api_versions(c).error_code == 0
    response = plain_login(c, "alice", "alice-secret", version)
    assert response.error_code == 0
    if version >= 1:
        assert response.session_lifetime_ms == 0  # connections.max.reauth.ms=0: no limit
    assert metadata(c).brokers[0].port == sasl.port_of("SASL_PLAINTEXT")
    c.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram(sasl: SecureBrokerThread, mechanism: str) -> None:
    c = sasl.connect("SASL_PLAINTEXT")
    assert scram_login(c, mechanism, "alice", "alice-secret").error_code == 0
    assert metadata(c).cluster_id
    c.close()


def test_scram_wrong_password_and_unknown_user(sasl: SecureBrokerThread) -> None:
    for user, password in [("alice", "wrong"), ("nobody", "x")]:
        c = sasl.connect("SASL_PLAINTEXT")
        assert handshake(c, "SCRAM-SHA-256").error_code == 0
        client = ScramClient("sha256", user, password)
        first = authenticate(c, client.first())
        if first.error_code == 0:
            first = authenticate(c, client.final(bytes(first.auth_bytes)))
        assert first.error_code == E.SASL_AUTHENTICATION_FAILED
        # the same message whether the user exists or not
        assert first.error_message == ("Authentication failed during authentication due to invalid credentials with "
                                       "SASL mechanism SCRAM-SHA-256")
        assert closed(c)


def test_oauthbearer_unsecured_token(sasl: SecureBrokerThread) -> None:
    c = sasl.connect("SASL_PLAINTEXT")
    assert handshake(c, "OAUTHBEARER").error_code == 0
    response = authenticate(c, oauth_token(unsecured_jws("carol", 30)))
    assert response.error_code == 0
    assert 0 < response.session_lifetime_ms <= 30_000  # the token's lifetime bounds the session
    assert metadata(c).cluster_id
    c.close()
    # an expired token: a JSON error as challenge, then the failure once the client answers \x01
    c = sasl.connect("SASL_PLAINTEXT")
    assert handshake(c, "OAUTHBEARER").error_code == 0
    response = authenticate(c, oauth_token(unsecured_jws("carol", -60)))
    assert response.error_code == 0 and bytes(response.auth_bytes) == b'{"status":"invalid_token"}'
    response = authenticate(c, b"\x01")
    assert response.error_code == E.SASL_AUTHENTICATION_FAILED
    assert closed(c)


def test_wrong_password_is_answered_after_the_delay_then_closed(sasl: SecureBrokerThread) -> None:
    c = sasl.connect("SASL_PLAINTEXT")
    assert handshake(c, "PLAIN").error_code == 0
    start = time.monotonic()
    response = authenticate(c, b"\x00alice\x00not-her-password")
    assert time.monotonic() - start >= 0.04  # connection.failed.authentication.delay.ms=50
    assert response.error_code == E.SASL_AUTHENTICATION_FAILED
    assert response.error_message == "Authentication failed: Invalid username or password"
    assert closed(c)


def test_unsupported_mechanism(sasl: SecureBrokerThread) -> None:
    c = sasl.connect("SASL_PLAINTEXT")
    response = handshake(c, "GSSAPI")
    assert response.error_code == E.UNSUPPORTED_SASL_MECHANISM
    assert list(response.mechanisms) == MECHANISMS.split(",")
    assert closed(c)


def test_sasl_requests_elsewhere_get_illegal_sasl_state(sasl: SecureBrokerThread) -> None:
    c = sasl.client()  # PLAINTEXT
    assert handshake(c, "PLAIN").error_code == E.ILLEGAL_SASL_STATE
    c.close()
    c = sasl.connect("SASL_PLAINTEXT")
    assert plain_login(c, "alice", "alice-secret").error_code == 0
    # no session lifetime on this listener: a second handshake is not a re-authentication
    assert handshake(c, "PLAIN").error_code == E.ILLEGAL_SASL_STATE
    assert authenticate(c, b"\x00alice\x00x").error_code == E.ILLEGAL_SASL_STATE
    c.close()


# ----- SCRAM credentials -------------------------------------------------------------------------
def test_describe_and_alter_scram_credentials(sasl: SecureBrokerThread) -> None:
    c = sasl.client()
    R = M.DescribeUserScramCredentialsRequest
    response = c.call(DESCRIBE_SCRAM, 0, R(users=[R.UserName(name="alice"), R.UserName(name="zed"),
                                                  R.UserName(name="bob"), R.UserName(name="bob")]))
    by_user = {r.user: r for r in response.results}
    assert [(i.mechanism, i.iterations) for i in by_user["alice"].credential_infos] == [(1, 4096), (2, 4096)]
    assert by_user["zed"].error_code == E.RESOURCE_NOT_FOUND
    assert by_user["bob"].error_code == E.DUPLICATE_RESOURCE
    everyone = c.call(DESCRIBE_SCRAM, 0, R(users=None))
    assert {r.user for r in everyone.results} >= {"alice", "bob"}
    U = M.AlterUserScramCredentialsRequest
    response = c.call(ALTER_SCRAM, 0, U(deletions=[U.ScramCredentialDeletion(name="zed", mechanism=1),
                                                   U.ScramCredentialDeletion(name="", mechanism=1)],
                                        upsertions=[upsertion("x", 1, "p", 100), upsertion("y", 1, "p", 20000),
                                                    upsertion("w", 3, "p")]))
    codes = {r.user: (r.error_code, r.error_message) for r in response.results}
    assert codes == {
        "zed": (E.RESOURCE_NOT_FOUND, "Attempt to delete a user credential that does not exist"),
        "": (E.UNACCEPTABLE_CREDENTIAL, "Username must not be empty"),
        "x": (E.UNACCEPTABLE_CREDENTIAL, "Too few iterations"),
        "y": (E.UNACCEPTABLE_CREDENTIAL, "Too many iterations"),
        "w": (E.UNSUPPORTED_SASL_MECHANISM, "Unknown SCRAM mechanism"),
    }
    # a deleted credential no longer authenticates
    response = c.call(ALTER_SCRAM, 0, U(deletions=[U.ScramCredentialDeletion(name="bob", mechanism=1)], upsertions=[]))
    assert response.results[0].error_code == 0
    s = sasl.connect("SASL_PLAINTEXT")
    assert scram_login(s, "SCRAM-SHA-256", "bob", "bob-secret").error_code == E.SASL_AUTHENTICATION_FAILED
    c.close()
    # stored salted only: neither password nor salted password is in the metadata log
    data = b"".join(p.read_bytes() for p in Path(sasl.properties["log.dirs"]).rglob("*.log"))
    assert b"alice-secret" not in data and b"bob-secret" not in data


# ----- re-authentication (KIP-368) ---------------------------------------------------------------
def test_reauthentication_extends_the_session(sasl: SecureBrokerThread) -> None:
    c = sasl.connect("REAUTH")
    response = plain_login(c, "alice", "alice-secret")
    assert response.error_code == 0 and response.session_lifetime_ms == 1500
    time.sleep(1.0)
    response = plain_login(c, "alice", "alice-secret")  # re-authentication on the same connection
    assert response.error_code == 0 and response.session_lifetime_ms == 1500
    time.sleep(1.0)  # past the first session's end, inside the second's
    assert metadata(c).cluster_id
    c.close()


def test_expired_session_is_closed(sasl: SecureBrokerThread) -> None:
    c = sasl.connect("REAUTH")
    assert plain_login(c, "alice", "alice-secret").error_code == 0
    time.sleep(1.7)
    c.send(METADATA, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False))
    assert closed(c)


def test_reauthentication_cannot_change_principal_or_mechanism(sasl: SecureBrokerThread) -> None:
    c = sasl.connect("REAUTH")
    assert plain_login(c, "alice", "alice-secret").error_code == 0
    time.sleep(1.05)
    response = plain_login(c, "admin", "admin-secret")
    assert response.error_code == E.SASL_AUTHENTICATION_FAILED
    assert response.error_message == "Cannot change principals during re-authentication from User.alice: User.admin"
    assert closed(c)
    c = sasl.connect("REAUTH")
    assert plain_login(c, "alice", "alice-secret").error_code == 0
    time.sleep(1.05)
    assert handshake(c, "SCRAM-SHA-256").error_code == 0
    c.send(SASL_AUTHENTICATE, 2, M.SaslAuthenticateRequest(auth_bytes=b"n,,n=alice,r=abc"))
    assert closed(c)


# ----- bad input ---------------------------------------------------------------------------------
def _raw(port: int) -> socket.socket:
    return socket.create_connection(("127.0.0.1", port), timeout=10)


def _is_closed(s: socket.socket) -> bool:
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionError:
        return True


def test_bad_input_closes_only_that_connection(sasl: SecureBrokerThread) -> None:
    port = sasl.port_of("SASL_PLAINTEXT")
    bystander = sasl.connect("SASL_PLAINTEXT")
    assert plain_login(bystander, "alice", "alice-secret").error_code == 0
    # garbage before the handshake
    s = _raw(port)
    s.sendall(struct.pack(">i", 20) + os.urandom(20))
    assert _is_closed(s)
    # a request before authentication
    c = sasl.connect("SASL_PLAINTEXT")
    c.send(METADATA, 12, M.MetadataRequest(topics=[], allow_auto_topic_creation=False))
    assert closed(c)
    # garbage inside the exchange: a PLAIN token with two parts, a SCRAM token that is no message
    c = sasl.connect("SASL_PLAINTEXT")
    assert handshake(c, "PLAIN").error_code == 0
    response = authenticate(c, b"alice\x00alice-secret")
    assert response.error_code == E.SASL_AUTHENTICATION_FAILED
    assert response.error_message == "Invalid SASL/PLAIN response: expected 3 tokens, got 2"
    assert closed(c)
    c = sasl.connect("SASL_PLAINTEXT")
    assert handshake(c, "SCRAM-SHA-512").error_code == 0
    assert authenticate(c, os.urandom(64)).error_code == E.SASL_AUTHENTICATION_FAILED
    assert closed(c)
    # a bare v0 token that is garbage
    c = sasl.connect("SASL_PLAINTEXT")
    assert handshake(c, "OAUTHBEARER", version=0).error_code == 0
    c.send_frame(os.urandom(30))
    assert closed(c)
    # another request in the middle of the exchange
    c = sasl.connect("SASL_PLAINTEXT")
    assert handshake(c, "PLAIN").error_code == 0
    c.send(API_VERSIONS, 3, M.ApiVersionsRequest(client_software_name="t", client_software_version="1"))
    assert c.receive(API_VERSIONS, 3).error_code == E.ILLEGAL_SASL_STATE
    assert closed(c)
    # an oversized token (above sasl.server.max.receive.size) and a truncated frame
    s = _raw(port)
    s.sendall(struct.pack(">i", 10_000_000) + b"\x00" * 100)
    assert _is_closed(s)
    s = _raw(port)
    s.sendall(b"\x00\x00")
    s.close()
    # a TLS handshake on the SASL_PLAINTEXT port
    s = _raw(port)
    s.sendall(bytes.fromhex("160301020001"))
    assert _is_closed(s)
    # the authenticated connection did not notice
    assert metadata(bystander).cluster_id
    bystander.close()


def test_failures_are_logged_without_secrets(sasl: SecureBrokerThread, caplog: pytest.LogCaptureFixture) -> None:
    # the embedded broker logs through the logging module (broker/observability/logger.py)
    def failures() -> int:
        return sum(r.getMessage().startswith("closing connection: authentication failed") for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="broker"):
        c = sasl.connect("SASL_PLAINTEXT")
        assert handshake(c, "PLAIN").error_code == 0
        authenticate(c, b"\x00alice\x00hunter2-secret")
        assert closed(c)
        c = sasl.connect("SASL_PLAINTEXT")
        assert handshake(c, "OAUTHBEARER").error_code == 0
        authenticate(c, oauth_token(unsecured_jws("eve", -10, secret="token-secret")))
        authenticate(c, b"\x01")
        assert closed(c)
        wait_for(lambda: failures() >= 2, 5, what="two log lines")
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert "hunter2" not in text and "token-secret" not in text and "eyJ" not in text
