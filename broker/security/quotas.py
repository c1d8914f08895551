"""Client quotas: Kafka's ClientQuotaManager and ClientRequestQuotaManager.

Quotas are ClientQuotaRecords of the metadata log, set with AlterClientQuotas for user and/or
client-id entities (a null name is the entity's default) with the keys producer_byte_rate,
consumer_byte_rate (bytes per second) and request_percentage (percent of one request thread).

Which quota applies to a request (DefaultQuotaCallback), the first entity that has the key, in
this order: user+client-id, user+default client-id, user, default user+client-id, default
user+default client-id, default user, client-id, default client-id. Clients matching the same
entity share one rate (a user's quota bounds all of the user's clients together).

A rate is measured as Kafka's Rate over `quota.window.num` samples of
`quota.window.size.seconds` (11 x 1 s): the sum of the samples over the time they span, at least
n-1 whole windows. A request that takes the rate over the bound is answered with throttle_time_ms
= (rate - bound) / bound x window, and its connection takes no further request for that time
(KIP-219: the broker mutes the channel after the response). A produce's bytes are counted after
it is appended; a fetch (Fetch or ShareFetch) over its quota is answered empty (its bytes
uncounted) and its max_bytes is bounded by what the quota allows in a window; request time is the CPU time the event loop
spent in the handler, bounded to one window of throttling.

With no quota configured `active` is False and nothing is measured: the request path pays one
attribute read.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Coroutine, Generator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from broker.security.request import SecuredRequest
from protocol.messages import MessageBase

if TYPE_CHECKING:
    from broker.config import BrokerConfig
    from broker.metadata.image import MetadataImage

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
REQUEST_PERCENTAGE = "request_percentage"
CONTROLLER_MUTATION_RATE = "controller_mutation_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"
USER, CLIENT_ID, IP = "user", "client-id", "ip"
NANOS_TO_PERCENTAGE = 100.0 / 1e9

Entity = tuple[tuple[str, str | None], ...]
T = TypeVar("T")
Ctx = TypeVar("Ctx", bound=SecuredRequest)
Request = TypeVar("Request")
Response = TypeVar("Response", bound=MessageBase | None)


class Rate:
    """Kafka's Rate over a SampledStat (samples of `window_ms`, `samples` of them kept)."""

    __slots__ = ("samples", "window_ms", "_starts", "_last", "_values", "_current")

    def __init__(self, samples: int, window_ms: int) -> None:
        self.samples = samples
        self.window_ms = window_ms
        self._starts: list[int] = []
        self._last: list[int] = []
        self._values: list[float] = []
        self._current = 0

    def record(self, value: float, now_ms: int) -> None:
        if not self._starts:
            self._starts, self._last, self._values = [now_ms], [now_ms], [0.0]
        elif now_ms - self._starts[self._current] >= self.window_ms:
            self._current = (self._current + 1) % (self.samples + 1)  # one extra for an overlapping sample
            if self._current >= len(self._starts):
                self._starts.append(now_ms)
                self._last.append(now_ms)
                self._values.append(0.0)
            else:
                self._starts[self._current], self._values[self._current] = now_ms, 0.0
        i = self._current
        self._values[i] += value
        self._last[i] = now_ms

    def _purge(self, now_ms: int) -> None:
        expire = self.samples * self.window_ms
        for i, last in enumerate(self._last):
            if now_ms - last >= expire:
                self._starts[i], self._last[i], self._values[i] = now_ms, now_ms, 0.0

    def window_size_ms(self, now_ms: int) -> int:
        self._purge(now_ms)
        oldest = min(self._starts) if self._starts else now_ms
        elapsed = now_ms - oldest
        full = elapsed // self.window_ms
        if full < self.samples - 1:
            elapsed += (self.samples - 1 - full) * self.window_ms
        return max(elapsed, 1)

    def measure(self, now_ms: int) -> float:
        """Per second."""
        window = self.window_size_ms(now_ms)
        return sum(self._values) / (window / 1000.0)


def quota_entities(user: str, client_id: str) -> list[Entity]:
    """The entities whose quota may apply to a (user, client-id), in Kafka's order of precedence."""
    return [
        ((CLIENT_ID, client_id), (USER, user)),
        ((CLIENT_ID, None), (USER, user)),
        ((USER, user),),
        ((CLIENT_ID, client_id), (USER, None)),
        ((CLIENT_ID, None), (USER, None)),
        ((USER, None),),
        ((CLIENT_ID, client_id),),
        ((CLIENT_ID, None),),
    ]


