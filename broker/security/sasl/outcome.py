"""What the SASL authenticator (authenticator.py) tells the server to do with a frame: the
server reads it on every frame of a SASL listener's connection, and imports only this (the
mechanisms are imported by the first SASL connection)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from protocol import frames
    from protocol.errors import ErrorCode


class Action(enum.Enum):
    PASS = "pass"
    RESPOND = "respond"
    RAW = "raw"
    FAIL = "fail"
    CLOSE = "close"


@dataclass(frozen=True, slots=True)
class Outcome:
    action: Action
    header: frames.RequestHeader | None = None
    response: Any = None
    raw: bytes | None = None
    error: ErrorCode | None = None  # FAIL: answer with the request's own error response carrying this code
    request: Any = None  # FAIL with `error`: the decoded request
    reason: str = ""  # for the log line (never a secret)


PASS = Outcome(Action.PASS)
