"""What security reads of a request: `SecuredRequest`, which broker.apis.RequestContext (a layer
above) satisfies. Its members are read-only here, except the connection's throttle, which a
quota sets."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from broker.security.authorizer import Authorizer
    from broker.security.listeners import Listener


class Authorizing(Protocol):
    @property
    def authorizer(self) -> Authorizer | None: ...  # None: every operation is allowed


class Peer(Protocol):
    """The connection the request came in on."""

    throttled_until: float  # a quota's throttle: no request is taken before (monotonic seconds)

    @property
    def principal(self) -> str: ...

    @property
    def listener(self) -> Listener | None: ...


class SecuredRequest(Protocol):
    @property
    def broker(self) -> Authorizing: ...

    @property
    def connection(self) -> Peer: ...

    @property
    def client_host(self) -> str: ...

    @property
    def client_id(self) -> str | None: ...
