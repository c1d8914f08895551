"""The client side of SASL, sans-IO: what a broker sends to authenticate with another broker.

Modelled on Kafka's SaslClientAuthenticator. `SaslExchange` yields the requests to send and takes
the responses back, and nothing else: the caller owns the connection, the framing and the
correlation ids. An exchange is ApiVersions v0 (to learn which SaslHandshake and SaslAuthenticate
versions the server takes), SaslHandshake naming the mechanism, then SaslAuthenticate requests
carrying the mechanism's tokens until both sides are complete. A re-authentication (KIP-368) is
the same exchange on the same connection without ApiVersions, with the versions learnt the first
time; the server's session lifetime says when one is due (Kafka's client re-authenticates at a
random 85-95% of it).

Mechanism clients (`MechanismClient`): PLAIN (RFC 4616, no authorization id, as the JDK's client
sends it), SCRAM-SHA-256/512 (RFC 5802 without channel binding, Kafka's ScramSaslClient) and
OAUTHBEARER with an unsecured JWS made from the JAAS options as Kafka's
OAuthBearerUnsecuredLoginCallbackHandler makes it (for test setups, as on the server side).
Errors raise `AuthenticationError` with the text Kafka's client would report; none holds a
password, a key or a token.
"""

from __future__ import annotations

import base64
import enum
import hashlib
import hmac
import json
import random
import secrets
import time
from collections.abc import Callable, Mapping
from typing import Any

from broker.security.errors import AuthenticationError
from broker.security.sasl.mechanisms import OAUTHBEARER, PLAIN
from broker.security.sasl.scram import MECHANISMS as SCRAM_MECHANISMS
from broker.security.sasl.scram import ScramMechanism, hmac_of, salted_password
from protocol import messages as M
from protocol.errors import ErrorCode

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
HANDSHAKE_MAX = max(M.REQUESTS[SASL_HANDSHAKE].spec.valid_versions)
AUTHENTICATE_MAX = max(M.REQUESTS[SASL_AUTHENTICATE].spec.valid_versions)
REAUTH_WINDOW = (0.85, 0.95)  # of the session lifetime, when Kafka's client re-authenticates

Request = tuple[int, int, Any]  # (api key, version, request message)
__all__ = ["AuthenticationError", "SaslExchange", "mechanism_client", "PlainClient", "ScramClient",
           "OAuthBearerClient", "unsecured_token"]


# ---------------------------------------------------------------------------------------------
# mechanisms


class MechanismClient:
    """One mechanism's side of one exchange: `initial()` is the first token, `evaluate(challenge)`
    answers each server token (None: nothing more to send); `complete` once the server is trusted."""

    name = ""

    def __init__(self) -> None:
        self.complete = False

    def initial(self) -> bytes:
        raise NotImplementedError

    def evaluate(self, challenge: bytes) -> bytes | None:
        raise NotImplementedError


class PlainClient(MechanismClient):
    name = PLAIN

    def __init__(self, username: str, password: str) -> None:
        super().__init__()
        self.username = username
        self.password = password

    def initial(self) -> bytes:
        self.complete = True  # PLAIN has nothing to check of the server's answer
        return b"\x00" + self.username.encode() + b"\x00" + self.password.encode()

    def evaluate(self, challenge: bytes) -> bytes | None:
        return None


def _sasl_name(username: str) -> str:
    return username.replace("=", "=3D").replace(",", "=2C")


