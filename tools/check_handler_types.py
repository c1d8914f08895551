"""Check that every registered API handler is typed with its API's message classes.

    python tools/check_handler_types.py        (part of `make check`; exit status 1 on a problem)

mypy checks the handlers against their annotations; this checks that the annotations are there
and are the right ones: `async def handler(ctx: RequestContext, request: <the API's request
class>) -> <its response class> [| None]`, no parameter or return unannotated or `Any`, the
request class the one protocol.messages.REQUESTS has for the API key (and the response class
RESPONSES'). tests/integration/test_handler_types.py runs it too.
"""

from __future__ import annotations

import inspect
import sys
import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from broker.apis import APIS, Api, RequestContext, load_handlers  # noqa: E402
from broker.apis.registry import CONTROLLER_APIS  # noqa: E402
from protocol.messages import REQUESTS, RESPONSES  # noqa: E402


def _union_members(annotation: object) -> tuple[object, ...]:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _name(annotation: object) -> str:
    return getattr(annotation, "__qualname__", None) or repr(annotation)


def handler_problems(key: int, handler: Callable[..., Any]) -> list[str]:
    """What is wrong with the annotations of `handler`, registered for API `key` (empty: nothing)."""
    request_class, response_class = REQUESTS[key].root_class, RESPONSES[key].root_class
    if not inspect.iscoroutinefunction(handler):
        return ["is not an async def"]
    try:
        hints = typing.get_type_hints(handler)
    except Exception as exc:  # a name the module does not import at run time
        return ["its annotations do not resolve: %r" % exc]
    parameters = list(inspect.signature(handler).parameters.values())
    if len(parameters) != 2:
        return ["takes %d parameters, not (ctx, request)" % len(parameters)]
    problems = []
    ctx, request = parameters
    # what, its annotation, the class it must name, whether it may be `| None` (no response)
    expected: list[tuple[str, object, type, bool]] = [
        ("parameter %r" % ctx.name, hints.get(ctx.name), RequestContext, False),
        ("parameter %r" % request.name, hints.get(request.name), request_class, False),
        ("return", hints.get("return"), response_class, True),
    ]
    for what, annotation, cls, optional in expected:
        if annotation is None:
            problems.append("%s is not annotated" % what)
            continue
        members = _union_members(annotation)
        if Any in members:
            problems.append("%s is Any" % what)
        elif cls not in members or not set(members) <= {cls, type(None)} or (type(None) in members and not optional):
            problems.append("%s is %s, not %s%s" % (what, " | ".join(_name(m) for m in members), _name(cls),
                                                   " [| None]" if optional else ""))
    return problems


def registry_problems(apis: Mapping[int, Api] = APIS) -> list[str]:
    """Every problem of every registered handler, one line each."""
    lines = []
    for key, entry in sorted(apis.items()):
        where = "%s.%s (%s, key %d)" % (entry.handler.__module__, entry.handler.__qualname__, entry.name, key)
        lines += ["%s: %s" % (where, problem) for problem in handler_problems(key, entry.handler)]
    return lines


def main() -> int:
    load_handlers()
    import broker.apis.forwarding  # noqa: F401  (the controller's APIs: loaded in cluster mode only)

    everything = {**APIS, **CONTROLLER_APIS}
    problems = registry_problems(everything)
    for line in problems:
        print(line, file=sys.stderr)
    if problems:
        print("%d problem(s) in the types of %d handlers" % (len(problems), len(everything)), file=sys.stderr)
        return 1
    print("%d handlers typed with their message classes" % len(everything))
    return 0


if __name__ == "__main__":
    sys.exit(main())
