"""Offset and time indexes: Kafka's entry formats, lookups, truncation, sanity checks."""

from __future__ import annotations

import struct

import pytest

from broker.log.index import CorruptIndexError, OffsetIndex, TimeIndex


def test_offset_index_file_format_and_lookup(tmp_path) -> None:
    idx = OffsetIndex(str(tmp_path / "00000000000000000100.index"), 100, max_index_bytes=80)
    assert idx.lookup(150) == (100, 0)
    idx.append(105, 300)
    idx.append(110, 700)
    idx.append(120, 1500)
    raw = (tmp_path / "00000000000000000100.index").read_bytes()
    assert raw == struct.pack(">iiiiii", 5, 300, 10, 700, 20, 1500)
    assert idx.lookup(99) == (100, 0)
    assert idx.lookup(105) == (105, 300)
    assert idx.lookup(109) == (105, 300)
    assert idx.lookup(10_000) == (120, 1500)
    assert idx.lookup_position(699) == (105, 300)
    assert idx.lookup_position(700) == (110, 700)
    with pytest.raises(ValueError):
        idx.append(120, 2000)
    idx.truncate_to(110)
    assert idx.entries == 1 and idx.last_offset == 105
    assert (tmp_path / "00000000000000000100.index").stat().st_size == 8
    idx.close()
    again = OffsetIndex(idx.path, 100, 80)
    again.load()
    again.check(log_size=1000)
    assert again.entries == 1


def test_offset_index_checks(tmp_path) -> None:
    path = tmp_path / "00000000000000000000.index"
    path.write_bytes(struct.pack(">ii", 5, 100) + b"\x00\x00")
    idx = OffsetIndex(str(path), 0, 80)
    with pytest.raises(CorruptIndexError):
        idx.load()
    path.write_bytes(struct.pack(">iiii", 5, 100, 3, 200))
    idx.load()
    with pytest.raises(CorruptIndexError):
        idx.check(1000)
    path.write_bytes(struct.pack(">ii", 5, 5000))
    idx.load()
    with pytest.raises(CorruptIndexError):
        idx.check(1000)


def test_full_index(tmp_path) -> None:
    idx = OffsetIndex(str(tmp_path / "0.index"), 0, max_index_bytes=16)
    idx.append(1, 10)
    assert not idx.is_full
    idx.append(2, 20)
    assert idx.is_full
    tidx = TimeIndex(str(tmp_path / "0.timeindex"), 0, max_index_bytes=36)  # 3 entries
    tidx.maybe_append(10, 1)
    assert not tidx.is_full
    tidx.maybe_append(20, 2)
    assert tidx.is_full  # Kafka keeps the last slot for the entry written at roll


def test_time_index_format_lookup_and_rules(tmp_path) -> None:
    path = tmp_path / "00000000000000000050.timeindex"
    tidx = TimeIndex(str(path), 50, max_index_bytes=1200)
    assert tidx.last_entry == (-1, 50)
    tidx.maybe_append(1000, 55)
    tidx.maybe_append(1000, 56)  # same timestamp: nothing added
    tidx.maybe_append(2000, 60)
    assert path.read_bytes() == struct.pack(">qiqi", 1000, 5, 2000, 10)
    assert tidx.lookup(999) == (-1, 50)
    assert tidx.lookup(1500) == (1000, 55)
    assert tidx.lookup(5000) == (2000, 60)
    with pytest.raises(ValueError):
        tidx.maybe_append(3000, 58)
    tidx.truncate_to(60)
    assert tidx.last_entry == (1000, 55)
    tidx.check(next_offset=56)
    with pytest.raises(CorruptIndexError):
        tidx.check(next_offset=55)