class ScramClient(MechanismClient):
    """client-first -> server-first -> client-final -> server-final (its signature checked)."""

    def __init__(self, mechanism: ScramMechanism, username: str, password: str,
                 nonce: Callable[[], str] | None = None) -> None:
        super().__init__()
        self.name = mechanism.name
        self.mechanism = mechanism
        self.username = username
        self.password = password
        self.nonce = (nonce or (lambda: secrets.token_urlsafe(24)))()
        self._first_bare = ""
        self._server_signature: bytes | None = None

    def initial(self) -> bytes:
        self._first_bare = "n=%s,r=%s" % (_sasl_name(self.username), self.nonce)
        return ("n,," + self._first_bare).encode()

    def evaluate(self, challenge: bytes) -> bytes | None:
        text = challenge.decode("ascii", "replace")
        if self._server_signature is None:
            return self._final(text)
        self._check_server_final(text)
        return None

    def _final(self, server_first: str) -> bytes:
        fields = _scram_fields(server_first)
        nonce, salt, iterations = fields.get("r", ""), fields.get("s"), fields.get("i", "")
        if salt is None or not nonce or not iterations.isdigit():
            raise AuthenticationError("Invalid SCRAM server first message format")
        if not nonce.startswith(self.nonce):
            raise AuthenticationError("Invalid server nonce: does not start with client nonce")
        if int(iterations) < self.mechanism.min_iterations:
            raise AuthenticationError("Requested iterations %s is less than the minimum %d for %s"
                                      % (iterations, self.mechanism.min_iterations, self.name))
        try:
            salt_bytes = base64.b64decode(salt, validate=True)
        except ValueError:
            raise AuthenticationError("Invalid SCRAM server first message format") from None
        salted = salted_password(self.mechanism, self.password, salt_bytes, int(iterations))
        without_proof = "c=%s,r=%s" % (base64.b64encode(b"n,,").decode(), nonce)
        auth_message = ("%s,%s,%s" % (self._first_bare, server_first, without_proof)).encode()
        client_key = hmac_of(self.mechanism, salted, b"Client Key")
        stored_key = hashlib.new(self.mechanism.hash_name, client_key).digest()
        signature = hmac_of(self.mechanism, stored_key, auth_message)
        proof = bytes(a ^ b for a, b in zip(client_key, signature))
        server_key = hmac_of(self.mechanism, salted, b"Server Key")
        self._server_signature = hmac_of(self.mechanism, server_key, auth_message)
        return ("%s,p=%s" % (without_proof, base64.b64encode(proof).decode())).encode()

    def _check_server_final(self, server_final: str) -> None:
        if self.complete:
            raise AuthenticationError("Unexpected SCRAM message after authentication completed")
        fields = _scram_fields(server_final)
        if "e" in fields:
            raise AuthenticationError("Sasl authentication using %s failed with error: %s" % (self.name, fields["e"]))
        assert self._server_signature is not None
        try:
            signature = base64.b64decode(fields.get("v", ""), validate=True)
        except ValueError:
            signature = b""
        if not hmac.compare_digest(signature, self._server_signature):
            raise AuthenticationError("Invalid server signature in server final message")
        self.complete = True


