"""Share sessions (Kafka's ShareSessionCache and newContext rules): epochs, errors, the limit."""

from __future__ import annotations

import uuid

import pytest

from broker.share.session import FINAL_EPOCH, INITIAL_EPOCH, ShareSessionCache, next_epoch
from protocol.errors import ErrorCode, KafkaError

E = ErrorCode
TP = (uuid.uuid4(), 0)


def error_of(call: object, *args: object) -> ErrorCode:
    with pytest.raises(KafkaError) as err:
        call(*args)  # type: ignore[operator]
    return err.value.code


def test_epochs_advance_and_wrong_ones_are_refused() -> None:
    cache = ShareSessionCache()
    assert error_of(cache.fetch, "g", "m", 1, [TP], [], False) == E.SHARE_SESSION_NOT_FOUND
    session = cache.fetch("g", "m", INITIAL_EPOCH, [TP], [], False)
    assert session is not None and session.epoch == 1 and list(session.partitions) == [TP]
    assert error_of(cache.fetch, "g", "m", 5, [], [], False) == E.INVALID_SHARE_SESSION_EPOCH
    assert cache.fetch("g", "m", 1, [], [TP], True).epoch == 2  # type: ignore[union-attr]
    assert error_of(cache.acknowledge, "g", "m", 1) == E.INVALID_SHARE_SESSION_EPOCH
    cache.acknowledge("g", "m", 2)
    assert cache.get(("g", "m")).epoch == 3  # type: ignore[union-attr]
    assert error_of(cache.acknowledge, "g", "m", INITIAL_EPOCH) == E.INVALID_SHARE_SESSION_EPOCH
    assert cache.fetch("g", "m", FINAL_EPOCH, [], [], True) is None  # the caller closes it once answered
    assert error_of(cache.fetch, "g", "m", FINAL_EPOCH, [TP], [], False) == E.INVALID_REQUEST


def test_an_initial_fetch_may_not_acknowledge_and_the_limit_holds() -> None:
    cache = ShareSessionCache(max_sessions=1)
    assert error_of(cache.fetch, "g", "m", INITIAL_EPOCH, [TP], [], True) == E.INVALID_REQUEST
    cache.fetch("g", "m", INITIAL_EPOCH, [TP], [], False)
    assert error_of(cache.fetch, "g", "other", INITIAL_EPOCH, [TP], [], False) == E.SHARE_SESSION_LIMIT_REACHED
    assert cache.fetch("g", "m", INITIAL_EPOCH, [TP], [], False) is not None  # the member's own, renewed


def test_the_epoch_wraps_to_one_and_closed_connections_end_their_sessions() -> None:
    assert next_epoch(2**31 - 1) == 1
    cache = ShareSessionCache()
    conn = object()
    cache.fetch("g", "a", INITIAL_EPOCH, [TP], [], False, conn)
    cache.fetch("g", "b", INITIAL_EPOCH, [TP], [], False, object())
    assert [s.key for s in cache.on_connection_closed(conn)] == [("g", "a")]
    assert cache.get(("g", "a")) is None and cache.get(("g", "b")) is not None


def test_the_partitions_keep_the_order_they_joined_in() -> None:
    """A fetch rotates them by its epoch (ShareSession.update keeps a partition added again in
    its place; one forgotten and added again goes last)."""
    a, b, c = ((TP[0], i) for i in range(3))
    cache = ShareSessionCache()
    cache.fetch("g", "m", INITIAL_EPOCH, [a, b], [], False)
    assert list(cache.fetch("g", "m", 1, [c, a], [], False).partitions) == [a, b, c]  # type: ignore[union-attr]
    assert list(cache.fetch("g", "m", 2, [], [a], False).partitions) == [b, c]  # type: ignore[union-attr]
    assert list(cache.fetch("g", "m", 3, [a], [], False).partitions) == [b, c, a]  # type: ignore[union-attr]
