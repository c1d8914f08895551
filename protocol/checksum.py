"""CRC-32C (Castagnoli), the checksum of record batches and of Kafka's snapshot files.

`crc32c(data) -> int`, called as `checksum.crc32c(...)`: the crc32c package's (hardware CRC32
instructions where the CPU has them), imported at the first checksum. Its import costs more
than a broker's start-up should pay for it (it reads its own version through importlib.metadata,
and imports its command line), and a process that only imports the broker never checksums. The
first call puts the package's function in this module's place, so every later call reaches it
directly, at the cost of the module attribute lookup a call to `crc32c.crc32c` always had.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _first(data: Any) -> int:  # bytes-like
    global crc32c
    from crc32c import crc32c as native

    crc32c = native
    return native(data)


crc32c: Callable[[Any], int] = _first