class QuotaManager:
    """The quotas of one kind (a key: producer_byte_rate, consumer_byte_rate, request_percentage)."""

    def __init__(self, key: str, samples: int, window_s: int, clock: Callable[[], float]) -> None:
        self.key = key
        self.samples = samples
        self.window_ms = window_s * 1000
        self.clock = clock
        self.rates: dict[Entity, Rate] = {}
        self._resolved: dict[tuple[str, str], tuple[Entity, float] | None] = {}

    def reset(self) -> None:
        """Quotas changed: resolve again (rates of entities that keep their quota keep their samples)."""
        self._resolved.clear()

    def quota_of(self, quotas: dict[Entity, dict[str, float]], user: str, client_id: str) -> tuple[Entity, float] | None:
        key = (user, client_id)
        if key not in self._resolved:
            found = None
            for entity in quota_entities(user, client_id):
                value = quotas.get(entity, {}).get(self.key)
                if value is not None:
                    found = (entity, value)
                    break
            self._resolved[key] = found
        return self._resolved[key]

    def rate_of(self, entity: Entity) -> Rate:
        rate = self.rates.get(entity)
        if rate is None:
            rate = self.rates[entity] = Rate(self.samples, self.window_ms)
        return rate

    def record(self, quota: tuple[Entity, float], value: float, max_throttle_ms: int | None = None) -> int:
        """Record `value` against the quota; the throttle time in ms (0: within the quota)."""
        entity, bound = quota
        now_ms = int(self.clock() * 1000)
        rate = self.rate_of(entity)
        rate.record(value, now_ms)
        measured = rate.measure(now_ms)
        if measured <= bound:
            return 0
        throttle = round((measured - bound) / bound * rate.window_size_ms(now_ms))
        return min(throttle, max_throttle_ms) if max_throttle_ms is not None else throttle

    def unrecord(self, quota: tuple[Entity, float], value: float) -> None:
        self.rate_of(quota[0]).record(-value, int(self.clock() * 1000))

    def max_value_in_window(self, quota: tuple[Entity, float]) -> float:
        """The most that can be recorded without a guaranteed throttle (bounds a fetch's bytes)."""
        return quota[1] * (self.samples - 1) * (self.window_ms / 1000.0)


class _Metered(Generic[T]):
    """Awaits a coroutine, adding up the CPU time of its steps (not of what runs while it waits)."""

    __slots__ = ("coro", "cpu")

    def __init__(self, coro: Coroutine[Any, Any, T]) -> None:
        self.coro = coro
        self.cpu = 0.0

    def __await__(self) -> Generator[Any, Any, T]:
        coro, clock = self.coro, time.thread_time
        value: Any = None
        error: BaseException | None = None
        while True:
            start = clock()
            try:
                yielded = coro.send(value) if error is None else coro.throw(error)
            except StopIteration as stop:
                self.cpu += clock() - start
                return stop.value
            except BaseException:
                self.cpu += clock() - start
                raise
            self.cpu += clock() - start
            try:
                value, error = (yield yielded), None
            except BaseException as exc:  # cancelled while waiting: passed on to the coroutine
                value, error = None, exc


def throttle(ctx: SecuredRequest, response: MessageBase | None, throttle_ms: int) -> None:
    """Answer with throttle_time_ms (the larger of the quotas') and mute the connection after it.
    (Any response: those whose schema has a throttle_time_ms carry it.)"""
    if throttle_ms <= 0:
        return
    current = getattr(response, "throttle_time_ms", None)  # a field of most responses, not all
    if current is not None:
        response.throttle_time_ms = max(current, throttle_ms)  # type: ignore[union-attr, attr-defined]
    connection = ctx.connection
    connection.throttled_until = max(connection.throttled_until, time.monotonic() + throttle_ms / 1000.0)


def user_of(principal: str) -> str:
    """The user name quotas use: the principal's name (the `user` entity of Kafka's quotas)."""
    return principal.split(":", 1)[1] if ":" in principal else principal


class ClientQuotas:
    """The broker's client quotas, following the metadata image's ClientQuotaRecords."""

    def __init__(self, image: MetadataImage, samples: int = 11, window_s: int = 1,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.image = image
        self._version = -1
        self.active = False
        self.produce = QuotaManager(PRODUCER_BYTE_RATE, samples, window_s, clock)
        self.fetch = QuotaManager(CONSUMER_BYTE_RATE, samples, window_s, clock)
        self.request = QuotaManager(REQUEST_PERCENTAGE, samples, window_s, clock)
        self.max_request_throttle_ms = window_s * 1000
        self.refresh()

    @classmethod
    def from_config(cls, config: BrokerConfig, image: MetadataImage) -> ClientQuotas:
        return cls(image, int(config["quota.window.num"]), int(config["quota.window.size.seconds"]))

    def refresh(self) -> None:
        """Called when the image's quota version moved (AlterClientQuotas, start-up)."""
        if self._version == self.image.quota_version:
            return
        self._version = self.image.quota_version
        for manager in (self.produce, self.fetch, self.request):
            manager.reset()
        keys = {k for values in self.image.client_quotas.values() for k in values}
        self.active = bool(keys & {PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, REQUEST_PERCENTAGE})

    def _quota(self, manager: QuotaManager, ctx: SecuredRequest) -> tuple[Entity, float] | None:
        if self._version != self.image.quota_version:
            self.refresh()
        return manager.quota_of(self.image.client_quotas, user_of(ctx.connection.principal), ctx.client_id or "")

    def record_produce(self, ctx: SecuredRequest, size: int) -> int:
        quota = self._quota(self.produce, ctx)
        return self.produce.record(quota, size) if quota is not None else 0

    def fetch_quota(self, ctx: SecuredRequest) -> tuple[Entity, float] | None:
        return self._quota(self.fetch, ctx)

    def metered(self, handler: Callable[[Ctx, Request], Coroutine[Any, Any, Response]]
                ) -> Callable[[Ctx, Request], Coroutine[Any, Any, Response]]:
        """The handler, its CPU time recorded against the request_percentage quota."""

        async def run(ctx: Ctx, request: Request) -> Response:
            metered = _Metered(handler(ctx, request))
            response = await metered
            throttle(ctx, response, self.record_request_time(ctx, metered.cpu))
            return response

        return run

    def record_request_time(self, ctx: SecuredRequest, cpu_seconds: float) -> int:
        quota = self._quota(self.request, ctx)
        if quota is None:
            return 0
        return self.request.record(quota, cpu_seconds * 1e9 * NANOS_TO_PERCENTAGE, self.max_request_throttle_ms)
