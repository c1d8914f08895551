"""Log compaction (cleanup.policy=compact): keep the latest record per key.

One cleaning round of a log, Kafka's way:
1. The dirty range starts at the cleaner checkpoint (first dirty offset) and ends before the
   first uncleanable offset: the active segment, the last stable offset (passed by the broker)
   and segments younger than min.compaction.lag.ms. A round runs only when the dirty bytes are at
   least min.cleanable.dirty.ratio of the log (or max.compaction.lag.ms forces it).
2. An offset map (key -> latest offset) is built from the dirty range, skipping control batches
   and aborted transactional batches.
3. Every segment from the log start to the end of the map is rewritten, in groups of up to
   segment.bytes, into `.cleaned` files: a record survives when it is the latest for its key;
   tombstones survive until their batch's delete horizon (set to now + delete.retention.ms when a
   batch holding tombstones is first cleaned, as Kafka's hasDeleteHorizonMs attribute does).
   Batches keep their base offset, codec, producer fields and last offset delta, so offsets only
   have gaps; a batch emptied by cleaning is kept as an empty header when it is its producer's
   last data batch (producer state) or the last batch of the round (the log's last offset).
4. Each cleaned group replaces its segments under the log lock (`Log.replace_segments`), which
   refuses when retention or truncation changed those segments meanwhile.

Transactions, as Kafka's CleanedTransactionMetadata: the data of aborted transactions goes; a
transaction marker stays while data batches of its transaction remain, and the abort markers so
kept keep their entries in the cleaned segment's aborted-transaction index (.txnindex). A marker
whose transaction has no data left is first given a delete horizon (now + delete.retention.ms)
and removed by a round after it, unless it is its producer's last batch (kept empty, for the
epoch). Transactions still open are left alone, and the cleaning stops at the last stable offset
the broker passes.

Reads are never blocked: the old segment files stay open for slices already handed out.
Simplification: the offset map is a dict (bounded by `max_map_entries`, a round then stops at a
segment boundary).
"""

from __future__ import annotations

import time as _time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from broker.log.config import LONG_MAX
from broker.log.log import Log, wall_clock_ms
from broker.log.segment import INT32_MAX, LogSegment
from protocol.errors import ProtocolError
from protocol.records import (
    ATTRIBUTES_OFFSET,
    DELETE_HORIZON_FLAG_MASK,
    BatchHeader,
    ControlRecordType,
    Record,
    build_batch,
    decode_batch,
    parse_batch_header,
    parse_control_record_type,
    rewrite_crc,
)

CLEANED_SUFFIX = ".cleaned"


@dataclass
class CleanResult:
    first_dirty_offset: int
    end_offset: int
    segments_read: int = 0
    segments_written: int = 0
    bytes_read: int = 0
    bytes_written: int = 0
    records_read: int = 0
    records_retained: int = 0
    aborted_swaps: int = 0
    seconds: float = 0.0


@dataclass
class _Plan:
    first_dirty: int
    first_uncleanable: int
    cleanable_bytes: int
    total_bytes: int

    @property
    def ratio(self) -> float:
        return self.cleanable_bytes / self.total_bytes if self.total_bytes else 0.0


@dataclass
class _TxnFacts:
    """From one header pass over the log: aborted transactional batches, the markers whose
    transaction still has data, and each producer's last batches."""

    aborted: set[int] = field(default_factory=set)  # base offsets of aborted data batches
    undecided: set[int] = field(default_factory=set)  # transactional data without a marker yet
    markers_with_data: set[int] = field(default_factory=set)  # offsets of markers to keep
    last_data_batch: dict[int, int] = field(default_factory=dict)  # producer id -> base offset
    last_batch: dict[int, int] = field(default_factory=dict)  # producer id -> base offset (markers too)


