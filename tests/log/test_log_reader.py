"""Reading a whole log back (broker/log/reader.py): as records, and as (key, value) pairs for
replaying internal topics, from a log start that may fall inside a batch."""

from __future__ import annotations

from typing import Any

import pytest

from broker.log import create_log
from broker.log.reader import iter_batch_keys_values, iter_batch_records
from tests.log.log_helpers import batch, small_config


@pytest.mark.parametrize("start", [0, 2, 3, 5, 7, 9])
@pytest.mark.parametrize("compression", [0, 1])
def test_keys_values_are_the_records_keys_and_values(tmp_path: Any, start: int, compression: int) -> None:
    log = create_log(str(tmp_path), "t", 0, small_config())
    log.append(batch([b"a", b"b", b"c"], compression=compression))
    log.append(batch([b"d", None], keys=[b"k", None], compression=compression))
    log.append(batch([b"e", b"f", b"g", b"h"], compression=compression))
    log.delete_records_before(start)
    records = list(iter_batch_records(log))
    keys_values = list(iter_batch_keys_values(log))
    assert [h for h, _ in keys_values] == [h for h, _ in records]
    assert [kv for _, kvs in keys_values for kv in kvs] == [(r.key, r.value) for _, rs in records for r in rs]
    assert [r.offset for _, rs in records for r in rs] == list(range(start, 9))
    log.close()
