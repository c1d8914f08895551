"""The client side of SASL (broker/security/sasl/client.py) against the broker's own server side
(the SaslAuthenticator), frames encoded and decoded as on a connection, without a network."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from broker.security.errors import AuthenticationError
from broker.security.sasl.authenticator import Action, SaslAuthenticator
from broker.security.sasl.client import (
    TRANSITIONS,
    ExchangeState,
    OAuthBearerClient,
    PlainClient,
    SaslExchange,
    ScramClient,
    mechanism_client,
    unsecured_token,
)
from broker.security.sasl.jaas import parse_jaas
from broker.security.sasl.scram import SCRAM_SHA_256, SCRAM_SHA_512, ScramCredential, credential_from_password
from broker.security.sasl.settings import SaslSettings
from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode
from tests.security.inprocess import PLAIN_JAAS

API_VERSIONS = 18
OFFERED = {17: 1, 36: 2, 3: 12}  # what the server's ApiVersions lists (SaslHandshake, SaslAuthenticate, ...)


class Server:
    """A connection's server side: the authenticator, and ApiVersions answered as the broker does."""

    def __init__(self, mechanisms: list[str], credentials: dict[tuple[str, str], ScramCredential] | None = None,
                 reauth_ms: int = 0, offered: dict[int, int] | None = None) -> None:
        self.clock = 100.0
        entry = parse_jaas(PLAIN_JAAS)[0]
        settings = SaslSettings(mechanisms, jaas={"PLAIN": entry}, reauth_ms={m: reauth_ms for m in mechanisms})
        self.credentials = credentials or {}
        self.sasl = SaslAuthenticator(settings, lambda m, u: self.credentials.get((m, u)), lambda: self.clock,
                                      lambda: int(self.clock * 1000))
        self.offered = OFFERED if offered is None else offered
        self.seen: list[int] = []  # api keys received
        self.correlation_id = 0

    def answer(self, request: tuple[int, int, Any]) -> Any:
        key, version, message = request
        self.seen.append(key)
        self.correlation_id += 1
        frame = frames.encode_request_header(key, version, self.correlation_id, "broker-1") + M.encode(message, version)
        outcome = self.sasl.on_frame(memoryview(bytes(frame)))
        if outcome.action is Action.PASS:
            assert key == API_VERSIONS and version == 0
            A = M.ApiVersionsResponse
            response = A(error_code=0, api_keys=[A.ApiVersion(api_key=k, min_version=0, max_version=v)
                                                 for k, v in self.offered.items()])
        else:
            assert outcome.action in (Action.RESPOND, Action.FAIL), outcome
            assert outcome.response is not None, outcome.reason
            response = outcome.response
        return M.decode_response(key, version, memoryview(bytes(M.encode(response, version))))


def run(exchange: SaslExchange, server: Server) -> None:
    request = exchange.start()
    while request is not None:
        request = exchange.receive(server.answer(request))


def test_transitions_are_data() -> None:
    assert set(TRANSITIONS) == set(ExchangeState)
    assert not TRANSITIONS[ExchangeState.COMPLETE] and not TRANSITIONS[ExchangeState.FAILED]


def test_plain() -> None:
    server = Server(["PLAIN", "SCRAM-SHA-256"])
    exchange = SaslExchange(PlainClient("admin", "admin-secret"))
    run(exchange, server)
    assert exchange.complete and server.sasl.authenticated and server.sasl.principal == "User:admin"
    assert server.seen == [18, 17, 36]  # ApiVersions v0, SaslHandshake, one SaslAuthenticate
    assert exchange.versions == (1, 2) and exchange.reauthenticate_after is None


def test_plain_wrong_password_is_kafkas_message() -> None:
    exchange = SaslExchange(PlainClient("admin", "nope"))
    with pytest.raises(AuthenticationError) as failure:
        run(exchange, Server(["PLAIN"]))
    assert str(failure.value) == "Authentication failed: Invalid username or password"
    assert failure.value.code is ErrorCode.SASL_AUTHENTICATION_FAILED
    assert exchange.state is ExchangeState.FAILED


def test_mechanism_not_enabled() -> None:
    with pytest.raises(AuthenticationError) as failure:
        run(SaslExchange(PlainClient("admin", "admin-secret")), Server(["SCRAM-SHA-512"]))
    assert str(failure.value) == ("Client SASL mechanism 'PLAIN' not enabled in the server, enabled mechanisms are "
                                  "['SCRAM-SHA-512']")
    assert failure.value.code is ErrorCode.UNSUPPORTED_SASL_MECHANISM


def test_a_listener_without_sasl() -> None:
    with pytest.raises(AuthenticationError, match="does not offer SaslHandshake"):
        exchange = SaslExchange(PlainClient("admin", "admin-secret"))
        exchange.receive(Server(["PLAIN"], offered={3: 12}).answer(exchange.start()))


@pytest.mark.parametrize("mechanism", [SCRAM_SHA_256, SCRAM_SHA_512])
def test_scram(mechanism: Any) -> None:
    user = "broker,1=a"  # escaped on the wire (=2C, =3D)
    server = Server([mechanism.name], {(mechanism.name, user): credential_from_password(mechanism, "pw", 4096)})
    exchange = SaslExchange(ScramClient(mechanism, user, "pw"))
    run(exchange, server)
    assert exchange.complete and server.sasl.principal == "User:" + user
    assert server.seen == [18, 17, 36, 36]


