"""Property tests: random appends, reads, rolls, retention and restarts against an in-memory model;
random compaction against the latest-value-per-key rule."""

from __future__ import annotations

import os
import shutil
import tempfile

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from broker.log import Log, LogCleaner, create_log, load_log
from broker.log.config import LogConfig
from protocol.records import build_batch, decode_batch, iter_batches, parse_batch_header
from tests.log.log_helpers import Clock, read_all

SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

Batch = tuple[int, list[tuple[int, bytes, bytes | None, int]], int]  # base, records, size


def decode_all(data: bytes) -> list[tuple[int, bytes | None, bytes | None, int]]:
    out: list[tuple[int, bytes | None, bytes | None, int]] = []
    for pos, _ in iter_batches(data):
        out.extend((r.offset, r.key, r.value, r.timestamp) for r in decode_batch(data, pos)[1])
    return out


class LogModel(RuleBasedStateMachine):
    """The log must always hold exactly the model's batches from the log start on."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="logprop-")
        self.clock = Clock()
        self.config = LogConfig(
            segment_bytes=900, index_interval_bytes=120, retention_ms=50_000, file_delete_delay_ms=0
        )
        self.log: Log = create_log(self.root, "p", 0, self.config, time=self.clock)
        self.batches: list[Batch] = []
        self.start = 0
        self.recovery_point = 0

    def teardown(self) -> None:
        self.log.closed = True
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def end(self) -> int:
        return self.batches[-1][0] + len(self.batches[-1][1]) if self.batches else self.start

    def visible(self) -> list[Batch]:
        return [b for b in self.batches if b[0] + len(b[1]) > self.start]

    @initialize()
    def setup(self) -> None:
        pass

    @rule(count=st.integers(1, 4), size=st.integers(0, 150), gap=st.integers(0, 20_000))
    def append(self, count: int, size: int, gap: int) -> None:
        self.clock.advance(gap)
        records = [(b"k%d" % i, bytes([i + 65]) * size, (), self.clock.now) for i in range(count)]
        result = self.log.append(build_batch(records))
        assert result.first_offset == self.end
        base = result.first_offset
        self.batches.append(
            (
                base,
                [(base + i, r[0], r[1], r[3]) for i, r in enumerate(records)],
                parse_batch_header(build_batch(records)).size,
            )
        )

    @rule(data=st.data(), max_bytes=st.integers(1, 2000), bound_back=st.integers(0, 3))
    def read(self, data: st.DataObject, max_bytes: int, bound_back: int) -> None:
        visible = self.visible()
        if not visible:
            assert self.log.read(self.end, max_bytes).records.length == 0
            return
        offset = data.draw(st.integers(self.start, self.end))
        bound_batches = [b for b in self.batches if b[0] >= offset]
        bound = bound_batches[-bound_back][0] if bound_back and len(bound_batches) >= bound_back else self.end
        raw = self.log.read(offset, max_bytes, upper_bound=bound).records.read()
        got = decode_all(raw)
        batch_sizes = [h.size for _, h in iter_batches(raw)]
        assert sum(batch_sizes) == len(raw), "whole batches only"
        assert len(raw) <= max_bytes or len(batch_sizes) == 1, "max_bytes exceeded beyond the first batch"
        if offset >= bound:
            assert got == []
            return
        first = next(b for b in visible if b[0] + len(b[1]) > offset)
        if first[0] + len(first[1]) > bound:
            assert got == []
            return
        assert got, "at least one batch"
        expected = [r for b in visible if b[0] >= first[0] for r in b[1]][: len(got)]
        assert got == expected
        assert got[-1][0] < bound
        assert got[0][0] == first[0]

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule()
    def flush(self) -> None:
        self.recovery_point = self.log.flush()

    @rule(advance=st.integers(0, 100_000))
    def retention(self, advance: int) -> None:
        self.clock.advance(advance)
        before = self.log.log_start_offset
        self.log.delete_old_segments()
        after = self.log.log_start_offset
        assert after >= before
        for base, records, _ in self.batches:
            if base + len(records) <= after and base >= before:
                assert all(self.clock.now - ts > self.config.retention_ms for *_, ts in records)
        self.start = after

    @rule(data=st.data())
    def delete_records(self, data: st.DataObject) -> None:
        target = data.draw(st.integers(self.start, self.end))
        assert self.log.delete_records_before(target) == target
        self.start = target

    @rule(clean=st.booleans(), tear=st.integers(0, 30))
    def restart(self, clean: bool, tear: int) -> None:
        if clean:
            self.log.close()
            point = self.log.recovery_point
        else:
            self.log.closed = True
            point = self.recovery_point
            last = self.log.active_segment
            if tear and last.size and self.batches and self.batches[-1][0] >= max(last.base_offset, point):
                os.truncate(last.log_path, last.size - min(tear, self.batches[-1][2] - 1))
                self.batches.pop()  # the torn batch is gone, nothing before it
                if self.end < self.start:
                    self.batches = []  # Kafka's rule: a log ending below its start starts over there
        self.log, _ = load_log(
            self.log.dir,
            self.config,
            had_clean_shutdown=clean,
            recovery_point=point,
            log_start_offset=self.start,
            time=self.clock,
        )
        self.start = self.log.log_start_offset

    @invariant()
    def offsets_match(self) -> None:
        assert self.log.log_start_offset == self.start
        assert self.log.log_end_offset == self.end

    @invariant()
    def content_matches(self) -> None:
        expected = [r for b in self.visible() for r in b[1]]
        got = decode_all(read_all(self.log))
        assert got == expected


TestLogModel = LogModel.TestCase
TestLogModel.settings = SETTINGS


class CompactionModel(RuleBasedStateMachine):
    """After cleaning, every key's newest record is the model's newest write, nothing ever moves."""

    def __init__(self) -> None:
        super().__init__()
        self.root = tempfile.mkdtemp(prefix="compactprop-")
        self.clock = Clock()
        config = LogConfig(
            segment_bytes=600,
            index_interval_bytes=100,
            cleanup_policy=("compact",),
            delete_retention_ms=5_000,
        )
        self.log = create_log(self.root, "c", 0, config, time=self.clock)
        self.written: dict[int, tuple[bytes, bytes | None]] = {}
        self.cleaner = LogCleaner(time=self.clock)

    def teardown(self) -> None:
        self.log.closed = True
        shutil.rmtree(self.root, ignore_errors=True)

    @rule(
        keys=st.lists(st.integers(0, 6), min_size=1, max_size=4),
        tombstone=st.booleans(),
        codec=st.sampled_from([0, 0, 1, 4]),
    )
    def write(self, keys: list[int], tombstone: bool, codec: int) -> None:
        records = []
        for i, k in enumerate(keys):
            value = None if tombstone and i == 0 else b"v%d-%d" % (k, len(self.written))
            records.append((b"key%d" % k, value, (), self.clock.now))
        result = self.log.append(build_batch(records, compression=codec))
        for i, (key, value, _, _) in enumerate(records):
            self.written[result.first_offset + i] = (key, value)

    @rule()
    def roll(self) -> None:
        self.log.roll()

    @rule(advance=st.integers(0, 4_000))
    def clean(self, advance: int) -> None:
        self.clock.advance(advance)
        if self.cleaner.clean(self.log, force=True) is None:
            return
        end = self.log.cleaner_checkpoint
        assert end is not None
        latest_below: dict[bytes, int] = {}
        for offset, (key, _) in sorted(self.written.items()):
            if offset < end:
                latest_below[key] = offset
        for offset, got_key, _, _ in decode_all(read_all(self.log)):
            if offset < end:
                assert got_key is not None and latest_below[got_key] == offset, "superseded record kept"

    @rule(clean=st.booleans())
    def restart(self, clean: bool) -> None:
        if clean:
            self.log.close()
        else:
            self.log.closed = True
        self.log, _ = load_log(self.log.dir, self.log.config, had_clean_shutdown=clean, time=self.clock)

    @invariant()
    def latest_values_survive(self) -> None:
        got = decode_all(read_all(self.log))
        offsets = [r[0] for r in got]
        assert offsets == sorted(set(offsets)), "offsets only grow"
        for offset, key, value, _ in got:
            assert self.written[offset] == (key, value), "records keep their offset, key and value"
        latest: dict[bytes, tuple[int, bytes | None]] = {}
        for offset, (key, value) in sorted(self.written.items()):
            latest[key] = (offset, value)
        present = {key: (offset, value) for offset, key, value, _ in got}
        for key, (offset, value) in latest.items():
            if value is None:
                assert key not in present or present[key] == (offset, None)
            else:
                assert present.get(key) == (offset, value), f"latest value of {key!r} lost"
        assert self.log.log_end_offset == (max(self.written) + 1 if self.written else 0)


TestCompactionModel = CompactionModel.TestCase
TestCompactionModel.settings = SETTINGS
