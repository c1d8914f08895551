"""`make check`: fail when modules of broker/, protocol/ or pyspark_kafka/ import each other in a circle.

Imports under `if TYPE_CHECKING:` count: a type that two modules need belongs below both (a
shared state type in its own module, or a Protocol of what the one needs of the other).
"""

from __future__ import annotations

import sys

import grimp

PACKAGES = ("broker", "protocol", "pyspark_kafka")


def circles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            module, edges = work[-1]
            advanced = False
            for other in edges:
                if other not in index:
                    index[other] = low[other] = len(index)
                    stack.append(other)
                    on_stack.add(other)
                    work.append((other, iter(sorted(graph.find_modules_directly_imported_by(other)))))
                    advanced = True
                    break
                if other in on_stack:
                    low[module] = min(low[module], index[other])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[module])
            if low[module] == index[module]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == module:
                        break
                if len(component) > 1:
                    found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return sorted(found)


def main() -> int:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, exclude_type_checking_imports=False)
    found = circles(graph)
    for component in found:
        print("import circle: " + " <-> ".join(component))
    if found:
        print("%d import circle(s): put the shared types below the modules that use them" % len(found))
        return 1
    print("no import circles in %s" % ", ".join(PACKAGES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
