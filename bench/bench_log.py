"""Storage engine benchmark: append and read throughput, recovery time of a 1 GB log.

    python bench/bench_log.py [--gb 1.0] [--batch-kb 1024] [--dir /dev/shm] [--recovery-dir /tmp] [--json]

Prints a table (or JSON). Appends are compared with a plain sequential os.write of the same bytes
in the same run, interleaved batch by batch, medians over --rounds. By default this runs on
tmpfs (/dev/shm), where both are pure page-cache writes: the ratio is then the engine's own cost
(validation, CRC-32C, offsets, index) rather than the disk's mood; pass --dir to compare on a disk.
Recovery is timed on --recovery-dir after an unclean shutdown (no clean-shutdown marker, recovery
point 0: every batch is CRC-checked), once with the file in the page cache and once after evicting
it (fsync + posix_fadvise DONTNEED). Free space is checked first; temporary files are removed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from broker.log import Log, LogConfig, create_log, load_log  # noqa: E402
from protocol.records import build_batch  # noqa: E402

MB = 1024 * 1024


def make_batch(batch_bytes: int, record_bytes: int = 1024) -> bytes:
    """A batch of 1 KiB records no larger than `batch_bytes` (1 MiB fits max.message.bytes)."""
    value = os.urandom(record_bytes)
    count = max(1, batch_bytes // (record_bytes + 16))
    while True:
        batch = build_batch([(b"key-%08d" % i, value) for i in range(count)])
        if len(batch) <= batch_bytes or count == 1:
            return batch
        count -= 1


def evict(path: str) -> None:
    """Drop a file's pages from the page cache (it must be clean: fsync first)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def bench_plain_write(path: str, batch: bytes, n: int) -> float:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        start = time.perf_counter()
        for _ in range(n):
            view = memoryview(batch)
            while view:
                view = view[os.write(fd, view) :]
        elapsed = time.perf_counter() - start
        os.fsync(fd)
        return elapsed
    finally:
        os.close(fd)


