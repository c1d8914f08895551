"""Coordinators: pure shards run by a generic runtime (see DESIGN.md, "Coordinators").

`runtime.CoordinatorRuntime` hosts one shard per internal-topic partition and runs its
operations one at a time; `timer` gives shards keyed timers on an injected clock; `result`
holds what an operation returns. `group/` is the group coordinator shard.
"""

from broker.coordinator.result import CoordinatorResult, Deferred, Record
from broker.coordinator.runtime import (
    CoordinatorRuntime,
    InMemoryWriter,
    PartitionWriter,
    java_string_hashcode,
)
from broker.coordinator.timer import AsyncioClock, Clock, CoordinatorTimer, ManualClock, Timer

__all__ = [
    "AsyncioClock",
    "Clock",
    "CoordinatorResult",
    "CoordinatorRuntime",
    "CoordinatorTimer",
    "Deferred",
    "InMemoryWriter",
    "ManualClock",
    "PartitionWriter",
    "Record",
    "Timer",
    "java_string_hashcode",
]
