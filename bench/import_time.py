"""What a user waits for before the broker does anything: `import broker.app` in a fresh
interpreter, and the setup of the first `kafka_broker` fixture of a pytest session.

    python bench/import_time.py [--repeat 3] [--processes 5] [--root OTHER_CHECKOUT ...]

import: `--processes` fresh interpreters run `import broker.app`, and as many run nothing; the
figure is the fastest wall time of the first less the fastest of the second (a bare interpreter's
start and exit), with the median beside it, and the CPU time the same way (less disturbed by a
busy machine). fixture: `--sessions` fresh pytest sessions each run a generated one-test file
using `kafka_broker`; the figure is the fastest of that test's setups as `--durations` reports
them (importing the broker, starting it in its thread, waiting for its port), and the CPU time
the process spent meanwhile (all threads). Each repeat measures
every checkout in turn (this one, then each `--root`), so trees compared in one run share the
machine's noise; the summary gives the best and the median over the repeats.

The interpreters run with bytecode caches written (PYTHONDONTWRITEBYTECODE unset) after one
warm-up, as an installed package runs. `--no-bytecode` measures a checkout without caches
instead, as sessions that set PYTHONDONTWRITEBYTECODE=1 run one: it removes the __pycache__
directories of each checkout's broker/ and protocol/ (the ones Python wrote there) and keeps
them from being written, so every process compiles the broker's modules from source (the
standard library and installed packages keep theirs).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TEST_FILE = "def test_one(kafka_broker):\n    assert kafka_broker.bootstrap_servers\n"
# the CPU time of the process (every thread: the broker's too) while the fixture is set up
CONFTEST = """\
import os
import time

import pytest


@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    if fixturedef.argname != "kafka_broker":
        yield
        return
    cpu = time.process_time()
    yield
    with open(os.environ["IMPORT_TIME_CPU"], "w") as out:
        out.write(repr(time.process_time() - cpu))
"""
DURATION = re.compile(r"^([0-9.]+)s setup\s+\S*test_one\.py::test_one", re.M)


def environment(root: Path, bytecode: bool) -> dict[str, str]:
    env = dict(os.environ)
    # the checkout's packages before the editable install's mapping
    env["PYTHONPATH"] = os.pathsep.join([str(root), *filter(None, [env.get("PYTHONPATH")])])
    if bytecode:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
    else:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def run(args: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    """(wall, CPU) seconds of a process; its CPU time (user + system) suffers less from a busy
    machine than its wall time does."""
    start = time.perf_counter()
    process = subprocess.Popen(args, env=env, cwd=cwd, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    elapsed = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit("%s failed (%d)" % (" ".join(args), process.returncode))
    return elapsed, usage.ru_utime + usage.ru_stime


def import_seconds(root: Path, processes: int, bytecode: bool, module: str) -> tuple[float, float, float]:
    """(fastest, median) wall time and fastest CPU time of `import <module>`, each less that of
    a bare interpreter (the fastest of as many)."""
    env = environment(root, bytecode)
    bare: list[tuple[float, float]] = []
    loaded: list[tuple[float, float]] = []
    for _ in range(processes):  # alternating, so both see the same moments of the machine
        bare.append(run([sys.executable, "-c", "pass"], env, root))
        loaded.append(run([sys.executable, "-c", "import %s" % module], env, root))
    bare_wall = min(w for w, _ in bare)
    walls = [w for w, _ in loaded]
    return min(walls) - bare_wall, statistics.median(walls) - bare_wall, min(c for _, c in loaded) - min(c for _, c in bare)


def fixture_seconds(root: Path, bytecode: bool, sessions: int) -> tuple[float, float]:
    """The fastest setup (wall, CPU) of a pytest session's first `kafka_broker` fixture, of `sessions`."""
    found = [_fixture_seconds(root, bytecode) for _ in range(sessions)]
    return min(w for w, _ in found), min(c for _, c in found)


