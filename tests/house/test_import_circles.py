"""The import-circle check of `make check` (tools/check_cycles.py) finds circles, and the tree has none."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]


def _tool():  # tools/ is not a package: load the script as a module
    spec = importlib.util.spec_from_file_location("check_cycles", ROOT / "tools" / "check_cycles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_circle_through_three_modules_is_found_and_a_chain_is_not() -> None:
    graph = grimp.ImportGraph()
    for importer, imported in [("p.a", "p.b"), ("p.b", "p.c"), ("p.c", "p.a"), ("p.c", "p.d"), ("p.e", "p.d")]:
        graph.add_import(importer=importer, imported=imported)
    assert _tool().circles(graph) == [["p.a", "p.b", "p.c"]]


def test_the_tree_has_no_import_circles() -> None:
    tool = _tool()
    graph = grimp.build_graph(*tool.PACKAGES, include_external_packages=False, exclude_type_checking_imports=False)
    assert tool.circles(graph) == []