class LogCleaner:
    def __init__(self, *, time: Callable[[], int] = wall_clock_ms, max_map_entries: int = 4_000_000) -> None:
        self.time = time
        self.max_map_entries = max_map_entries

    # -- planning ---------------------------------------------------------------------------------

    def plan(self, log: Log, first_unstable_offset: int | None = None) -> _Plan | None:
        """The cleanable range of `log` now, or None when there is nothing to clean."""
        segments = log.segments
        if len(segments) < 2:
            return None
        start = log.log_start_offset
        first_dirty = log.cleaner_checkpoint if log.cleaner_checkpoint is not None else start
        if first_dirty < start or first_dirty > log.log_end_offset:
            first_dirty = start
        ends = _ends(segments)
        uncleanable = segments[-1].base_offset
        if first_unstable_offset is not None:
            uncleanable = min(uncleanable, first_unstable_offset)
        lag = log.config.min_compaction_lag_ms
        if lag > 0:
            now = self.time()
            for seg in segments[:-1]:
                if ends[id(seg)] > first_dirty and seg.largest_timestamp() > now - lag:
                    uncleanable = min(uncleanable, seg.base_offset)
                    break
        # Round down to a segment boundary: only whole segments are cleaned.
        boundary = max((s.base_offset for s in segments if s.base_offset <= uncleanable), default=0)
        dirty = [s for s in segments if s.base_offset < boundary and ends[id(s)] > first_dirty]
        clean_bytes = sum(
            s.size for s in segments if s.base_offset < first_dirty and ends[id(s)] <= first_dirty
        )
        cleanable = sum(s.size for s in dirty)
        # No dirty bytes still makes a (forced) round useful: it drops tombstones past their horizon.
        return _Plan(first_dirty, boundary, cleanable, clean_bytes + cleanable)

    def needs_cleaning(self, log: Log, first_unstable_offset: int | None = None) -> bool:
        if not log.config.compact or log.closed:
            return False
        plan = self.plan(log, first_unstable_offset)
        if plan is None or plan.cleanable_bytes == 0:
            return False
        return plan.ratio >= log.config.min_cleanable_dirty_ratio or self._compaction_overdue(log, plan)

    def _compaction_overdue(self, log: Log, plan: _Plan) -> bool:
        max_lag = log.config.max_compaction_lag_ms
        if max_lag >= LONG_MAX:
            return False
        now = self.time()
        segments = log.segments
        ends = _ends(segments)
        for seg in segments[:-1]:
            if ends[id(seg)] > plan.first_dirty:
                first_ts = seg.rolling_timestamp()
                return first_ts >= 0 and now - first_ts > max_lag
        return False

    def clean_filthiest(
        self,
        logs: Iterable[Log],
        first_unstable_offset: Callable[[Log], int | None] | None = None,
    ) -> tuple[Log, CleanResult] | None:
        """Clean the compacted log with the highest dirty ratio among those due (Kafka's choice);
        None when none is due. Blocking: the broker's cleaner thread calls this in a loop."""
        best: tuple[float, Log] | None = None
        for log in logs:
            lso = first_unstable_offset(log) if first_unstable_offset is not None else None
            if not self.needs_cleaning(log, lso):
                continue
            plan = self.plan(log, lso)
            if plan is not None and (best is None or plan.ratio > best[0]):
                best = (plan.ratio, log)
        if best is None:
            return None
        log = best[1]
        result = self.clean(
            log, first_unstable_offset=first_unstable_offset(log) if first_unstable_offset else None
        )
        return (log, result) if result is not None else None

    # -- cleaning ---------------------------------------------------------------------------------

    def clean(
        self, log: Log, *, first_unstable_offset: int | None = None, force: bool = False
    ) -> CleanResult | None:
        """Run one cleaning round if the log is due (or `force`). Blocking: call from a worker thread."""
        if not log.config.compact or log.closed:
            return None
        plan = self.plan(log, first_unstable_offset)
        if plan is None:
            return None
        if not force and not self.needs_cleaning(log, first_unstable_offset):
            return None
        started = _time.perf_counter()
        segments = log.segments[:-1]
        facts = _scan_transactions(log.segments)
        offset_map, end_offset = self._build_offset_map(segments, plan, facts)
        result = CleanResult(plan.first_dirty, end_offset)
        now = self.time()
        to_clean = [s for s in segments if s.base_offset < end_offset]
        for group in _group_segments(to_clean, log, end_offset):
            cleaned = self._clean_group(log, group, offset_map, facts, end_offset, now, result)
            if log.replace_segments(cleaned, group):
                result.segments_written += 1
            else:
                result.aborted_swaps += 1
        if not result.aborted_swaps:
            log.cleaner_checkpoint = max(end_offset, plan.first_dirty)
        result.seconds = _time.perf_counter() - started
        return result

    def _build_offset_map(
        self, segments: tuple[LogSegment, ...], plan: _Plan, facts: _TxnFacts
    ) -> tuple[dict[bytes, int], int]:
        offset_map: dict[bytes, int] = {}
        end = plan.first_uncleanable
        ends = _ends(segments)
        for seg in segments:
            seg_end = ends[id(seg)]
            if seg.base_offset >= plan.first_uncleanable or seg_end <= plan.first_dirty:
                continue
            if offset_map and len(offset_map) >= self.max_map_entries:
                end = seg.base_offset
                break
            for pos, header in seg.iter_batches_from(0):
                if header.is_control or header.last_offset < plan.first_dirty:
                    continue
                if header.base_offset in facts.aborted or header.base_offset in facts.undecided:
                    continue
                try:
                    records = _records(seg, pos, header)
                except ProtocolError:
                    continue  # kept as is by the cleaning pass
                for record in records:
                    if record.key is not None and record.offset >= plan.first_dirty:
                        offset_map[record.key] = record.offset
        return offset_map, end

    def _clean_group(
        self,
        log: Log,
        group: list[LogSegment],
        offset_map: dict[bytes, int],
        facts: _TxnFacts,
        end_offset: int,
        now: int,
        result: CleanResult,
    ) -> LogSegment:
        cfg = log.config
        out = LogSegment(
            log.dir,
            group[0].base_offset,
            index_interval_bytes=cfg.index_interval_bytes,
            max_index_bytes=cfg.segment_index_bytes,
            now_ms=now,
            suffix=CLEANED_SUFFIX,
            create=True,
        )
        try:
            for seg in group:
                result.segments_read += 1
                for pos, header in seg.iter_batches_from(0):
                    result.bytes_read += header.size
                    data = self._filter_batch(
                        seg, pos, header, offset_map, facts, end_offset, now, cfg.delete_retention_ms, result
                    )
                    if data is not None:
                        out.append([data], len(data), [(0, parse_batch_header(data))])
                        result.bytes_written += len(data)
            # the aborted transactions whose markers stay (with data left) keep their index entries
            out.txn_index.replace([t for seg in group for t in seg.txn_index.entries
                                   if t.last_offset in facts.markers_with_data])
            out.on_become_inactive()
            out.flush()  # durable before the swap, outside the log lock
        except BaseException:
            out.delete_files()
            out.close()
            raise
        return out

    def _filter_batch(
        self,
        seg: LogSegment,
        pos: int,
        header: BatchHeader,
        offset_map: dict[bytes, int],
        facts: _TxnFacts,
        end_offset: int,
        now: int,
        delete_retention_ms: int,
        result: CleanResult,
    ) -> bytes | None:
        """The batch as it survives cleaning: unchanged, rebuilt with fewer records, an empty header, or None."""
        original = seg.read_batch_bytes(pos, header.size)
        if header.is_control:
            return _filter_marker(header, original, facts, end_offset, now, delete_retention_ms)
        if header.base_offset in facts.undecided:
            return original
        try:
            records = [] if header.base_offset in facts.aborted else _records(seg, pos, header, original)
        except ProtocolError:
            return original  # never drop what cannot be read; keep it as it is
        result.records_read += header.records_count
        horizon = header.base_timestamp if header.has_delete_horizon else None
        keep_tombstones = horizon is None or now < horizon
        retained = [
            r
            for r in records
            if r.key is not None
            and r.offset >= offset_map.get(r.key, -1)
            and (r.value is not None or keep_tombstones)
        ]
        result.records_retained += len(retained)
        has_tombstones = any(r.value is None for r in retained)
        if retained:
            if len(retained) == header.records_count and (not has_tombstones or horizon is not None):
                return original
            if has_tombstones and horizon is None:
                horizon = now + delete_retention_ms
            return _rebuild(header, retained, horizon)
        last_of_producer = (
            header.has_producer_id and facts.last_data_batch.get(header.producer_id) == header.base_offset
        )
        if last_of_producer or header.next_offset == end_offset:
            return build_batch(
                [],
                base_offset=header.base_offset,
                producer_id=header.producer_id,
                producer_epoch=header.producer_epoch,
                base_sequence=header.base_sequence,
                is_transactional=header.is_transactional,
                partition_leader_epoch=header.partition_leader_epoch,
                timestamp_type=header.timestamp_type,
                base_timestamp=header.max_timestamp,
                max_timestamp=header.max_timestamp,
                last_offset_delta=header.last_offset_delta,
            )
        return None


