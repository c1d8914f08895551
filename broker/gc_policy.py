"""The garbage collector of a broker process (`python -m broker`), tuned for a long-running server.

CPython's defaults suit short programs: a young collection every 700 allocations, and a full one
whenever the objects promoted since the last full one outnumber a quarter of those that survived
it. Under load the broker allocates hundreds of thousands of objects a second, so everything a
request holds for more than a few milliseconds (a long-polled Fetch, a held heartbeat) is promoted
to the oldest generation, and a full collection follows every few seconds that walks every
connection, partition and group: with 5,000 connections a stall of 50 to 130 ms that every
request waits out (bench/many_clients.py).

Hence three rules:
- young collections are rarer, so that most of what a request allocates has died before it is
  looked at (fewer promotions, fewer full collections);
- what survived a full collection is frozen (gc.freeze), so that the next one walks only what came
  since: the cost of a full collection follows the garbage, not the broker's size;
- after every `complete_every`-th full collection the frozen objects are let back in
  (gc.unfreeze), so that the next one is complete: a reference cycle among objects that were
  alive when frozen (a closed connection, a finished request) is still reclaimed, later.

`collector_paused`: pausing Python's cyclic garbage collector while a start-up builds its long-lived objects.

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
from typing import Any

YOUNG_THRESHOLD = 10_000  # allocations between young collections (CPython's default: 700)
COMPLETE_EVERY = 50  # one complete full collection in so many (under load: every few minutes)
OLDEST = 2  # the generation a full collection collects


class CollectorPolicy:
    """Installed once per process by the command line (never by an embedded broker: the collector
    belongs to the program that embeds it)."""

    def __init__(self, young_threshold: int = YOUNG_THRESHOLD, complete_every: int = COMPLETE_EVERY) -> None:
        self.young_threshold = young_threshold
        self.complete_every = complete_every
        self.full_collections = 0

    def install(self) -> None:
        """Freeze what start-up built (modules, codecs, loaded groups: as old as the process) and
        apply the rules from now on. Frozen without a collection first: start-up leaves next to no
        garbage (14 objects with 50,000 partitions), and collecting its 1.6 million objects took a
        second after the broker listened."""
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(self.young_threshold, older, oldest)
        gc.callbacks.append(self.on_collection)

    def on_collection(self, phase: str, info: dict[str, Any]) -> None:
        """gc.callbacks hook. After a full collection the generations hold only its survivors:
        they are frozen, or, every `complete_every`-th time, the frozen objects join them."""
        if phase != "stop" or info["generation"] != OLDEST:
            return
        self.full_collections += 1
        if self.full_collections % self.complete_every == 0:
            gc.unfreeze()  # the next full collection walks everything
        else:
            gc.freeze()


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
