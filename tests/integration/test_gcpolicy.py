"""The broker process's garbage collector policy (broker/gc_policy.py), run in a child process so
that the test process's collector is left alone."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.harness import ROOT

SCRIPT = textwrap.dedent("""
    import gc, weakref
    from broker.gc_policy import CollectorPolicy

    # a young threshold out of reach: no automatic collection interferes with the explicit ones
    policy = CollectorPolicy(young_threshold=10**9, complete_every=3)
    policy.install()
    assert gc.get_threshold()[0] == 10**9
    start_up = gc.get_freeze_count()
    assert start_up > 0  # what start-up built is frozen

    class Node:
        pass

    a, b = Node(), Node()
    a.other, b.other = b, a
    alive = weakref.ref(a)
    gc.collect()  # full collection 1: the pair survives it and is frozen
    assert policy.full_collections == 1 and gc.get_freeze_count() > start_up
    del a, b  # now a reference cycle of frozen objects: garbage that only a complete collection sees
    gc.collect()  # 2: walks only what came since the last one
    assert alive() is not None
    gc.collect()  # 3: the frozen objects are let back in afterwards
    assert alive() is not None and gc.get_freeze_count() == 0
    gc.collect()  # 4: complete, finds the cycle; the survivors are frozen again
    assert alive() is None and gc.get_freeze_count() > 0
    print("ok")
""")


def test_survivors_of_full_collections_are_frozen_and_cycles_among_them_reclaimed_later() -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=str(ROOT), capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