def _fixture_seconds(root: Path, bytecode: bool) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="import-time-") as tmp:
        directory = Path(tmp)
        (directory / "test_one.py").write_text(TEST_FILE)
        (directory / "conftest.py").write_text(CONFTEST)
        (directory / "pytest.ini").write_text("[pytest]\n")  # not the checkout's options
        env = environment(root, bytecode)
        env["IMPORT_TIME_CPU"] = str(directory / "cpu")
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=0",
             "--durations-min=0", "test_one.py"],
            env=env, cwd=directory, capture_output=True, text=True, timeout=120,
        )
        found = DURATION.search(out.stdout)
        if out.returncode != 0 or found is None:
            raise SystemExit("pytest failed in %s:\n%s%s" % (root, out.stdout, out.stderr))
        return float(found.group(1)), float((directory / "cpu").read_text())


def remove_caches(root: Path) -> None:
    for package in ("broker", "protocol"):
        for cache in (root / package).rglob("__pycache__"):
            shutil.rmtree(cache)


def warm_up(root: Path, module: str) -> None:
    """Write the checkout's bytecode caches (a first import compiles)."""
    subprocess.run([sys.executable, "-c", "import %s, broker.testing.embedded" % module],
                   env=environment(root, True), cwd=root, check=True, timeout=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--processes", type=int, default=5, help="fresh interpreters per import figure")
    parser.add_argument("--sessions", type=int, default=3, help="fresh pytest sessions per fixture figure")
    parser.add_argument("--root", action="append", default=[], type=Path,
                        help="another checkout to measure in the same run (repeatable)")
    parser.add_argument("--module", default="broker.app")
    parser.add_argument("--no-bytecode", action="store_true", help="compile from source in every process")
    parser.add_argument("--no-fixture", action="store_true")
    args = parser.parse_args()
    roots = [ROOT, *(r.resolve() for r in args.root)]
    bytecode = not args.no_bytecode
    for root in roots:
        if bytecode:
            warm_up(root, args.module)
        else:
            remove_caches(root)
    results: dict[Path, dict[str, list[float]]] = {
        r: {"min": [], "median": [], "cpu": [], "fixture": [], "fixture_cpu": []} for r in roots
    }
    for i in range(args.repeat):
        for root in roots:
            fastest, median, cpu = import_seconds(root, args.processes, bytecode, args.module)
            figures = results[root]
            figures["min"].append(fastest)
            figures["median"].append(median)
            figures["cpu"].append(cpu)
            line = "round %d %s: import %s %.3f s (median %.3f s, CPU %.3f s)" % (
                i + 1, root, args.module, fastest, median, cpu)
            if not args.no_fixture:
                wall, cpu = fixture_seconds(root, bytecode, args.sessions)
                figures["fixture"].append(wall)
                figures["fixture_cpu"].append(cpu)
                line += ", fixture setup %.3f s (CPU %.3f s)" % (wall, cpu)
            print(line, flush=True)
    print()
    for root, figures in results.items():
        print("%s" % root)
        print("  import %s, fastest of %d less a bare interpreter: best %.3f s, median over rounds %.3f s"
              % (args.module, args.processes, min(figures["min"]), statistics.median(figures["min"])))
        print("  import, median of %d less a bare interpreter:     best %.3f s, median over rounds %.3f s"
              % (args.processes, min(figures["median"]), statistics.median(figures["median"])))
        print("  import, CPU time less a bare interpreter's:       best %.3f s, median over rounds %.3f s"
              % (min(figures["cpu"]), statistics.median(figures["cpu"])))
        if figures["fixture"]:
            print("  first kafka_broker fixture setup, fastest of %d:  best %.3f s, median over rounds %.3f s"
                  % (args.sessions, min(figures["fixture"]), statistics.median(figures["fixture"])))
            print("  fixture setup, CPU time of the process:          best %.3f s, median over rounds %.3f s"
                  % (min(figures["fixture_cpu"]), statistics.median(figures["fixture_cpu"])))


if __name__ == "__main__":
    main()
