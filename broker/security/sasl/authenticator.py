"""The SASL side of one connection, sans-IO: frames in, what to do with them out.

Modelled on Kafka's SaslServerAuthenticator. The server hands every frame of a SASL connection
to `on_frame` before its request path; the answer says what to do:

  PASS      an ordinary request (the client is authenticated, or it is the first ApiVersions):
            the server handles it as usual
  RESPOND   send `response` (a SaslHandshake or SaslAuthenticate response) for `header`
  RAW       send `raw` as a bare size-prefixed token (SaslHandshake v0 clients)
  FAIL      authentication failed: after connection.failed.authentication.delay.ms send
            `response` (if any; `error` asks for the request's own error response), then close
  CLOSE     close now (a malformed frame, an expired session, a protocol violation)

States and their legal transitions are data (`TRANSITIONS`); the state only moves through
`_move`. Before authentication completes only ApiVersions, SaslHandshake and SaslAuthenticate
are accepted, and frames are limited to sasl.server.max.receive.size (`receive_limit`).
Once complete, a SaslHandshake begins a re-authentication (KIP-368) when the session has a
lifetime and the last one began at least a second ago; the principal and the mechanism must
stay the same. Past its lifetime a session accepts nothing but that re-authentication.
Messages sent to the client are Kafka's; log reasons never carry a secret.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Any

from broker.security.principal import ANONYMOUS, user
from broker.security.sasl.mechanisms import (
    OAUTHBEARER,
    PLAIN,
    AuthenticationFailed,
    MechanismServer,
    OAuthBearerServer,
    PlainServer,
    ScramServer,
    generic_failure,
)
from broker.security.sasl.outcome import PASS, Action, Outcome
from broker.security.sasl.scram import MECHANISMS as SCRAM_MECHANISMS
from broker.security.sasl.scram import ScramCredential
from broker.security.sasl.settings import SaslSettings
from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode, ProtocolError

API_VERSIONS, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 17, 36
MIN_REAUTH_INTERVAL_S = 1.0
_HANDSHAKE_RANGE = M.REQUESTS[SASL_HANDSHAKE].spec.valid_versions
_AUTHENTICATE_RANGE = M.REQUESTS[SASL_AUTHENTICATE].spec.valid_versions


class SaslState(enum.Enum):
    HANDSHAKE_OR_VERSIONS = "HANDSHAKE_OR_VERSIONS_REQUEST"  # the first request
    HANDSHAKE = "HANDSHAKE_REQUEST"  # after ApiVersions
    AUTHENTICATE = "AUTHENTICATE"  # SaslAuthenticate requests (SaslHandshake v1+)
    AUTHENTICATE_RAW = "AUTHENTICATE_RAW"  # bare tokens (SaslHandshake v0)
    COMPLETE = "COMPLETE"
    REAUTH_BAD_MECHANISM = "REAUTH_BAD_MECHANISM"  # re-authentication asked for another mechanism
    FAILED = "FAILED"


S = SaslState
TRANSITIONS: dict[SaslState, frozenset[SaslState]] = {
    S.HANDSHAKE_OR_VERSIONS: frozenset({S.HANDSHAKE, S.AUTHENTICATE, S.AUTHENTICATE_RAW, S.FAILED}),
    S.HANDSHAKE: frozenset({S.AUTHENTICATE, S.AUTHENTICATE_RAW, S.FAILED}),
    S.AUTHENTICATE: frozenset({S.AUTHENTICATE, S.COMPLETE, S.FAILED}),
    S.AUTHENTICATE_RAW: frozenset({S.AUTHENTICATE_RAW, S.COMPLETE, S.FAILED}),
    S.COMPLETE: frozenset({S.AUTHENTICATE, S.REAUTH_BAD_MECHANISM, S.FAILED}),
    S.REAUTH_BAD_MECHANISM: frozenset({S.FAILED}),
    S.FAILED: frozenset(),
}


_RAW_SIZE = struct.Struct(">i")


class SaslAuthenticator:
    """One connection's authentication. `credential_of(mechanism, user)` reads SCRAM credentials,
    `now` is the clock (seconds; injected), `wall_ms` the wall clock for token expiry."""

    def __init__(self, settings: SaslSettings, credential_of: Callable[[str, str], ScramCredential | None],
                 now: Callable[[], float], wall_ms: Callable[[], int]) -> None:
        self.settings = settings
        self.credential_of = credential_of
        self.now = now
        self.wall_ms = wall_ms
        self.state = SaslState.HANDSHAKE_OR_VERSIONS
        self.mechanism: str | None = None
        self.server: MechanismServer | None = None
        self.principal = ANONYMOUS
        self.session_expires: float | None = None  # monotonic seconds; None: the session does not expire
        self.reauthenticating = False
        self.supports_reauth = False  # the client sent SaslAuthenticate v1+
        self._last_reauth_start = 0.0
        self._bad_mechanism_message = ""

    # state -------------------------------------------------------------------------------------
    def _move(self, to: SaslState) -> None:
        if to not in TRANSITIONS[self.state]:
            raise AssertionError("SASL state %s cannot go to %s" % (self.state.name, to.name))
        self.state = to

    @property
    def authenticated(self) -> bool:
        return self.state is SaslState.COMPLETE

    @property
    def receive_limit(self) -> int | None:
        """The frame size limit while authenticating (None: the connection's usual one)."""
        return None if self.state is SaslState.COMPLETE else self.settings.max_receive_size

    def _fail(self, reason: str, header: Any = None, response: Any = None, error: ErrorCode | None = None,
              request: Any = None) -> Outcome:
        self._move(SaslState.FAILED)
        return Outcome(Action.FAIL, header, response, error=error, request=request, reason=reason)

    def _close(self, reason: str) -> Outcome:
        if self.state is not SaslState.FAILED:
            self._move(SaslState.FAILED)
        return Outcome(Action.CLOSE, reason=reason)

    # frames ------------------------------------------------------------------------------------
    def on_frame(self, frame: Any) -> Outcome:
        state = self.state
        if state is SaslState.COMPLETE:
            return self._authenticated(frame)
        if state is SaslState.AUTHENTICATE_RAW:
            return self._raw_token(bytes(frame))
        if state is SaslState.REAUTH_BAD_MECHANISM:
            return self._fail(self._bad_mechanism_message)
        try:
            header = frames.decode_request_header(frame)
        except ProtocolError:
            return self._close("malformed request header during SASL %s" % self._what())
        if state is SaslState.AUTHENTICATE:
            return self._authenticate(header, frame)
        if header.api_key == API_VERSIONS:
            if state is SaslState.HANDSHAKE:
                return self._close("unexpected second ApiVersions request during SASL handshake")
            if header.api_version in M.REQUESTS[API_VERSIONS].spec.valid_versions:
                self._move(SaslState.HANDSHAKE)
            return PASS  # answered by the usual handler (an unsupported version too)
        if header.api_key != SASL_HANDSHAKE:
            return self._fail("Unexpected Kafka request of type %s during SASL handshake."
                              % _api_name(header.api_key))
        return self._handshake(header, frame)

    def _what(self) -> str:
        return "re-authentication" if self.reauthenticating else "authentication"

    def _decode(self, header: frames.RequestHeader, frame: Any) -> Any:
        return M.decode_request(header.api_key, header.api_version, frame[header.body_offset:])

    def _handshake(self, header: frames.RequestHeader, frame: Any) -> Outcome:
        if header.api_version not in _HANDSHAKE_RANGE:
            return self._close("unsupported SaslHandshake version %d" % header.api_version)
        try:
            request = self._decode(header, frame)
        except ProtocolError:
            return self._close("malformed SaslHandshake request")
        mechanism = request.mechanism
        enabled = list(self.settings.mechanisms)
        if mechanism not in enabled:
            response = M.SaslHandshakeResponse(error_code=int(ErrorCode.UNSUPPORTED_SASL_MECHANISM), mechanisms=enabled)
            return self._fail("Unsupported SASL mechanism %s" % mechanism, header, response)
        response = M.SaslHandshakeResponse(error_code=0, mechanisms=enabled)
        if self.reauthenticating and mechanism != self.mechanism:
            self._bad_mechanism_message = (
                "SASL mechanism '%s' requested by client is not supported for re-authentication of mechanism '%s'"
                % (mechanism, self.mechanism))
            self._move(SaslState.REAUTH_BAD_MECHANISM)
            return Outcome(Action.RESPOND, header, response)
        self.mechanism = mechanism
        self.server = self._mechanism_server(mechanism)
        self._move(SaslState.AUTHENTICATE if header.api_version >= 1 else SaslState.AUTHENTICATE_RAW)
        return Outcome(Action.RESPOND, header, response)

    def _mechanism_server(self, mechanism: str) -> MechanismServer:
        if mechanism == PLAIN:
            return PlainServer(self.settings.plain_users())
        if mechanism == OAUTHBEARER:
            return OAuthBearerServer(self.settings.options(OAUTHBEARER), self.wall_ms)
        scram = SCRAM_MECHANISMS[mechanism]
        return ScramServer(scram, lambda name: self.credential_of(mechanism, name))

    def _authenticate(self, header: frames.RequestHeader, frame: Any) -> Outcome:
        if header.api_key != SASL_AUTHENTICATE:
            reason = "Unexpected Kafka request of type %s during SASL authentication." % _api_name(header.api_key)
            try:
                request = self._decode(header, frame)
            except ProtocolError:
                return self._close(reason)
            return self._fail(reason, header, error=ErrorCode.ILLEGAL_SASL_STATE, request=request)
        if header.api_version not in _AUTHENTICATE_RANGE:
            return self._close("unsupported SaslAuthenticate version %d" % header.api_version)
        try:
            request = self._decode(header, frame)
        except ProtocolError:
            return self._close("malformed SaslAuthenticate request")
        self.supports_reauth = self.supports_reauth or header.api_version > 0
        try:
            token = self._evaluate(bytes(request.auth_bytes))
        except AuthenticationFailed as exc:
            message = exc.client_message or generic_failure(self.mechanism or "", self.reauthenticating)
            response = M.SaslAuthenticateResponse(error_code=int(ErrorCode.SASL_AUTHENTICATION_FAILED),
                                                  error_message=message, auth_bytes=b"")
            return self._fail(exc.reason, header, response)
        lifetime_ms = self._complete() if self.server is not None and self.server.complete else 0
        response = M.SaslAuthenticateResponse(error_code=0, error_message=None, auth_bytes=token,
                                              session_lifetime_ms=lifetime_ms)
        if self.state is not SaslState.COMPLETE:
            self._move(SaslState.AUTHENTICATE)
        return Outcome(Action.RESPOND, header, response)

    def _raw_token(self, token: bytes) -> Outcome:
        try:
            answer = self._evaluate(token)
        except AuthenticationFailed as exc:
            return self._fail(exc.reason)
        if self.server is not None and self.server.complete:
            self._complete()
        return Outcome(Action.RAW, raw=_RAW_SIZE.pack(len(answer)) + answer)

    def _evaluate(self, token: bytes) -> bytes:
        assert self.server is not None
        answer = self.server.evaluate(token)
        if self.server.complete and self.reauthenticating:
            new = user(self.server.authorization_id or "")
            if new != self.principal:
                old_name, new_name = self.principal.split(":", 1)[1], self.server.authorization_id
                text = ("Cannot change principals during re-authentication from User.%s: User.%s"
                        % (old_name, new_name))
                raise AuthenticationFailed(text, text)
        return answer

    def _complete(self) -> int:
        """The exchange succeeded: the principal, and the session lifetime sent to the client."""
        assert self.server is not None and self.mechanism is not None
        self.principal = user(self.server.authorization_id or "")
        max_reauth_ms = self.settings.reauth_ms.get(self.mechanism, 0)
        lifetime_ms = 0
        expiry = self.server.lifetime_ms
        if expiry is not None or max_reauth_ms > 0:
            if expiry is None:
                lifetime_ms = max(0, max_reauth_ms)
            elif max_reauth_ms <= 0:
                lifetime_ms = max(0, expiry - self.wall_ms())
            else:
                lifetime_ms = max(0, min(expiry - self.wall_ms(), max_reauth_ms))
            self.session_expires = self.now() + lifetime_ms / 1000.0
        else:
            self.session_expires = None
        self.reauthenticating = False
        self._move(SaslState.COMPLETE)
        return lifetime_ms

    def _authenticated(self, frame: Any) -> Outcome:
        api_key = _api_key_of(frame)
        now = self.now()
        if (api_key == SASL_HANDSHAKE and self.session_expires is not None
                and now - self._last_reauth_start >= MIN_REAUTH_INTERVAL_S):
            try:
                header = frames.decode_request_header(frame)
            except ProtocolError:
                return self._close("malformed request header")
            self._last_reauth_start = now
            self.reauthenticating = True
            self.session_expires = None  # the old session ends with this re-authentication
            return self._handshake(header, frame)
        if self.session_expires is not None and now > self.session_expires:
            return self._close("the SASL session expired (connections.max.reauth.ms or the token's lifetime) "
                               "without re-authentication")
        return PASS


def _api_key_of(frame: Any) -> int:
    return int.from_bytes(frame[0:2], "big", signed=True) if len(frame) >= 2 else -1


def _api_name(api_key: int) -> str:
    codec = M.REQUESTS.get(api_key)
    if codec is None:
        return str(api_key)
    # Kafka prints the ApiKeys enum name (SASL_HANDSHAKE, METADATA, ...)
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", "_", codec.spec.name.removesuffix("Request")).upper()
