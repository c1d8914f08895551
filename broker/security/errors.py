"""Errors of the security layer."""

from __future__ import annotations

from protocol.errors import ErrorCode


class SecurityConfigError(ValueError):
    """A listener, TLS, SASL or authorizer setting the broker cannot start with (the message says
    which and what to use instead; it never carries a secret)."""


class AuthenticationError(Exception):
    """This broker, as a client of another, was not authenticated (SASL refused, or the exchange
    broke off): `code` is the Kafka error the server answered, or the client's own. The message is
    what Kafka's client reports; it never carries a secret."""

    def __init__(self, message: str, code: ErrorCode = ErrorCode.SASL_AUTHENTICATION_FAILED) -> None:
        super().__init__(message)
        self.code = code
