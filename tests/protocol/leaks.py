"""The leak check the C extensions' tests share."""

from __future__ import annotations

import sys
import tracemalloc
from collections.abc import Callable, Sequence


def assert_no_leak(run: Callable[[int], None], watched: Sequence[object], warm: int, rounds: int) -> None:
    """`run(n)` makes n rounds: after `warm` rounds (caches filled), `rounds` more grow traced
    memory by less than 64 KiB and leave the reference counts of `watched` as they were."""
    run(warm)
    refs = [sys.getrefcount(obj) for obj in watched]
    tracemalloc.start()
    try:
        run(warm)
        before = tracemalloc.get_traced_memory()[0]
        run(rounds)
        growth = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert growth < 64 * 1024, growth
    assert [sys.getrefcount(obj) for obj in watched] == refs
