"""Client quotas on the share APIs over raw frames, default quota settings (11 samples of 1 s):
consumer_byte_rate bounds a ShareFetch's MaxBytes and throttles it as Fetch (answered empty but
for its acknowledgements, throttle_time_ms as Kafka computes it, then the connection muted), the
records a throttled fetch acquired stay acquired until their lock runs out, as in Kafka;
request_percentage throttles ShareFetch and ShareAcknowledge."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocol import messages as M
from protocol.records import build_batch
from tests.harness import RawClient
from tests.integration.test_security_quotas import alter, entry
from tests.integration.test_server_support import BrokerThread, metadata, produce
from tests.integration.test_share_raw import Share, ack, acquired, partition_of

RATE = 1000  # bytes per second: 10,000 bytes a fetch at most (the quota over 10 full windows)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[BrokerThread]:
    with BrokerThread(tmp_path) as bt:
        yield bt


def batch_of(n: int, size: int) -> bytes:
    return build_batch([(None, b"x" * size)] * n, base_timestamp=None)


def test_consumer_byte_rate_throttles_share_fetch(broker: BrokerThread) -> None:
    admin = broker.client("admin")
    slow = RawClient(broker.port, "slow")
    s = Share(broker, admin, records=0)
    first, second = batch_of(10, 600), batch_of(10, 600)
    assert produce(admin, s.topic, 0, first).error_code == 0
    assert produce(admin, s.topic, 0, second).error_code == 0
    assert alter(admin, entry({"client-id": "slow"}, {"consumer_byte_rate": float(RATE)})) == [(0, None)]
    s.client = slow
    s.join()

    # MaxBytes 1 MB is bounded to 10,000: only the first batch fits, 6,3xx bytes, within the quota
    one = s.fetch(0, [0])
    assert (one.throttle_time_ms, acquired(one)) == (0, [(0, 9, 1)])
    assert len(partition_of(one).records) == len(first)

    # the second takes the rate to (first + second) / W over 1,000 (W: 10 s and the moments since
    # the first sample): throttled by (rate - quota) / quota x W = (first + second) / quota - W,
    # answered empty but for the acknowledgement of the first batch
    before = time.monotonic()
    two = s.fetch(1, [0], acks={0: [ack(0, 9)]})
    expected = (len(first) + len(second)) * 1000 // RATE - 10_000
    assert expected - 1_000 < two.throttle_time_ms <= expected
    assert [(p.partition_index, p.acknowledge_error_code, p.acquired_records) for t in two.responses
            for p in t.partitions] == [(0, 0, [])]

    # what it had acquired stays acquired (Kafka's throttleResponse leaves the records to their
    # acquisition lock): another member, whose client id has no quota, gets nothing yet
    other = Share.__new__(Share)
    other.__dict__.update(s.__dict__, client=broker.client("fast"), member=uuid.uuid4().hex[:22], epoch=0)
    other.join()
    assert acquired(other.fetch(0, [0], max_wait_ms=0)) == []

    # and the throttled connection takes no request before its throttle time has passed (KIP-219)
    metadata(slow, [])
    assert time.monotonic() - before >= two.throttle_time_ms / 1000.0 * 0.9
    for c in (slow, admin, other.client):
        c.close()


def test_request_percentage_throttles_share_fetch_and_acknowledge(broker: BrokerThread) -> None:
    admin = broker.client("admin")
    busy = RawClient(broker.port, "busy")
    s = Share(broker, admin, records=10)
    assert alter(admin, entry({"client-id": "busy"}, {"request_percentage": 0.01})) == [(0, None)]
    s.client = busy
    s.join()
    fetched = s.fetch(0, [0])
    assert acquired(fetched) == [(0, 9, 1)]  # a request quota throttles, but the response is whole
    throttles = [fetched.throttle_time_ms]
    epoch = 1
    for offset in range(10):
        if throttles[-1]:
            break
        throttles.append(s.acknowledge(epoch, {0: [M.ShareAcknowledgeRequest.AcknowledgementBatch(
            first_offset=offset, last_offset=offset, acknowledge_types=[1])]}).throttle_time_ms)
        epoch += 1
    assert 0 < throttles[-1] <= 1000, throttles  # bounded to one window, as Kafka bounds request throttles
    busy.close()
    admin.close()
