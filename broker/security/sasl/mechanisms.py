"""SASL mechanism servers, sans-IO: each takes the client's tokens and gives its own back.

`evaluate(token) -> bytes` answers one client token (b"" when there is nothing to say) and sets
`complete` once the client is authenticated, with `authorization_id` (the user name) and, for
OAUTHBEARER, `lifetime_ms` (the token's expiry, which bounds the session, KIP-368). A failure
raises `AuthenticationFailed`: its `client_message` is what the client is told (Kafka's own
text; a generic one where Kafka hides the reason, such as whether the user exists) and its
`reason` what the broker logs. Neither ever holds a password, a token or a key.

PLAIN checks `user_<name>` passwords of the listener's JAAS entry (PlainServerCallbackHandler);
SCRAM-SHA-256/512 the salted credentials of the metadata log (ScramSaslServer); OAUTHBEARER
validates unsecured JWS tokens as Kafka's default OAuthBearerUnsecuredValidatorCallbackHandler
(alg "none", no signature; the principal, scope, iat and exp claims), for test setups.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
import secrets
from collections.abc import Callable, Mapping
from typing import Any

from broker.security.sasl.scram import ScramCredential, ScramMechanism, hmac_of, username_of

PLAIN = "PLAIN"
OAUTHBEARER = "OAUTHBEARER"


class AuthenticationFailed(Exception):
    def __init__(self, reason: str, client_message: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.client_message = client_message  # None: Kafka's generic "invalid credentials" message


def generic_failure(mechanism: str, reauthenticating: bool = False) -> str:
    """What Kafka tells a client whose credentials failed, whatever the reason."""
    return "Authentication failed during %s due to invalid credentials with SASL mechanism %s" % (
        "re-authentication" if reauthenticating else "authentication", mechanism)


class MechanismServer:
    name = ""

    def __init__(self) -> None:
        self.complete = False
        self.authorization_id: str | None = None
        self.lifetime_ms: int | None = None  # when the credential expires (epoch ms), if it does

    def evaluate(self, token: bytes) -> bytes:
        raise NotImplementedError


# ---------------------------------------------------------------------------------------------
# PLAIN (RFC 4616): [authzid] NUL authcid NUL passwd


class PlainServer(MechanismServer):
    name = PLAIN

    def __init__(self, users: Mapping[str, str]) -> None:
        super().__init__()
        self.users = users

    def evaluate(self, token: bytes) -> bytes:
        if self.complete:
            raise AuthenticationFailed("unexpected token after PLAIN authentication completed")
        parts = token.decode("utf-8", "replace").split("\x00", 3)
        if len(parts) != 3:
            message = "Invalid SASL/PLAIN response: expected 3 tokens, got %d" % min(len(parts), 4)
            raise AuthenticationFailed(message, message)
        authzid, username, password = parts
        if not username:
            raise AuthenticationFailed("username not specified", "Authentication failed: username not specified")
        if not password:
            raise AuthenticationFailed("password not specified", "Authentication failed: password not specified")
        expected = self.users.get(username)
        if expected is None or not hmac.compare_digest(password.encode(), expected.encode()):
            raise AuthenticationFailed("invalid username or password for user %s" % username,
                                       "Authentication failed: Invalid username or password")
        if authzid and authzid != username:
            message = "Authentication failed: Client requested an authorization id that is different from username"
            raise AuthenticationFailed(message, message)
        self.authorization_id = username
        self.complete = True
        return b""


# ---------------------------------------------------------------------------------------------
# SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, 7677), with ScramMessages' grammar

_SASLNAME = r"(?:[\x01-\x2b\x2d-\x3c\x3e-\x7f]|=2C|=3D)+"
_VALUE = r"[\x01-\x2b\x2d-\x7f]+"
_PRINTABLE = r"[\x21-\x2b\x2d-\x7e]+"
_BASE64 = r"(?:[a-zA-Z0-9/+]{4})*(?:[a-zA-Z0-9/+]{3}=|[a-zA-Z0-9/+]{2}==)?"
_EXTENSIONS = r"(?:,[A-Za-z]+=%s)*" % _VALUE
_CLIENT_FIRST = re.compile(r"n,(?:a=(?P<authzid>%s))?,(?:m=%s,)?n=(?P<saslname>%s),r=(?P<nonce>%s)(?P<extensions>%s)"
                           % (_SASLNAME, _VALUE, _SASLNAME, _PRINTABLE, _EXTENSIONS))
_CLIENT_FINAL = re.compile(r"c=(?P<channel>%s),r=(?P<nonce>%s)%s,p=(?P<proof>%s)"
                           % (_BASE64, _PRINTABLE, _EXTENSIONS, _BASE64))


class ScramServer(MechanismServer):
    def __init__(self, mechanism: ScramMechanism, credential_of: Callable[[str], ScramCredential | None],
                 server_nonce: Callable[[], str] | None = None) -> None:
        super().__init__()
        self.name = mechanism.name
        self.mechanism = mechanism
        self.credential_of = credential_of
        self.server_nonce = server_nonce or (lambda: secrets.token_urlsafe(24))
        self._first_bare = ""
        self._server_first = ""
        self._nonce = ""
        self._credential: ScramCredential | None = None

    def evaluate(self, token: bytes) -> bytes:
        try:
            message = token.decode("ascii")
        except UnicodeDecodeError:
            raise AuthenticationFailed("SCRAM message is not ASCII") from None
        if self._credential is None and not self.complete:
            return self._first(message)
        if not self.complete:
            return self._final(message)
        raise AuthenticationFailed("unexpected SCRAM message after authentication completed")

    def _first(self, message: str) -> bytes:
        m = _CLIENT_FIRST.fullmatch(message)
        if m is None:
            raise AuthenticationFailed("Invalid SCRAM client first message format")
        extensions = m.group("extensions")
        if "tokenauth=true" in extensions.lower():
            raise AuthenticationFailed("delegation tokens are not supported")
        try:
            username = username_of(m.group("saslname"))
        except ValueError:
            raise AuthenticationFailed("Authentication failed: Credentials could not be obtained") from None
        credential = self.credential_of(username)
        if credential is None:
            raise AuthenticationFailed("Authentication failed: Invalid user credentials for user %s" % username)
        authzid = m.group("authzid")
        if authzid and authzid != username:
            text = "Authentication failed: Client requested an authorization id that is different from username"
            raise AuthenticationFailed(text, text)
        if credential.iterations < self.mechanism.min_iterations:
            raise AuthenticationFailed("Iterations %d is less than the minimum %d for %s"
                                       % (credential.iterations, self.mechanism.min_iterations, self.name))
        self.authorization_id = username
        self._credential = credential
        self._first_bare = "n=%s,r=%s%s" % (m.group("saslname"), m.group("nonce"), extensions)
        self._nonce = m.group("nonce") + self.server_nonce()
        self._server_first = "r=%s,s=%s,i=%d" % (self._nonce, base64.b64encode(credential.salt).decode(),
                                                  credential.iterations)
        return self._server_first.encode()

    def _final(self, message: str) -> bytes:
        credential = self._credential
        assert credential is not None
        self._credential = None  # one final message: any further token fails
        m = _CLIENT_FINAL.fullmatch(message)
        if m is None:
            raise AuthenticationFailed("Invalid SCRAM client final message format")
        if not m.group("nonce").endswith(self._nonce):
            raise AuthenticationFailed("Invalid client nonce in the final client message.")
        without_proof = "c=%s,r=%s" % (m.group("channel"), m.group("nonce"))
        auth_message = ("%s,%s,%s" % (self._first_bare, self._server_first, without_proof)).encode()
        proof = base64.b64decode(m.group("proof"))
        signature = hmac_of(self.mechanism, credential.stored_key, auth_message)
        if len(proof) != len(signature):
            raise AuthenticationFailed("Invalid client credentials")
        client_key = bytes(a ^ b for a, b in zip(signature, proof))
        if not hmac.compare_digest(hashlib.new(self.mechanism.hash_name, client_key).digest(), credential.stored_key):
            raise AuthenticationFailed("Invalid client credentials for user %s" % self.authorization_id)
        self.complete = True
        server_signature = hmac_of(self.mechanism, credential.server_key, auth_message)
        return b"v=" + base64.b64encode(server_signature)


# ---------------------------------------------------------------------------------------------
# OAUTHBEARER (RFC 7628) with unsecured JWS tokens

_KVPAIRS = r"(?:[A-Za-z]+=[\x21-\x7e \t\r\n]+\x01)*"
_OAUTH_FIRST = re.compile(r"n,(?:a=(?P<authzid>%s))?,\x01(?P<kvpairs>%s)\x01" % (_SASLNAME, _KVPAIRS))
_AUTH = re.compile(r"(?P<scheme>\w+) +(?P<token>[-_~+/.a-zA-Z0-9]+=*)")


class InvalidToken(Exception):
    def __init__(self, reason: str, scope: str | None = None) -> None:
        super().__init__(reason)
        self.scope = scope


def _b64_json(part: str) -> dict[str, Any]:
    try:
        data = base64.urlsafe_b64decode(part.replace("+", "-").replace("/", "_") + "=" * (-len(part) % 4))
    except (binascii.Error, ValueError):
        raise InvalidToken("malformed Base64 URL encoded value") from None
    try:
        value = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        raise InvalidToken("malformed JSON") from None
    if not isinstance(value, dict):
        raise InvalidToken("malformed JSON")
    return value


def _number(claims: dict[str, Any], name: str) -> float | None:
    value = claims.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidToken("The '%s' claim was not of type Number: %s" % (name, type(value).__name__))
    return float(value)


def validate_unsecured_jws(token: str, options: Mapping[str, str], now_ms: int) -> tuple[str, int]:
    """(principal, expiry in epoch ms) of a valid unsecured JWS; InvalidToken otherwise."""
    principal_claim = (options.get("unsecuredValidatorPrincipalClaimName") or "").strip() or "sub"
    scope_claim = (options.get("unsecuredValidatorScopeClaimName") or "").strip() or "scope"
    required_scope = (options.get("unsecuredValidatorRequiredScope") or "").split()
    skew_text = (options.get("unsecuredValidatorAllowableClockSkewMs") or "").strip()
    skew = int(skew_text) if skew_text else 0
    if ".." in token:
        raise InvalidToken("Malformed compact serialization contains '..'")
    parts = token.split(".")
    if len(parts) != 3:
        raise InvalidToken("Unsecured JWS compact serializations must have 3 dot-separated Base64URL-encoded values")
    header, claims = _b64_json(parts[0]), _b64_json(parts[1])
    if str(header.get("alg")) != "none":
        raise InvalidToken("Unsecured JWS must have 'none' for an algorithm")
    if parts[2]:
        raise InvalidToken("Unsecured JWS must not contain a digital signature")
    scope_value = claims.get(scope_claim)
    if isinstance(scope_value, str):
        scope = {scope_value.strip()} if scope_value.strip() else set()
    elif isinstance(scope_value, list):
        scope = {str(s).strip() for s in scope_value if str(s).strip()}
    else:
        scope = set()
    exp = _number(claims, "exp")
    if exp is None:
        raise InvalidToken("No expiration time in JWT")
    principal = claims.get(principal_claim)
    if principal is None:
        raise InvalidToken("Required claim missing: %s" % principal_claim)
    if not isinstance(principal, str):
        raise InvalidToken("The %s claim had the incorrect type: %s" % (principal_claim, type(principal).__name__))
    if not principal.strip():
        raise InvalidToken("No principal name in JWT claim: %s" % principal_claim)
    iat = _number(claims, "iat")
    if iat is not None and 1000 * iat > now_ms + skew:
        raise InvalidToken("The Issued At value (%f seconds) was after the indicated time (%d ms) plus allowable clock "
                           "skew (%d ms)" % (iat, now_ms, skew))
    if now_ms - skew >= 1000 * exp:
        raise InvalidToken("The indicated time (%d ms) minus allowable clock skew (%d ms) was on or after the "
                           "Expiration Time value (%f seconds)" % (now_ms, skew, exp))
    if iat is not None and exp <= iat:
        raise InvalidToken("The Expiration Time time (%f seconds) was not after the Issued At time (%f seconds)"
                           % (exp, iat))
    for element in required_scope:
        if element not in scope:
            raise InvalidToken("The provided scope (%s) was missing a required scope (%s).  All required scope "
                               "elements: %s" % (sorted(scope), element, required_scope), str(required_scope))
    return principal, round(exp * 1000)


class OAuthBearerServer(MechanismServer):
    name = OAUTHBEARER

    def __init__(self, options: Mapping[str, str], now_ms: Callable[[], int]) -> None:
        super().__init__()
        self.options = options
        self.now_ms = now_ms
        self._error: str | None = None  # the JSON error sent as a challenge; the client's \x01 ends the exchange
        self._reason = ""  # why the token was refused (logged)

    def evaluate(self, token: bytes) -> bytes:
        if token == b"\x01" and self._error is not None:
            raise AuthenticationFailed("invalid OAUTHBEARER token: %s" % self._reason, self._error)
        self._error = None
        m = _OAUTH_FIRST.fullmatch(token.decode("utf-8", "replace"))
        if m is None:
            raise AuthenticationFailed("Invalid OAUTHBEARER client first message")
        pairs = dict(p.split("=", 1) for p in m.group("kvpairs").split("\x01") if p)
        auth = pairs.get("auth")
        if auth is None:
            raise AuthenticationFailed("Invalid OAUTHBEARER client first message: 'auth' not specified")
        bearer = _AUTH.fullmatch(auth)
        if bearer is None:
            raise AuthenticationFailed("Invalid OAUTHBEARER client first message: invalid 'auth' format")
        if bearer.group("scheme").lower() != "bearer":
            raise AuthenticationFailed("Invalid scheme in OAUTHBEARER client first message")
        try:
            principal, expiry_ms = validate_unsecured_jws(bearer.group("token"), self.options, self.now_ms())
        except InvalidToken as exc:
            error = '{"status":"%s"' % ("insufficient_scope" if exc.scope is not None else "invalid_token")
            if exc.scope is not None:
                error += ', "scope":"%s"' % exc.scope
            self._error = error + "}"
            self._reason = str(exc)
            return self._error.encode()
        authzid = m.group("authzid")
        if authzid and authzid != principal:
            text = ("Authentication failed: Client requested an authorization id (%s) that is different from the "
                    "token's principal name (%s)" % (authzid, principal))
            raise AuthenticationFailed(text, text)
        self.authorization_id = principal
        self.lifetime_ms = expiry_ms
        self.complete = True
        return b""