def _scram_fields(message: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if sep and len(key) == 1:
            out.setdefault(key, value)
    return out


class OAuthBearerClient(MechanismClient):
    """An unsecured JWS (alg none) with the JAAS entry's unsecuredLogin* claims; a refused token
    gets the server's error as a challenge, answered with %x01 as RFC 7628 asks."""

    name = OAUTHBEARER

    def __init__(self, options: Mapping[str, str], now_ms: Callable[[], int] | None = None) -> None:
        super().__init__()
        self.token = unsecured_token(options, (now_ms or (lambda: int(time.time() * 1000)))())
        self._refused = False

    def initial(self) -> bytes:
        return b"n,,\x01auth=Bearer " + self.token.encode() + b"\x01\x01"

    def evaluate(self, challenge: bytes) -> bytes | None:
        if not challenge:
            self.complete = True
            return None
        if self._refused:
            raise AuthenticationError("Unexpected OAUTHBEARER server message after an error")
        self._refused = True  # the server's JSON error; it fails the exchange after our %x01
        return b"\x01"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def unsecured_token(options: Mapping[str, str], now_ms: int) -> str:
    """Kafka's OAuthBearerUnsecuredLoginCallbackHandler token: iat, exp (now + LifetimeSeconds,
    default 3600), and the StringClaim_, NumberClaim_ and ListClaim_ options (a list's first
    character separates its values); the principal claim (PrincipalClaimName, default sub) is
    required."""
    principal_claim = (options.get("unsecuredLoginPrincipalClaimName") or "").strip() or "sub"
    lifetime_text = (options.get("unsecuredLoginLifetimeSeconds") or "").strip() or "3600"
    try:
        lifetime = int(lifetime_text)
    except ValueError:
        raise AuthenticationError("Invalid unsecuredLoginLifetimeSeconds: %s" % lifetime_text) from None
    claims: dict[str, Any] = {"iat": now_ms / 1000.0, "exp": now_ms / 1000.0 + lifetime}
    for key, value in options.items():
        for prefix, kind in (("unsecuredLoginStringClaim_", str), ("unsecuredLoginNumberClaim_", float),
                             ("unsecuredLoginListClaim_", list)):
            if not key.startswith(prefix):
                continue
            name = key[len(prefix):]
            if name in ("iat", "exp"):
                raise AuthenticationError("Cannot set the %s claim of an unsecured token" % name)
            if kind is str:
                claims[name] = value
            elif kind is float:
                try:
                    claims[name] = int(value) if value.strip().lstrip("-").isdigit() else float(value)
                except ValueError:
                    raise AuthenticationError("Invalid number for claim %s" % name) from None
            else:
                claims[name] = [v for v in value[1:].split(value[0])] if value else []
    principal = claims.get(principal_claim)
    if not isinstance(principal, str) or not principal.strip():
        raise AuthenticationError("The unsecured token needs a principal: set unsecuredLoginStringClaim_%s in the "
                                  "OAUTHBEARER JAAS entry" % principal_claim)
    header = _b64url(json.dumps({"alg": "none"}, separators=(",", ":")).encode())
    return "%s.%s." % (header, _b64url(json.dumps(claims, separators=(",", ":")).encode()))


def mechanism_client(mechanism: str, options: Mapping[str, str]) -> MechanismClient:
    """A fresh client of `mechanism` with the credentials of a JAAS entry's options (each
    exchange takes a new one: a new nonce, a new token)."""
    if mechanism == OAUTHBEARER:
        return OAuthBearerClient(options)
    username, password = options.get("username"), options.get("password")
    if username is None or password is None:
        raise AuthenticationError("No username and password for %s" % mechanism)
    if mechanism == PLAIN:
        return PlainClient(username, password)
    scram = SCRAM_MECHANISMS.get(mechanism)
    if scram is None:
        raise AuthenticationError("SASL mechanism %s has no client here" % mechanism, ErrorCode.UNSUPPORTED_SASL_MECHANISM)
    return ScramClient(scram, username, password)


# ---------------------------------------------------------------------------------------------
# the exchange


class ExchangeState(enum.Enum):
    SEND_APIVERSIONS = "SEND_APIVERSIONS_REQUEST"
    RECEIVE_APIVERSIONS = "RECEIVE_APIVERSIONS_RESPONSE"
    SEND_HANDSHAKE = "SEND_HANDSHAKE_REQUEST"  # a re-authentication starts here
    RECEIVE_HANDSHAKE = "RECEIVE_HANDSHAKE_RESPONSE"
    INTERMEDIATE = "INTERMEDIATE"  # SaslAuthenticate requests and responses
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


X = ExchangeState
TRANSITIONS: dict[ExchangeState, frozenset[ExchangeState]] = {
    X.SEND_APIVERSIONS: frozenset({X.RECEIVE_APIVERSIONS}),
    X.RECEIVE_APIVERSIONS: frozenset({X.RECEIVE_HANDSHAKE, X.FAILED}),
    X.SEND_HANDSHAKE: frozenset({X.RECEIVE_HANDSHAKE}),
    X.RECEIVE_HANDSHAKE: frozenset({X.INTERMEDIATE, X.FAILED}),
    X.INTERMEDIATE: frozenset({X.INTERMEDIATE, X.COMPLETE, X.FAILED}),
    X.COMPLETE: frozenset(),
    X.FAILED: frozenset(),
}


class SaslExchange:
    """One authentication (or re-authentication) of a connection.

        exchange = SaslExchange(mechanism_client("PLAIN", options))
        request = exchange.start()
        while request is not None:
            request = exchange.receive(<the response to request>)
        # exchange.complete; exchange.reauthenticate_after: seconds, or None

    `versions` (SaslHandshake, SaslAuthenticate) come from a previous exchange of the same
    connection: given, this one is a re-authentication and sends no ApiVersions."""

    def __init__(self, mechanism: MechanismClient, versions: tuple[int, int] | None = None,
                 rng: Callable[[], float] = random.random) -> None:
        self.mechanism = mechanism
        self.rng = rng
        self.state = X.SEND_APIVERSIONS if versions is None else X.SEND_HANDSHAKE
        handshake, authenticate = versions or (HANDSHAKE_MAX, AUTHENTICATE_MAX)
        self.handshake_version: int = handshake
        self.authenticate_version: int = authenticate
        self.session_lifetime_ms = 0  # from the server's last SaslAuthenticate response (0: no limit)

    def _move(self, to: ExchangeState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise AssertionError("SASL client state %s cannot go to %s" % (self.state.name, to.name))
        self.state = to

    @property
    def complete(self) -> bool:
        return self.state is X.COMPLETE

    @property
    def versions(self) -> tuple[int, int]:
        return self.handshake_version, self.authenticate_version

    @property
    def reauthenticate_after(self) -> float | None:
        """Seconds from completion until a re-authentication is due (None: never)."""
        if self.session_lifetime_ms <= 0:
            return None
        low, high = REAUTH_WINDOW
        return self.session_lifetime_ms / 1000.0 * (low + (high - low) * self.rng())

    def start(self) -> Request:
        if self.state is X.SEND_APIVERSIONS:
            # v0, as Kafka's client: any broker can read it before authentication
            self._move(X.RECEIVE_APIVERSIONS)
            return API_VERSIONS, 0, M.ApiVersionsRequest()
        self._move(X.RECEIVE_HANDSHAKE)
        return self._handshake()

    def _handshake(self) -> Request:
        return SASL_HANDSHAKE, self.handshake_version, M.SaslHandshakeRequest(mechanism=self.mechanism.name)

    def _authenticate(self, token: bytes) -> Request:
        return SASL_AUTHENTICATE, self.authenticate_version, M.SaslAuthenticateRequest(auth_bytes=token)

    def _fail(self, error: AuthenticationError) -> AuthenticationError:
        self.state = X.FAILED if self.state is not X.FAILED else self.state
        return error

    def receive(self, response: Any) -> Request | None:
        """The next request to send, or None once authenticated; AuthenticationError if refused."""
        state = self.state
        try:
            if state is X.RECEIVE_APIVERSIONS:
                return self._on_api_versions(response)
            if state is X.RECEIVE_HANDSHAKE:
                return self._on_handshake(response)
            if state is X.INTERMEDIATE:
                return self._on_authenticate(response)
        except AuthenticationError as exc:
            raise self._fail(exc) from None
        raise AssertionError("no response is expected in SASL client state %s" % state.name)

    def _on_api_versions(self, response: Any) -> Request:
        if response.error_code:
            raise AuthenticationError("ApiVersions failed before SASL authentication: error %d"
                                      % response.error_code, ErrorCode.ILLEGAL_SASL_STATE)
        ranges = {k.api_key: k.max_version for k in response.api_keys}
        if SASL_HANDSHAKE not in ranges:
            raise AuthenticationError("The server does not offer SaslHandshake: is the listener a SASL listener?",
                                      ErrorCode.ILLEGAL_SASL_STATE)
        self.handshake_version = min(ranges[SASL_HANDSHAKE], HANDSHAKE_MAX)
        self.authenticate_version = min(ranges.get(SASL_AUTHENTICATE, 0), AUTHENTICATE_MAX)
        if self.handshake_version < 1 or SASL_AUTHENTICATE not in ranges:
            raise AuthenticationError("The server takes only SaslHandshake v0 (bare tokens), which this client "
                                      "does not send", ErrorCode.ILLEGAL_SASL_STATE)
        self._move(X.RECEIVE_HANDSHAKE)
        return self._handshake()

    def _on_handshake(self, response: Any) -> Request:
        code = response.error_code
        name = self.mechanism.name
        if code == ErrorCode.UNSUPPORTED_SASL_MECHANISM:
            raise AuthenticationError("Client SASL mechanism '%s' not enabled in the server, enabled mechanisms are %s"
                                      % (name, list(response.mechanisms)), ErrorCode.UNSUPPORTED_SASL_MECHANISM)
        if code == ErrorCode.ILLEGAL_SASL_STATE:
            raise AuthenticationError("Unexpected handshake request with client mechanism %s, enabled mechanisms are %s"
                                      % (name, list(response.mechanisms)), ErrorCode.ILLEGAL_SASL_STATE)
        if code:
            raise AuthenticationError("Unknown error code %d, client mechanism is %s, enabled mechanisms are %s"
                                      % (code, name, list(response.mechanisms)), ErrorCode.ILLEGAL_SASL_STATE)
        self._move(X.INTERMEDIATE)
        return self._authenticate(self.mechanism.initial())

    def _on_authenticate(self, response: Any) -> Request | None:
        if response.error_code:
            raise AuthenticationError(response.error_message or "SASL authentication failed (error %d)"
                                      % response.error_code, ErrorCode(response.error_code))  # type: ignore[call-arg]
        self.session_lifetime_ms = int(getattr(response, "session_lifetime_ms", 0) or 0)
        token = bytes(response.auth_bytes or b"")
        answer = None if self.mechanism.complete else self.mechanism.evaluate(token)
        if answer is not None:
            return self._authenticate(answer)
        if not self.mechanism.complete:
            raise AuthenticationError("The %s exchange ended before the client could check the server"
                                      % self.mechanism.name, ErrorCode.ILLEGAL_SASL_STATE)
        self._move(X.COMPLETE)
        return None
