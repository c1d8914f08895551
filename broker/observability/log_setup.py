"""Log configuration: structlog's key=value lines on a terminal, JSON lines when asked
(`python -m broker`); the logging module for a broker embedded in another process."""

from __future__ import annotations

import logging
import sys
from typing import Any

from broker.observability.logger import log_to_standard_logging


def _level(level: str) -> int:
    lvl = logging.getLevelName(level.upper())
    return lvl if isinstance(lvl, int) else logging.INFO


def configure(fmt: str = "console", level: str = "INFO") -> None:
    import structlog

    lvl = _level(level)
    renderer: Any
    if fmt == "json":
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )


def configure_embedded(level: str = "INFO") -> None:
    """For a broker inside someone else's process (broker.testing), called on the broker's own
    thread: that thread's lines go to the standard `logging` loggers named as the broker's
    (`broker.*`), rendered `event key=value` by broker.observability.logger, so that pytest shows
    them with a failing test; structlog is neither imported nor configured for them."""
    lvl = _level(level)
    parent = logging.getLogger("broker")
    if parent.level == logging.NOTSET:
        parent.setLevel(lvl)
    log_to_standard_logging(lvl)
