"""Client quotas without a network: Kafka's Rate, the order in which quota entities apply, the
throttle time, and the CPU metering of a handler."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from broker.security.quotas import (
    CLIENT_ID,
    PRODUCER_BYTE_RATE,
    REQUEST_PERCENTAGE,
    USER,
    ClientQuotas,
    QuotaManager,
    Rate,
    _Metered,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_rate_counts_at_least_n_minus_one_windows() -> None:
    rate = Rate(11, 1000)
    rate.record(1000.0, 0)
    assert rate.window_size_ms(0) == 10_000  # a fresh rate assumes ten whole windows
    assert rate.measure(0) == 100.0
    for second in range(1, 30):
        rate.record(1000.0, second * 1000)
    assert 990 <= rate.measure(29_000) <= 1100  # 1000 per second once the samples span the window
    assert rate.measure(200_000) == 0.0  # every sample expired


def test_quota_precedence_and_shared_rates() -> None:
    quotas = {
        ((CLIENT_ID, None),): {PRODUCER_BYTE_RATE: 1.0},
        ((USER, "alice"),): {PRODUCER_BYTE_RATE: 2.0},
        ((CLIENT_ID, "app"), (USER, "alice")): {PRODUCER_BYTE_RATE: 3.0},
        ((USER, None),): {REQUEST_PERCENTAGE: 5.0},
    }
    m = QuotaManager(PRODUCER_BYTE_RATE, 11, 1, Clock())
    assert m.quota_of(quotas, "alice", "app") == (((CLIENT_ID, "app"), (USER, "alice")), 3.0)
    assert m.quota_of(quotas, "alice", "other") == (((USER, "alice"),), 2.0)
    assert m.quota_of(quotas, "bob", "x") == (((CLIENT_ID, None),), 1.0)  # the default user has no byte rate
    assert QuotaManager(REQUEST_PERCENTAGE, 11, 1, Clock()).quota_of(quotas, "bob", "x") == (((USER, None),), 5.0)


def test_throttle_time_brings_the_rate_back_to_the_bound() -> None:
    clock = Clock()
    m = QuotaManager(PRODUCER_BYTE_RATE, 11, 1, clock)
    quota = (((USER, "alice"),), 100.0)
    assert m.record(quota, 1000) == 0  # 1000 bytes over 10 s: at the bound
    # 2000 more: 3000 over 10 s is 300/s, (300 - 100) / 100 x 10 s
    assert m.record(quota, 2000) == 20_000
    assert m.record(quota, 10_000, max_throttle_ms=1000) == 1000
    assert m.max_value_in_window(quota) == 1000.0


def test_client_quotas_follow_the_image() -> None:
    image = SimpleNamespace(client_quotas={}, quota_version=0)
    quotas = ClientQuotas(image)
    assert not quotas.active
    image.client_quotas[((CLIENT_ID, "app"),)] = {PRODUCER_BYTE_RATE: 10.0}
    image.quota_version += 1
    quotas.refresh()
    assert quotas.active
    ctx = SimpleNamespace(client_id="app", connection=SimpleNamespace(principal="User:ANONYMOUS"))
    assert quotas.record_produce(ctx, 100) == 0
    assert quotas.record_produce(ctx, 1000) > 0


def test_metered_counts_only_the_handlers_own_cpu() -> None:
    async def handler() -> int:
        total = sum(range(200_000))  # some CPU
        await asyncio.sleep(0.05)  # waiting costs nothing
        return total

    async def main() -> tuple[Any, float]:
        metered = _Metered(handler())
        return await metered, metered.cpu

    result, cpu = asyncio.run(main())
    assert result == sum(range(200_000))
    assert 0 < cpu < 0.05
