"""Throughput of protocol.records: batch validation (the produce/recovery hot path), header
mutators, and build/decode per compression codec.

    PYTHONPATH=. python bench/bench_records.py [--json]

Goal: validate_batch >= 1 GB/s on a 1 MB batch.
"""

from __future__ import annotations

import argparse
import functools
import json
import random
import time
from collections.abc import Callable
from typing import Any

from protocol.compression import CODEC_NAMES, compress, decompress
from protocol.records import (
    build_batch,
    decode_batch,
    iter_batches,
    set_base_offset,
    set_log_append_time,
    set_partition_leader_epoch,
    validate_batch,
)


def best_seconds(fn: Callable[[], object], min_time: float = 0.3, repeats: int = 5) -> float:
    """Best per-call time over ``repeats`` rounds, each running at least ``min_time`` seconds."""
    best = float("inf")
    for _ in range(repeats):
        n, start = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - start
            if elapsed >= min_time:
                break
        best = min(best, elapsed / n)
    return best


def sample_records(count: int, value_size: int, seed: int = 1) -> list[tuple[bytes, bytes, list[Any], int]]:
    """Semi-compressible JSON-like values, like typical event payloads."""
    rng = random.Random(seed)
    words = [b"user", b"click", b"view", b"cart", b"page", b"session", b"id", b"ts", b"ok"]
    out = []
    for i in range(count):
        value = bytearray(b'{"seq":%d,' % i)
        while len(value) < value_size:
            value += b'"%s":"%x",' % (rng.choice(words), rng.getrandbits(32))
        out.append(
            (
                b"key-%d" % (i % 100),
                bytes(value[:value_size]),
                [("trace", b"%08x" % i)],
                1_700_000_000_000 + i,
            )
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args()
    rows: list[dict[str, object]] = []

    # 1 MB uncompressed batch: 1000 records of ~1 KB
    big = build_batch(sample_records(1000, 1000))
    view = memoryview(big)
    t = best_seconds(lambda: validate_batch(view))
    rows.append({"case": "validate_batch 1 MB", "GB/s": len(big) / t / 1e9, "us/op": t * 1e6})

    # a 16 MB segment of 16 KB batches: recovery-style scan with CRC checks
    small = build_batch(sample_records(16, 1000))
    segment = memoryview(small * (16 * 1024 * 1024 // len(small)))
    t = best_seconds(lambda: sum(1 for _ in iter_batches(segment, validate=True)))
    n_batches = len(segment) // len(small)
    rows.append(
        {
            "case": f"iter_batches+validate 16 MB ({len(small) // 1024} KB batches)",
            "GB/s": len(segment) / t / 1e9,
            "us/op": t / n_batches * 1e6,
        }
    )

    buf = bytearray(big)

    def stamp() -> None:
        set_base_offset(buf, 0, 123)
        set_partition_leader_epoch(buf, 0, 4)

    t = best_seconds(stamp)
    rows.append({"case": "set_base_offset+leader_epoch", "us/op": t * 1e6})
    t = best_seconds(lambda: set_log_append_time(buf, 0, 1_800_000_000_000))
    rows.append({"case": "set_log_append_time 1 MB (CRC)", "GB/s": len(buf) / t / 1e9, "us/op": t * 1e6})

    records = sample_records(1000, 200)
    raw = sum(len(k) + len(v) for k, v, _, _ in records)
    section_size = len(build_batch(records)) - 61
    for codec in CODEC_NAMES:
        batch = build_batch(records, compression=codec)
        t_build = best_seconds(functools.partial(build_batch, records, compression=codec))
        t_decode = best_seconds(functools.partial(decode_batch, batch))
        rows.append(
            {
                "case": f"build {CODEC_NAMES[codec]} (1000 x 200 B)",
                "MB/s": raw / t_build / 1e6,
                "krec/s": 1000 / t_build / 1e3,
                "ratio": section_size / (len(batch) - 61),
            }
        )
        rows.append(
            {
                "case": f"decode {CODEC_NAMES[codec]} (1000 x 200 B)",
                "MB/s": raw / t_decode / 1e6,
                "krec/s": 1000 / t_decode / 1e3,
            }
        )

    section = build_batch(sample_records(4000, 250))[61:]
    for codec in list(CODEC_NAMES)[1:]:
        packed = compress(codec, section)
        t_c = best_seconds(functools.partial(compress, codec, section))
        t_d = best_seconds(functools.partial(decompress, codec, packed))
        rows.append(
            {
                "case": f"compress/decompress {CODEC_NAMES[codec]} 1 MB",
                "MB/s": len(section) / t_c / 1e6,
                "dMB/s": len(section) / t_d / 1e6,
                "ratio": len(section) / len(packed),
            }
        )

    if args.json:
        print(json.dumps(rows, indent=1))
        return
    columns = ["GB/s", "MB/s", "dMB/s", "krec/s", "us/op", "ratio"]
    width = max(len(str(r["case"])) for r in rows)
    print(f"{'case':<{width}}" + "".join(f"{c:>10}" for c in columns))
    for r in rows:
        cells = "".join(f"{r[c]:>10.2f}" if c in r else f"{'':>10}" for c in columns)  # type: ignore[str-format]
        print(f"{r['case']!s:<{width}}{cells}")


if __name__ == "__main__":
    main()
