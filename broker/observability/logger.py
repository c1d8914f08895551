"""The broker's loggers: structlog's, with structlog imported at the first line logged, or the
logging module's, for the threads of a broker embedded in someone else's process.

Importing structlog costs tens of milliseconds (it imports rich, when rich is installed, for its
tracebacks), most of what importing a small part of the broker would cost. So a module takes its
logger from here, at import, for nothing. A line it logs goes:

- from a thread that called `log_to_standard_logging` (an EmbeddedBroker's thread, broker.testing):
  to the logging module's logger of the same name, rendered here as structlog's console renderer
  renders it (`event` padded, then `key=value` by key), above that thread's level. pytest shows
  those lines with a failing test, and structlog is never imported for them;
- from any other thread: to structlog's logger of that name (`structlog.get_logger(name)`,
  configured by broker.observability.log_setup or by the application), imported then: levels,
  processors and structlog.testing behave as with structlog's own loggers.

Logging is off the per-request path (errors, or debug when asked).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

# threads whose lines go to the logging module -> the lowest level they log
_STANDARD: dict[int, int] = {}


def log_to_standard_logging(level: int) -> None:
    """The calling thread's lines go to the logging module from now on, those at `level` or above."""
    _STANDARD[threading.get_ident()] = level


def stop_logging_to_standard_logging() -> None:
    """The calling thread's lines go to structlog again (its thread is ending)."""
    _STANDARD.pop(threading.get_ident(), None)


def render(event: str, kw: dict[str, Any]) -> str:
    """A line as structlog's ConsoleRenderer(colors=False) renders it without a level and a time:
    the event padded to 30 characters, then the pairs by key; a string is written as it is unless
    it holds a space, a quote or `=` (then as repr), anything else as repr."""
    if not kw:
        return event
    return "%-30s %s" % (event, " ".join("%s=%s" % (key, _value(kw[key])) for key in sorted(kw)))


_QUOTED = frozenset(" \t=\r\n\"'")


def _value(value: Any) -> str:
    if isinstance(value, str) and not _QUOTED.intersection(value):
        return value
    return repr(value)


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

    def _log(self, level: int, method: str, event: str, kw: dict[str, Any]) -> Any:
        threshold = _STANDARD.get(threading.get_ident())
        if threshold is None:
            return getattr(self._structlog(), method)(event, **kw)
        if level >= threshold:
            exc_info = kw.pop("exc_info", method == "exception")
            logging.getLogger(self.name).log(level, render(event, kw), exc_info=exc_info)
        return None

    def debug(self, event: str, **kw: Any) -> Any:
        return self._log(logging.DEBUG, "debug", event, kw)

    def info(self, event: str, **kw: Any) -> Any:
        return self._log(logging.INFO, "info", event, kw)

    def warning(self, event: str, **kw: Any) -> Any:
        return self._log(logging.WARNING, "warning", event, kw)

    def error(self, event: str, **kw: Any) -> Any:
        return self._log(logging.ERROR, "error", event, kw)

    def exception(self, event: str, **kw: Any) -> Any:
        return self._log(logging.ERROR, "exception", event, kw)

    def is_enabled_for(self, level: int) -> bool:
        """Whether a line at `level` would be logged (True when structlog's configured logger
        cannot tell: only its filtering loggers can)."""
        threshold = _STANDARD.get(threading.get_ident())
        if threshold is not None:
            return level >= threshold and logging.getLogger(self.name).isEnabledFor(level)
        is_enabled_for = getattr(self._structlog(), "is_enabled_for", None)
        return bool(is_enabled_for(level)) if is_enabled_for is not None else True


def get_logger(name: str) -> Logger:
    return Logger(name)
