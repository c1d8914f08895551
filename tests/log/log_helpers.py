"""Helpers for the storage engine tests: a controllable clock, batch builders, restarts."""

from __future__ import annotations

import os
from collections.abc import Iterator

from broker.log import LoadStats, Log, LogConfig, create_log, load_log
from protocol.records import build_batch, decode_batch, iter_batches

T0 = 1_700_000_000_000


class Clock:
    def __init__(self, now: int = T0) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now

    def advance(self, ms: int) -> None:
        self.now += ms


def small_config(**overrides: object) -> LogConfig:
    base: dict[str, object] = {"segment_bytes": 4096, "index_interval_bytes": 256}
    base.update(overrides)
    return LogConfig(**base)  # type: ignore[arg-type]


def batch(
    values: list[bytes | None] | int = 1,
    *,
    keys: list[bytes | None] | None = None,
    ts: int | None = T0,
    size: int = 40,
    **kwargs: object,
) -> bytes:
    """A client-style batch (base offset 0). `values` may be a count of `size`-byte values."""
    if isinstance(values, int):
        values = [bytes([65 + i % 26]) * size for i in range(values)]
    if keys is None:
        keys = [b"k%d" % i for i in range(len(values))]
    records = [(k, v, (), ts) for k, v in zip(keys, values)]
    return build_batch(records, **kwargs)  # type: ignore[arg-type]


def offsets_of(data: bytes) -> list[int]:
    """Every record offset in some bytes of batches."""
    out: list[int] = []
    for pos, _ in iter_batches(data):
        out.extend(r.offset for r in decode_batch(data, pos)[1])
    return out


def batch_ranges(data: bytes) -> list[tuple[int, int]]:
    return [(h.base_offset, h.last_offset) for _, h in iter_batches(data)]


def read_all(log: Log, start: int | None = None, max_bytes: int = 1 << 30) -> bytes:
    """Every batch from `start` (default log start) to the end, across segments."""
    offset = log.log_start_offset if start is None else start
    out = bytearray()
    while offset < log.log_end_offset:
        data = log.read(offset, max_bytes).records.read()
        if not data:
            break
        out += data
        offset = [h for _, h in iter_batches(data)][-1].next_offset
    return bytes(out)


def reopen(
    log: Log,
    *,
    clean: bool,
    clock: Clock | None = None,
    config: LogConfig | None = None,
    recovery_point: int = 0,
) -> Log:
    """Simulate a restart: a clean one closes the log first; an unclean one (kill -9) just drops it,
    with `recovery_point` as the last checkpointed one."""
    return reopen_with_stats(log, clean=clean, clock=clock, config=config, recovery_point=recovery_point)[0]


def reopen_with_stats(
    log: Log,
    *,
    clean: bool,
    clock: Clock | None = None,
    config: LogConfig | None = None,
    recovery_point: int = 0,
) -> tuple[Log, LoadStats]:
    if clean:
        log.close()
        point = log.recovery_point
    else:
        point = recovery_point
        log.closed = True
    return load_log(
        log.dir,
        config or log.config,
        had_clean_shutdown=clean,
        recovery_point=point,
        log_start_offset=log.log_start_offset,
        time=clock or log.time,
    )


def new_log(
    tmp_path: os.PathLike[str], clock: Clock, config: LogConfig | None = None, topic: str = "t"
) -> Log:
    return create_log(str(tmp_path), topic, 0, config or small_config(), time=clock)


def files(log: Log) -> list[str]:
    return sorted(os.listdir(log.dir))


def segment_files(log: Log) -> Iterator[str]:
    return (f for f in files(log) if f.endswith(".log"))
