"""Every registered API handler names its request and response message classes and the request
context (tools/check_handler_types.py, also run by `make check`), and the check catches handlers
that do not."""

from __future__ import annotations

from typing import Any

from broker.apis import APIS, RequestContext, load_handlers
from protocol import messages as M
from tools.check_handler_types import handler_problems, registry_problems

PRODUCE, FETCH = 0, 1


def test_every_registered_handler_is_typed_with_its_message_classes() -> None:
    load_handlers()
    assert len(APIS) >= 60
    assert registry_problems() == []


async def typed(ctx: RequestContext, request: M.FetchRequest) -> M.FetchResponse:
    raise NotImplementedError


async def maybe_answered(ctx: RequestContext, request: M.ProduceRequest) -> M.ProduceResponse | None:
    raise NotImplementedError


async def untyped(ctx, request):  # type: ignore[no-untyped-def]
    raise NotImplementedError


async def any_request(ctx: RequestContext, request: Any) -> M.FetchResponse:
    raise NotImplementedError


async def any_context(ctx: Any, request: M.FetchRequest) -> M.FetchResponse:
    raise NotImplementedError


async def any_or_none(ctx: RequestContext, request: M.FetchRequest) -> Any | None:
    raise NotImplementedError


async def wrong_message(ctx: RequestContext, request: M.ProduceRequest) -> M.ProduceResponse:
    raise NotImplementedError


async def wider_response(ctx: RequestContext, request: M.FetchRequest) -> M.FetchResponse | M.ProduceResponse:
    raise NotImplementedError


def not_async(ctx: RequestContext, request: M.FetchRequest) -> M.FetchResponse:
    raise NotImplementedError


def test_the_check_names_what_is_missing_or_wrong() -> None:
    assert handler_problems(FETCH, typed) == []
    assert handler_problems(PRODUCE, maybe_answered) == []  # None: no response (acks=0)
    assert handler_problems(FETCH, untyped) == [
        "parameter 'ctx' is not annotated", "parameter 'request' is not annotated", "return is not annotated"]
    assert handler_problems(FETCH, any_request) == ["parameter 'request' is Any"]
    assert handler_problems(FETCH, any_context) == ["parameter 'ctx' is Any"]
    assert handler_problems(FETCH, any_or_none) == ["return is Any"]
    assert handler_problems(FETCH, wrong_message) == [
        "parameter 'request' is ProduceRequest, not FetchRequest",
        "return is ProduceResponse, not FetchResponse [| None]"]
    assert handler_problems(FETCH, wider_response) == [
        "return is FetchResponse | ProduceResponse, not FetchResponse [| None]"]
    assert handler_problems(FETCH, not_async) == ["is not an async def"]
