"""The controller's side of forwarding (broker/apis/forwarding.py) without a cluster: Kafka's
checks before an Envelope's request is served (the inter-broker listener only, CLUSTER_ACTION,
the active controller) and its unwrapping errors, as ControllerApis and EnvelopeUtils answer them.
The forwarded request served as the client's principal is tested with three processes in
test_security_cluster.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from broker.apis import load_handlers
from broker.apis.context import RequestContext
from broker.apis.forwarding import (
    encode_principal,
    handle_allocate_producer_ids,
    handle_broker_heartbeat,
    handle_broker_registration,
    handle_envelope,
    host_bytes,
)
from protocol import frames
from protocol import messages as M
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode
ENVELOPE, CREATE_TOPICS, PRODUCE = 58, 19, 0
load_handlers()  # every API registered, as in a started broker (CreateTopics among them)


class Connection:
    def __init__(self, listener: str | None, principal: str = "User:broker") -> None:
        self.listener = SimpleNamespace(name=listener) if listener is not None else None
        self.principal = principal
        self.closed = False

    def close(self) -> None:
        self.closed = True


class Authorizer:
    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed

    def authorize(self, principal: str, host: str, operation: Any, resource_type: Any, name: str,
                  log_if_denied: bool = True) -> bool:
        return principal in self.allowed


def context(api_key: int, listener: str | None = "INTERNAL", principal: str = "User:broker",
            controller: bool = True) -> RequestContext:
    node = SimpleNamespace(settings=SimpleNamespace(inter_broker_listener="INTERNAL"), is_controller=controller,
                           controller=None)
    broker = SimpleNamespace(cluster=SimpleNamespace(node=node), authorizer=Authorizer({"User:broker"}))
    return RequestContext(broker, api_key, 0, 1, "broker-2", "127.0.0.1", 0, Connection(listener, principal))  # type: ignore[arg-type]


def create_topics_frame(version: int = 7, truncate: int = 0) -> bytes:
    R = M.CreateTopicsRequest
    body = bytes(M.encode(R(topics=[R.CreatableTopic(name="t", num_partitions=1, replication_factor=1,
                                                     assignments=[], configs=[])],
                            timeout_ms=1000, validate_only=False), version))
    frame = frames.encode_request_header(CREATE_TOPICS, version, 7, "client") + body
    return frame[:len(frame) - truncate] if truncate else frame


def envelope(data: bytes | None = None, principal: bytes | None = None, address: bytes | None = None
             ) -> M.EnvelopeRequest:
    return M.EnvelopeRequest(request_data=create_topics_frame() if data is None else data,
                             request_principal=encode_principal("User:alice") if principal is None else principal,
                             client_host_address=host_bytes("10.0.0.1") if address is None else address)


def answer(ctx: RequestContext, request: Any) -> Any:
    return asyncio.run(handle_envelope(ctx, request))


@pytest.mark.parametrize("handler, api_key, body", [
    (handle_envelope, 58, envelope()),
    (handle_broker_registration, 62, None),
    (handle_broker_heartbeat, 63, None),
    (handle_allocate_producer_ids, 67, None),
])
def test_controller_apis_only_on_the_inter_broker_listener(handler: Any, api_key: int, body: Any) -> None:
    ctx = context(api_key, listener="EXTERNAL")
    assert asyncio.run(handler(ctx, body)) is None  # nothing answered: the connection is closed
    assert ctx.connection.closed


def test_controller_apis_need_cluster_action() -> None:
    with pytest.raises(KafkaError) as refused:
        answer(context(ENVELOPE, principal="User:alice"), envelope())
    assert refused.value.code is E.CLUSTER_AUTHORIZATION_FAILED
    assert "User:alice does not have required CLUSTER_ACTION" in refused.value.message
    with pytest.raises(KafkaError) as registration:
        asyncio.run(handle_broker_registration(context(62, principal="User:alice"), None))
    assert registration.value.code is E.CLUSTER_AUTHORIZATION_FAILED


def test_envelope_to_a_node_that_is_not_the_controller() -> None:
    assert answer(context(ENVELOPE, controller=False), envelope()).error_code == E.NOT_CONTROLLER


@pytest.mark.parametrize("body, code", [
    (envelope(principal=b"\x00"), E.PRINCIPAL_DESERIALIZATION_FAILURE),
    (envelope(address=b"\x7f\x00\x01"), E.INVALID_REQUEST),  # not an IPv4 or IPv6 address
    (envelope(data=frames.encode_request_header(PRODUCE, 9, 7, "client") + b"\x00" * 16),
     E.INVALID_REQUEST),  # Produce cannot be forwarded
    (envelope(data=b"\x00\x13"), E.UNSUPPORTED_VERSION),  # no header
    (envelope(data=create_topics_frame()[:2] + b"\x7f\xff" + create_topics_frame()[4:]),
     E.UNSUPPORTED_VERSION),  # a version nobody has
    (envelope(data=create_topics_frame(truncate=5)), E.UNSUPPORTED_VERSION),  # cannot be parsed
])
def test_envelope_unwrapping_errors(body: M.EnvelopeRequest, code: ErrorCode) -> None:
    response = answer(context(ENVELOPE), body)
    assert (response.error_code, response.response_data) == (code, None)