def _filter_marker(header: BatchHeader, original: bytes, facts: _TxnFacts, end_offset: int, now: int,
                   delete_retention_ms: int) -> bytes | None:
    """A control batch as it survives cleaning (Kafka's CleanedTransactionMetadata rules)."""
    if not header.has_producer_id or header.base_offset in facts.markers_with_data:
        return original
    horizon = header.base_timestamp if header.has_delete_horizon else None
    if header.records_count and horizon is None:
        # its transaction has no data left: it may go once delete.retention.ms has passed
        try:
            records = decode_batch(original, verify_crc=False)[1]
        except ProtocolError:
            return original
        return _rebuild(header, records, now + delete_retention_ms)
    if header.records_count and now < (horizon or 0):
        return original
    if facts.last_batch.get(header.producer_id) == header.base_offset or header.next_offset == end_offset:
        # the producer's last batch (its epoch fences zombies), or the round's last offset: kept empty
        return original if not header.records_count else _rebuild(header, [], horizon)
    return None


def _records(seg: LogSegment, pos: int, header: BatchHeader, data: bytes | None = None) -> list[Record]:
    """The batch's records; ProtocolError when they cannot be decoded."""
    if header.records_count == 0:
        return []
    if data is None:
        data = seg.read_batch_bytes(pos, header.size)
    return decode_batch(data, verify_crc=False)[1]


