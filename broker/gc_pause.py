"""Pausing Python's cyclic garbage collector while a start-up builds its long-lived objects.

A broker start with tens of thousands of partitions allocates millions of objects that all stay
(logs, segments, indexes, partitions, metadata). The collector would walk the growing heap again
and again meanwhile (a third of a 50,000-partition start went into it) to find nothing: none of
it is garbage. Nested and concurrent pauses (brokers started in threads of one process) share one
count; the collector resumes when the last one ends, unless it was off before the first.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_pauses = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    global _pauses, _was_enabled
    with _lock:
        if _pauses == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _pauses += 1
    try:
        yield
    finally:
        with _lock:
            _pauses -= 1
            if _pauses == 0 and _was_enabled:
                gc.enable()