def default_append_dir() -> str:
    return (
        "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    )


def timed_append(root: str, name: str, cfg: LogConfig, batch: bytes, n: int) -> tuple[float, Log]:
    log = create_log(root, name, 0, cfg)
    start = time.perf_counter()
    for _ in range(n):
        log.append(batch)
    return time.perf_counter() - start, log


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gb", type=float, default=1.0, help="log size to write (GiB)")
    parser.add_argument("--batch-kb", type=int, default=1024, help="batch size (KiB)")
    parser.add_argument(
        "--dir",
        default=default_append_dir(),
        help="append/read comparison (default /dev/shm: measures the engine, not the disk)",
    )
    parser.add_argument(
        "--recovery-dir", default=tempfile.gettempdir(), help="where the recovery log goes (a disk)"
    )
    parser.add_argument("--rounds", type=int, default=5, help="append/plain-write rounds (median)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    batch = make_batch(args.batch_kb * 1024)
    n = max(1, int(args.gb * 1024 * MB) // len(batch))
    total = n * len(batch)
    for where, needed in ((args.dir, total + 256 * MB), (args.recovery_dir, total + 256 * MB)):
        free = shutil.disk_usage(where).free
        if free < needed:
            sys.exit(f"need {needed / MB:.0f} MiB free in {where}, have {free / MB:.0f} MiB (lower --gb)")

    root = tempfile.mkdtemp(prefix="bench-log-", dir=args.dir)
    disk_root = tempfile.mkdtemp(prefix="bench-log-recovery-", dir=args.recovery_dir)
    results: dict[str, Any] = {"append_dir": args.dir, "recovery_dir": args.recovery_dir}
    cfg = LogConfig()  # Kafka defaults: 1 GiB segments, 4 KiB index interval, max.message.bytes 1 MiB
    try:
        # -- append vs plain write of the same bytes, interleaved batch by batch (a Log.append, then
        # an os.write of the same batch to a plain file), so both see the same machine at the same
        # moment; the medians over --rounds are reported.
        bench_plain_write(os.path.join(root, "warm-up.bin"), batch, n)  # the first big write is slower
        os.unlink(os.path.join(root, "warm-up.bin"))
        plain_times, append_times = [], []
        log: Log | None = None
        for round_no in range(args.rounds):
            if log is not None:
                log.close_handles()
                shutil.rmtree(log.dir)
            log = create_log(root, f"bench{round_no}", 0, cfg)
            path = os.path.join(root, "plain.bin")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            plain = appended = 0.0
            clock = time.perf_counter
            for i in range(n):
                if i % 2:  # alternate which goes first (the second finds the batch in CPU caches)
                    t0 = clock()
                    log.append(batch)
                    t1 = clock()
                    os.write(fd, batch)
                    t2 = clock()
                    appended += t1 - t0
                    plain += t2 - t1
                else:
                    t0 = clock()
                    os.write(fd, batch)
                    t1 = clock()
                    log.append(batch)
                    t2 = clock()
                    plain += t1 - t0
                    appended += t2 - t1
            os.close(fd)
            os.unlink(path)
            plain_times.append(plain)
            append_times.append(appended)
        assert log is not None
        results["plain_write_MBps"] = total / MB / statistics.median(plain_times)
        results["append_MBps"] = total / MB / statistics.median(append_times)
        results["append_vs_plain"] = results["append_MBps"] / results["plain_write_MBps"]
        results["appends_per_s"] = n / statistics.median(append_times)
        results["append_overhead_us"] = (
            1e6 * (statistics.median(append_times) - statistics.median(plain_times)) / n
        )
        results["append_vs_plain_per_round"] = [round(p / a, 2) for p, a in zip(plain_times, append_times)]

        # -- reads: 1 MiB fetches (every batch has the same size and record count) -----------------
        per_batch = _records(batch)
        start = time.perf_counter()
        offset, read_bytes = 0, 0
        while offset < log.log_end_offset:
            data = log.read(offset, MB).records.read()
            read_bytes += len(data)
            offset += per_batch * (len(data) // len(batch))
        results["read_MBps"] = read_bytes / MB / (time.perf_counter() - start)
        start = time.perf_counter()
        offset, fetches = 0, 0
        while offset < log.log_end_offset:
            info = log.read(offset, MB)
            fetches += 1
            offset += per_batch * (info.records.length // len(batch))
        results["read_slices_per_s"] = fetches / (time.perf_counter() - start)
        log.close_handles()
        shutil.rmtree(root, ignore_errors=True)

        # -- recovery after an unclean shutdown, on a real disk --------------------------------------
        elapsed, disk_log = timed_append(disk_root, "recover", cfg, batch, n)
        results["disk_append_MBps"] = total / MB / elapsed
        disk_log.flush()
        disk_log.closed = True  # kill -9: no close, no clean-shutdown marker
        directory = disk_log.dir
        for label, cold in (("recovery_hot_s", False), ("recovery_cold_s", True)):
            if cold:
                for name in os.listdir(directory):
                    evict(os.path.join(directory, name))
            start = time.perf_counter()
            recovered, stats = load_log(directory, cfg, had_clean_shutdown=False, recovery_point=0)
            results[label] = time.perf_counter() - start
            assert stats.truncated_bytes == 0 and recovered.log_end_offset == disk_log.log_end_offset
            recovered.closed = True
        results["recovered_GB"] = total / (1024 * MB)
        start = time.perf_counter()
        load_log(directory, cfg, had_clean_shutdown=True, recovery_point=disk_log.log_end_offset)
        results["clean_open_s"] = time.perf_counter() - start
    finally:
        shutil.rmtree(root, ignore_errors=True)
        shutil.rmtree(disk_root, ignore_errors=True)

    results["batch_KiB"] = len(batch) / 1024
    results["batches"] = n
    if args.json:
        print(json.dumps(results, indent=2))
        return
    gib = results["recovered_GB"]
    rows = [
        ("batch size", f"{results['batch_KiB']:.0f} KiB x {n}"),
        (f"plain sequential write ({args.dir})", f"{results['plain_write_MBps']:.0f} MiB/s"),
        ("Log.append", f"{results['append_MBps']:.0f} MiB/s ({results['appends_per_s']:.0f} appends/s)"),
        ("append / plain write (median)", f"{100 * results['append_vs_plain']:.0f} %"),
        ("engine cost per append", f"{results['append_overhead_us']:.0f} us"),
        ("  per round", " ".join(f"{100 * r:.0f}%" for r in results["append_vs_plain_per_round"])),
        ("Log.read + FileSlice.read (1 MiB)", f"{results['read_MBps']:.0f} MiB/s"),
        ("Log.read slices only", f"{results['read_slices_per_s']:.0f} fetches/s"),
        (f"Log.append to {args.recovery_dir}", f"{results['disk_append_MBps']:.0f} MiB/s"),
        (f"recovery of {gib:.2f} GiB, page cache hot", f"{results['recovery_hot_s']:.2f} s"),
        (f"recovery of {gib:.2f} GiB, page cache cold", f"{results['recovery_cold_s']:.2f} s"),
        ("open after clean shutdown", f"{1000 * results['clean_open_s']:.1f} ms"),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def _records(batch: bytes) -> int:
    return int.from_bytes(batch[57:61], "big")


if __name__ == "__main__":
    main()
