"""SASL pieces without a network: JAAS text, the mechanism servers, the authenticator's states."""

from __future__ import annotations

import base64

import pytest

from broker.security.sasl.authenticator import TRANSITIONS, Action, SaslAuthenticator, SaslState
from broker.security.sasl.jaas import parse_jaas
from broker.security.sasl.mechanisms import (
    AuthenticationFailed,
    InvalidToken,
    PlainServer,
    ScramServer,
    validate_unsecured_jws,
)
from broker.security.sasl.scram import SCRAM_SHA_256, credential_from_password, username_of
from broker.security.sasl.settings import SaslSettings
from protocol import frames
from protocol import messages as M
from tests.security.inprocess import PLAIN_JAAS, ScramClient, unsecured_jws


def test_jaas() -> None:
    (entry,) = parse_jaas(PLAIN_JAAS)
    assert entry.login_module == "org.apache.kafka.common.security.plain.PlainLoginModule"
    assert entry.flag == "required" and entry.options["user_alice"] == "alice-secret"
    two = parse_jaas('a.B required /* c */ x="1;2" y=word; // end\nc.D optional;')
    assert [(e.login_module, e.options) for e in two] == [("a.B", {"x": "1;2", "y": "word"}), ("c.D", {})]
    for bad, message in [("", "Login module not specified"), ("a.B", "control flag not specified"),
                         ("a.B maybe;", "Invalid login module control flag"), ("a.B required x;", "Value not specified"),
                         ('a.B required x="1"', "not terminated by semi-colon")]:
        with pytest.raises(ValueError, match=message):
            parse_jaas(bad)


def test_plain_server() -> None:
    server = PlainServer({"alice": "pw"})
    assert server.evaluate(b"alice\x00alice\x00pw") == b"" and server.complete
    assert server.authorization_id == "alice"
    for token, message in [(b"\x00alice\x00bad", "Authentication failed: Invalid username or password"),
                           (b"\x00\x00pw", "Authentication failed: username not specified"),
                           (b"bob\x00alice\x00pw", "authorization id that is different from username"),
                           (b"a\x00b\x00c\x00d", "expected 3 tokens, got 4")]:
        with pytest.raises(AuthenticationFailed) as failure:
            PlainServer({"alice": "pw"}).evaluate(token)
        assert message in (failure.value.client_message or "")


def test_scram_server_round_trip_and_escaped_names() -> None:
    credential = credential_from_password(SCRAM_SHA_256, "pw", 4096)
    server = ScramServer(SCRAM_SHA_256, {"a,b=c": credential}.get)
    client = ScramClient("sha256", "a,b=c", "pw")
    answer = server.evaluate(client.final(server.evaluate(client.first())))
    assert server.complete and server.authorization_id == "a,b=c"
    assert answer == b"v=" + base64.b64encode(client.server_signature)
    assert username_of("a=2Cb=3Dc") == "a,b=c"
    with pytest.raises(ValueError):
        username_of("a=2Xb")
    bad = ScramServer(SCRAM_SHA_256, {"u": credential}.get)
    client = ScramClient("sha256", "u", "pw")
    with pytest.raises(AuthenticationFailed) as failure:
        bad.evaluate(client.final(bad.evaluate(client.first()), proof_password="other"))
    assert failure.value.client_message is None  # the client gets Kafka's generic message


def test_unsecured_jws_rules() -> None:
    token = unsecured_jws("alice", 60, scope=["read", "write"])
    now = int(__import__("time").time() * 1000)
    principal, expiry = validate_unsecured_jws(token, {}, now)
    assert principal == "alice" and expiry > now
    with pytest.raises(InvalidToken, match="missing a required scope"):
        validate_unsecured_jws(token, {"unsecuredValidatorRequiredScope": "admin"}, now)
    with pytest.raises(InvalidToken, match="Required claim missing: user"):
        validate_unsecured_jws(token, {"unsecuredValidatorPrincipalClaimName": "user"}, now)
    with pytest.raises(InvalidToken, match="on or after the Expiration Time"):
        validate_unsecured_jws(token, {}, now + 120_000)
    with pytest.raises(InvalidToken, match="must not contain a digital signature"):
        validate_unsecured_jws(token + "sig", {}, now)
    with pytest.raises(InvalidToken, match="3 dot-separated"):
        validate_unsecured_jws("abc", {}, now)


def test_transitions_are_data_and_the_state_machine_follows_them() -> None:
    assert all(s in TRANSITIONS for s in SaslState)
    assert TRANSITIONS[SaslState.FAILED] == frozenset()
    settings = SaslSettings(mechanisms=["PLAIN"], jaas={"PLAIN": parse_jaas(PLAIN_JAAS)[0]})
    clock = [100.0]
    auth = SaslAuthenticator(settings, lambda m, u: None, lambda: clock[0], lambda: 0)

    def frame(api_key: int, version: int, request: object) -> memoryview:
        return memoryview(frames.encode_request_header(api_key, version, 1, "c") + M.encode(request, version))

    assert auth.on_frame(frame(18, 3, M.ApiVersionsRequest(client_software_name="c", client_software_version="1")))\
        .action is Action.PASS
    assert auth.state is SaslState.HANDSHAKE
    out = auth.on_frame(frame(17, 1, M.SaslHandshakeRequest(mechanism="PLAIN")))
    assert out.action is Action.RESPOND and auth.state is SaslState.AUTHENTICATE
    out = auth.on_frame(frame(36, 2, M.SaslAuthenticateRequest(auth_bytes=b"\x00alice\x00alice-secret")))
    assert out.action is Action.RESPOND and out.response.error_code == 0 and auth.authenticated
    assert auth.principal == "User:alice" and auth.receive_limit is None
    assert auth.on_frame(frame(3, 12, M.MetadataRequest(topics=[]))).action is Action.PASS
