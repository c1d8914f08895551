"""Errors of the security layer."""

from __future__ import annotations


class SecurityConfigError(ValueError):
    """A listener, TLS, SASL or authorizer setting the broker cannot start with (the message says
    which and what to use instead; it never carries a secret)."""
