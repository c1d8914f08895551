"""What request handlers ask of security (Kafka's AuthHelper).

`listener_of(ctx)`: the name of the listener the request came in on (Metadata advertises it).
"""

from __future__ import annotations

from typing import Any


def listener_of(ctx: Any) -> str | None:
    """The listener the request came in on, None when the context has no connection (unit tests)."""
    connection = getattr(ctx, "connection", None)
    listener = getattr(connection, "listener", None)
    return listener.name if listener is not None else None
