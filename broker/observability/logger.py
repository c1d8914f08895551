"""The broker's loggers: structlog's, with structlog imported at the first line logged.

Importing structlog costs tens of milliseconds (it imports rich, when rich is installed, for its
tracebacks), most of what importing a small part of the broker would cost. So a module takes its
logger from here, at import, for nothing; the first line it logs gets structlog's logger of that
name (`structlog.get_logger(name)`, configured by broker.observability.log_setup or by the
application) and every line goes to it: levels, processors and structlog.testing behave as with
structlog's own loggers. Logging is off the per-request path (errors, or debug when asked).
"""

from __future__ import annotations

from typing import Any


class Logger:
    """`debug`, `info`, `warning`, `error` and `exception` as a structlog logger has them, and
    `is_enabled_for` (a level of the logging module)."""

    __slots__ = ("name", "_logger")

    def __init__(self, name: str) -> None:
        self.name = name
        self._logger: Any = None

    def _structlog(self) -> Any:
        logger = self._logger
        if logger is None:
            import structlog

            logger = self._logger = structlog.get_logger(self.name)
        return logger

    def debug(self, event: str, **kw: Any) -> Any:
        return self._structlog().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> Any:
        return self._structlog().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> Any:
        return self._structlog().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> Any:
        return self._structlog().error(event, **kw)

    def exception(self, event: str, **kw: Any) -> Any:
        return self._structlog().exception(event, **kw)

    def is_enabled_for(self, level: int) -> bool:
        """Whether a line at `level` would be logged (True when the configured logger cannot tell:
        only structlog's filtering loggers can)."""
        is_enabled_for = getattr(self._structlog(), "is_enabled_for", None)
        return bool(is_enabled_for(level)) if is_enabled_for is not None else True


def get_logger(name: str) -> Logger:
    return Logger(name)
