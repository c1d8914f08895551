"""The storage engine: Kafka's segment log on disk (no asyncio, no sockets; see DESIGN.md).

Entry points: `LogManager` (all partitions of `log.dirs`), `Log` (one partition), `LogConfig`
(topic configs), `LogCleaner` (compaction), `GroupCommit` (in broker.log.group_commit: one fsync
for many waiting appenders, the only asyncio-aware module).
"""

from broker.log.cleaner import CleanResult, LogCleaner
from broker.log.config import LogConfig
from broker.log.loader import LoadStats, create_log, load_log
from broker.log.log import AppendResult, FetchDataInfo, Log, TimestampAndOffset
from broker.log.manager import LogManager, StartupStats
from broker.log.segment import FileSlice, LogSegment
from broker.log.validation import AppendOrigin

__all__ = [
    "AppendOrigin",
    "AppendResult",
    "CleanResult",
    "FetchDataInfo",
    "FileSlice",
    "LoadStats",
    "Log",
    "LogCleaner",
    "LogConfig",
    "LogManager",
    "LogSegment",
    "StartupStats",
    "TimestampAndOffset",
    "create_log",
    "load_log",
]
