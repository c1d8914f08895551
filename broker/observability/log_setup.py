"""structlog configuration: key=value lines on a terminal, JSON lines when asked."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(fmt: str = "console", level: str = "INFO") -> None:
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    renderer: structlog.typing.Processor
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
    """For a broker inside someone else's process (broker.testing): its lines go to the standard
    `logging` loggers named `broker.*` (so pytest shows them with a failing test), unless the
    application configured structlog itself, which then stays as it is."""
    if structlog.is_configured():
        return
    lvl = logging.getLevelName(level.upper())
    if not isinstance(lvl, int):
        lvl = logging.INFO
    parent = logging.getLogger("broker")
    if parent.level == logging.NOTSET:
        parent.setLevel(lvl)
    structlog.configure(
        processors=[structlog.processors.format_exc_info, structlog.dev.ConsoleRenderer(colors=False)],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.stdlib.LoggerFactory(),
        cache_logger_on_first_use=False,  # the application may configure structlog later
    )