def test_scram_failures() -> None:
    name = SCRAM_SHA_512.name
    credential = credential_from_password(SCRAM_SHA_512, "pw", 4096)
    for user, password in [("unknown", "pw"), ("alice", "wrong")]:
        with pytest.raises(AuthenticationError) as failure:
            run(SaslExchange(ScramClient(SCRAM_SHA_512, user, password)), Server([name], {(name, "alice"): credential}))
        assert str(failure.value) == "Authentication failed during authentication due to invalid credentials with SASL mechanism " \
               "SCRAM-SHA-512"


def test_scram_client_checks_the_server() -> None:
    client = ScramClient(SCRAM_SHA_256, "alice", "pw", nonce=lambda: "abc")
    first = client.initial()
    assert first == b"n,,n=alice,r=abc"
    with pytest.raises(AuthenticationError, match="does not start with client nonce"):
        ScramClient(SCRAM_SHA_256, "alice", "pw", nonce=lambda: "abc").evaluate(b"r=xyz,s=c2FsdA==,i=4096")
    with pytest.raises(AuthenticationError, match="less than the minimum 4096"):
        client.evaluate(b"r=abcdef,s=c2FsdA==,i=1000")
    final = ScramClient(SCRAM_SHA_256, "alice", "pw", nonce=lambda: "abc")
    final.initial()
    assert final.evaluate(b"r=abcdef,s=c2FsdA==,i=4096") is not None
    with pytest.raises(AuthenticationError, match="Invalid server signature"):
        final.evaluate(b"v=" + base64.b64encode(b"x" * 32))
    errored = ScramClient(SCRAM_SHA_256, "alice", "pw", nonce=lambda: "abc")
    errored.initial()
    errored.evaluate(b"r=abcdef,s=c2FsdA==,i=4096")
    with pytest.raises(AuthenticationError, match="failed with error: invalid-proof"):
        errored.evaluate(b"e=invalid-proof")


def _claims(token: str) -> dict[str, Any]:
    part = token.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))  # type: ignore[no-any-return]


def test_oauthbearer_unsecured_login() -> None:
    options = {"unsecuredLoginStringClaim_sub": "broker", "unsecuredLoginLifetimeSeconds": "60",
               "unsecuredLoginListClaim_scope": "|a|b", "unsecuredLoginNumberClaim_n": "7"}
    token = unsecured_token(options, 1_000_000)
    assert token.endswith(".") and _claims(token) == {"iat": 1000.0, "exp": 1060.0, "sub": "broker",
                                                      "scope": ["a", "b"], "n": 7}
    server = Server(["OAUTHBEARER"])
    exchange = SaslExchange(OAuthBearerClient(options, now_ms=lambda: int(server.clock * 1000)))
    run(exchange, server)
    assert exchange.complete and server.sasl.principal == "User:broker"
    # the token's expiry bounds the session: re-authenticate at 85-95% of it
    after = exchange.reauthenticate_after
    assert after is not None and 0.85 * 60 - 1 <= after <= 0.95 * 60
    with pytest.raises(AuthenticationError, match="needs a principal"):
        unsecured_token({}, 0)


def test_oauthbearer_refused_scope_ends_with_the_servers_error() -> None:
    server = Server(["OAUTHBEARER"])
    server.sasl.settings.jaas["OAUTHBEARER"] = parse_jaas(
        'org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required '
        'unsecuredValidatorRequiredScope="admin";')[0]
    with pytest.raises(AuthenticationError):
        run(SaslExchange(OAuthBearerClient({"unsecuredLoginStringClaim_sub": "broker"},
                                           now_ms=lambda: int(server.clock * 1000))), server)
    assert server.seen == [18, 17, 36, 36]  # the token, then %x01 after the server's error


def test_reauthentication_on_the_same_connection() -> None:
    server = Server(["PLAIN"], reauth_ms=10_000)
    first = SaslExchange(PlainClient("admin", "admin-secret"), rng=lambda: 0.5)
    run(first, server)
    assert first.session_lifetime_ms == 10_000 and first.reauthenticate_after == pytest.approx(9.0)
    server.clock += 9.0
    server.seen.clear()
    again = SaslExchange(PlainClient("admin", "admin-secret"), first.versions)
    run(again, server)
    assert again.complete and server.seen == [17, 36]  # no ApiVersions the second time
    assert server.sasl.authenticated and server.sasl.principal == "User:admin"


def test_mechanism_client_from_jaas_options() -> None:
    assert isinstance(mechanism_client("PLAIN", {"username": "a", "password": "b"}), PlainClient)
    scram = mechanism_client("SCRAM-SHA-512", {"username": "a", "password": "b"})
    assert isinstance(scram, ScramClient) and scram.mechanism is SCRAM_SHA_512
    with pytest.raises(AuthenticationError, match="No username and password"):
        mechanism_client("PLAIN", {"username": "a"})
    with pytest.raises(AuthenticationError, match="has no client"):
        mechanism_client("GSSAPI", {"username": "a", "password": "b"})