def _rebuild(header: BatchHeader, records: list[Record], horizon: int | None) -> bytes:
    """A batch with the surviving records at their original offsets, same codec and producer fields."""
    base = header.base_offset
    data = bytearray(
        build_batch(
            [(r.key, r.value, r.headers, r.timestamp) for r in records],
            base_offset=base,
            compression=header.compression,
            producer_id=header.producer_id,
            producer_epoch=header.producer_epoch,
            base_sequence=header.base_sequence,
            is_transactional=header.is_transactional,
            is_control=header.is_control,
            partition_leader_epoch=header.partition_leader_epoch,
            timestamp_type=header.timestamp_type,
            base_timestamp=horizon if horizon is not None else (header.max_timestamp if not records else None),
            max_timestamp=header.max_timestamp if not records else None,
            offset_deltas=[r.offset - base for r in records],
            last_offset_delta=header.last_offset_delta,
        )
    )
    if horizon is not None:
        attributes = (
            int.from_bytes(data[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2], "big") | DELETE_HORIZON_FLAG_MASK
        )
        data[ATTRIBUTES_OFFSET : ATTRIBUTES_OFFSET + 2] = attributes.to_bytes(2, "big")
        rewrite_crc(data, 0)
    return bytes(data)


def _ends(segments: tuple[LogSegment, ...]) -> dict[int, int]:
    """id(segment) -> exclusive upper offset of the range it covers (the next segment's base)."""
    out = {id(s): nxt.base_offset for s, nxt in zip(segments, segments[1:])}
    if segments:
        out[id(segments[-1])] = segments[-1].next_offset
    return out


def _scan_transactions(segments: tuple[LogSegment, ...]) -> _TxnFacts:
    """One header pass: which transactional batches were aborted, and each producer's last data batch."""
    facts = _TxnFacts()
    open_txns: dict[int, list[int]] = {}
    for seg in segments:
        for pos, header in seg.iter_batches_from(0):
            if not header.has_producer_id:
                continue
            facts.last_batch[header.producer_id] = header.base_offset
            if header.is_control:
                pending = open_txns.pop(header.producer_id, [])
                marker = _marker_type(seg, pos, header)
                if marker is ControlRecordType.ABORT:
                    facts.aborted.update(pending)
                if pending:
                    facts.markers_with_data.add(header.base_offset)
                continue
            facts.last_data_batch[header.producer_id] = header.base_offset
            if header.is_transactional:
                open_txns.setdefault(header.producer_id, []).append(header.base_offset)
    for pending in open_txns.values():
        facts.undecided.update(pending)
    return facts


def _marker_type(seg: LogSegment, pos: int, header: BatchHeader) -> ControlRecordType:
    try:
        records = _records(seg, pos, header)
        return parse_control_record_type(records[0].key) if records else ControlRecordType.UNKNOWN
    except ProtocolError:
        return ControlRecordType.UNKNOWN


def _group_segments(segments: list[LogSegment], log: Log, end_offset: int) -> list[list[LogSegment]]:
    """Consecutive segments merged while the result fits segment.bytes, the index limit and int32
    relative offsets (Kafka's groupSegmentsBySize)."""
    cfg = log.config
    ends = _ends(log.segments)
    groups: list[list[LogSegment]] = []
    for seg in segments:
        if groups:
            group = groups[-1]
            size = sum(s.size for s in group) + seg.size
            entries = sum(s.offset_index.entries for s in group) + seg.offset_index.entries
            last = min(ends.get(id(seg), seg.next_offset), end_offset) - 1
            if (
                size <= cfg.segment_bytes
                and entries * 8 <= cfg.segment_index_bytes
                and (seg.size == 0 or last - group[0].base_offset <= INT32_MAX)
            ):
                group.append(seg)
                continue
        groups.append([seg])
    return groups
