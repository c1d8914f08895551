"""Regular expressions sent by clients (KIP-848 SubscribedTopicRegex, ListTransactions'
TransactionalIdPattern), compiled with RE2 as Kafka compiles them with RE2/J."""

from __future__ import annotations

from typing import Any

import re2


class RegexError(ValueError):
    """An expression RE2 cannot parse; its text is RE2's description of what is wrong."""

# RE2 writes every expression it cannot parse to the process's stderr, around the broker's log;
# an invalid expression is the client's error and is answered as one (INVALID_REGULAR_EXPRESSION)
_OPTIONS = re2.Options()
_OPTIONS.log_errors = False


def compile_re2(pattern: str) -> Any:
    """The compiled expression; RegexError if it is not a valid one."""
    try:
        return re2.compile(pattern, _OPTIONS)
    except re2.error as exc:
        # pyre2 gives RE2's description as bytes ("b'missing ]: [a'" once formatted); clients see text
        reason = exc.args[0] if exc.args else "invalid expression"
        if isinstance(reason, bytes):
            reason = reason.decode("utf-8", "replace")
        raise RegexError(str(reason)) from None
