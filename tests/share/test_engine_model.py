"""The share-partition engine against a simple reference model: one record state per offset.

Random acquisitions (batch_optimized and record_limit, some undone as a throttled fetch's),
acknowledgements (valid and invalid, of every type), releases, lock expiries on a manual clock,
and persists that fail; after every step the engine's per-offset states, SPSO and next fetch
offset must equal the model's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from broker.coordinator.share.state import StateBatch, combine_state_batches
from broker.share.engine import AckBatch, AckType, FetchedBatch, SharePartition, ShareSettings, Transition
from broker.share.inflight import RecordState
from protocol.errors import KafkaError

S = RecordState
MEMBERS = ["m1", "m2", "m3"]


@dataclass
class Rec:
    state: S = S.AVAILABLE
    dc: int = 0
    member: str = ""
    deadline: int | None = None
    pending: tuple[S, int, str, int | None] | None = None  # the state to roll back to


class Model:
    def __init__(self, settings: ShareSettings) -> None:
        self.s = settings
        self.recs: dict[int, Rec] = {}  # offsets fetched so far

    def spso(self) -> int:
        o = 0
        while o in self.recs and self.recs[o].state.terminal and self.recs[o].pending is None:
            o += 1
        return o

    def expire(self, now: int) -> None:
        for r in self.recs.values():
            if r.state is S.ACQUIRED and r.pending is None and r.deadline is not None and r.deadline <= now:
                r.state = S.ARCHIVED if r.dc >= self.s.delivery_count_limit else S.AVAILABLE
                r.member, r.deadline = "", None


def build_log(rng: random.Random, n: int) -> list[FetchedBatch]:
    batches, o = [], 0
    while o < n:
        size = rng.choice([1, 1, 2, 3, 5, 8])
        batches.append(FetchedBatch(o, min(n, o + size) - 1))
        o += size
    return batches


def read(log: list[FetchedBatch], offset: int, max_batches: int) -> list[FetchedBatch]:
    i = next((i for i, b in enumerate(log) if b.last_offset >= offset), None)
    return [] if i is None else log[i:i + max_batches]


def check(sp: SharePartition, model: Model) -> None:
    spso = model.spso()
    assert sp.start_offset == spso, (sp.start_offset, spso)
    for o, r in model.recs.items():
        st = sp.state_of(o)
        if o < spso:
            assert st is None
            continue
        assert st is not None, o
        assert (st.state, st.delivery_count, st.member_id) == (r.state, r.dc, r.member), (o, st, r)
        assert (st.pending is not None) == (r.pending is not None), (o, st, r)
    available = [o for o, r in model.recs.items() if o >= spso and r.state is S.AVAILABLE and r.pending is None]
    fetched_end = max(model.recs, default=-1)
    if available:
        expected = min(available)
    else:
        expected = fetched_end + 1
    assert sp.next_fetch_offset() == max(expected, spso)


def run_scenario(seed: int, steps: int = 400) -> None:
    rng = random.Random(seed)
    settings = ShareSettings(delivery_count_limit=rng.choice([2, 3, 5]), record_lock_duration_ms=1000,
                             max_record_locks=rng.choice([10, 25, 100]))
    sp = SharePartition(settings)
    sp.load(0, 0, [])
    model = Model(settings)
    log = build_log(rng, 300)
    now = 0
    pending: list[tuple[Transition, dict[int, Rec]]] = []
    durable: dict[str, object] = {"start": 0, "batches": ()}  # what the persister holds

    def apply_complete(t: Transition, ok: bool) -> None:
        if ok:  # persisted with the SPSO the engine had when it wrote
            start = sp.start_offset
            durable["batches"] = combine_state_batches(durable["batches"], t.state_batches(), start)  # type: ignore
            durable["start"] = start
        sp.complete(t, ok, now)
        for first, last, _, _ in t.touched:
            for o in range(first, last + 1):
                r = model.recs[o]
                assert r.pending is not None
                prev, r.pending = r.pending, None
                if ok:
                    r.deadline = None
                    continue
                r.state, r.dc, r.member, r.deadline = prev

    def start_all(t: Transition, new_of: dict[int, tuple[S, int]]) -> None:
        for o, (state, dc) in new_of.items():
            r = model.recs[o]
            r.pending = (r.state, r.dc, r.member, r.deadline)
            r.state, r.dc, r.member = state, dc, ""

    for _ in range(steps):
        action = rng.random()
        if action < 0.35:  # acquire
            member = rng.choice(MEMBERS)
            offset = sp.next_fetch_offset()
            fetched = read(log, offset, rng.randint(1, 6))
            record_limit = rng.random() < 0.3
            max_records = rng.choice([1, 3, 10, 500])
            result = sp.acquire(member, offset, fetched, max_records, rng.choice([2, 5, 500]), now, record_limit)
            seen: set[int] = set()
            for a in result:
                for o in range(a.first_offset, a.last_offset + 1):
                    assert o not in seen
                    seen.add(o)
                    r = model.recs.setdefault(o, Rec())
                    assert r.state is S.AVAILABLE and r.pending is None, (o, r)
                    assert o >= model.spso()
                    r.state, r.dc, r.member, r.deadline = S.ACQUIRED, r.dc + 1, member, now + 1000
                    assert a.delivery_count == r.dc
            if record_limit and result:
                assert len(seen) <= max_records
            if result and rng.random() < 0.15:  # the response was throttled: never sent, undone
                assert sp.unacquire(member, result) == len(seen)
                for o in seen:
                    r = model.recs[o]
                    r.state, r.dc, r.member, r.deadline = S.AVAILABLE, r.dc - 1, "", None
            # records read but not acquired exist in the log and are available from the model's view
            if result:
                for o in range(model.spso(), max(seen) + 1):
                    model.recs.setdefault(o, Rec())
            assert sp.in_flight_count() <= settings.max_record_locks + 8
        elif action < 0.65:  # acknowledge
            member = rng.choice(MEMBERS)
            owned = sorted(o for o, r in model.recs.items() if r.member == member and r.state is S.ACQUIRED)
            if owned and rng.random() < 0.85:
                a = rng.choice(owned)
                b = min(a + rng.randint(0, 4), max(model.recs))
            else:
                a = rng.randint(0, 320)
                b = a + rng.randint(0, 3)
            types = [rng.choice([0, 1, 2, 3, 4])] if rng.random() < 0.6 else \
                [rng.choice([0, 1, 2, 3]) for _ in range(b - a + 1)]
            spso = model.spso()
            valid = b < spso or (b <= max(model.recs, default=-1) and all(
                model.recs[o].state is S.ACQUIRED and model.recs[o].member == member and model.recs[o].pending is None
                for o in range(max(a, spso), b + 1)))
            try:
                t = sp.acknowledge(member, [AckBatch(a, b, types)], now)
            except KafkaError:
                assert not valid, (a, b, member)
                continue
            assert valid, (a, b, member, [model.recs.get(o) for o in range(a, b + 1)])
            new_of = {}
            for o in range(max(a, spso), b + 1):
                type_ = types[o - a] if len(types) > 1 else types[0]
                r = model.recs[o]
                if type_ == AckType.RENEW:
                    r.deadline = now + 1000
                    continue
                state = {0: S.ARCHIVED, 1: S.ACKNOWLEDGED, 2: S.AVAILABLE, 3: S.ARCHIVED}[type_]
                if state is S.AVAILABLE and r.dc >= settings.delivery_count_limit:
                    state = S.ARCHIVED
                new_of[o] = (state, r.dc)
            start_all(t, new_of)
            if rng.random() < 0.2:
                pending.append((t, new_of))
            else:
                apply_complete(t, rng.random() < 0.9)
        elif action < 0.72:  # a share session closes
            member = rng.choice(MEMBERS)
            t = sp.release_member(member, now)
            new_of = {o: (S.AVAILABLE, max(0, r.dc - 1)) for o, r in model.recs.items()
                      if r.state is S.ACQUIRED and r.member == member and r.pending is None}
            assert {o for f, l_, _, _ in t.touched for o in range(f, l_ + 1)} == set(new_of)
            start_all(t, new_of)
            apply_complete(t, True)
        elif action < 0.85:  # time passes; locks expire
            now += rng.choice([100, 400, 1100])
            t = sp.expire_locks(now)
            expected = {o for o, r in model.recs.items() if r.state is S.ACQUIRED and r.pending is None
                        and r.deadline is not None and r.deadline <= now}
            assert {o for f, l_, _, _ in t.touched for o in range(f, l_ + 1)} == expected
            new_of = {}
            for o in expected:
                r = model.recs[o]
                new_of[o] = (S.ARCHIVED if r.dc >= settings.delivery_count_limit else S.AVAILABLE, r.dc)
            start_all(t, new_of)
            apply_complete(t, rng.random() < 0.8)  # a failed expiry is retried at the next check
        elif action < 0.87 and not pending:  # the broker restarts: only durable state survives
            start, batches = durable["start"], durable["batches"]
            assert isinstance(start, int)
            sp = SharePartition(settings)
            sp.load(start, 0, batches)  # type: ignore[arg-type]
            recs: dict[int, Rec] = {}
            last = max((b.last_offset for b in batches), default=start - 1)  # type: ignore[union-attr]
            for o in range(start, last + 1):
                recs[o] = Rec()
            for b in batches:  # type: ignore[union-attr]
                assert isinstance(b, StateBatch)
                for o in range(max(b.first_offset, start), b.last_offset + 1):
                    recs[o] = Rec(S(b.delivery_state), b.delivery_count)
            for o, r in model.recs.items():
                if r.state.terminal and o >= start:
                    assert recs[o].state is r.state, (o, recs.get(o), r)  # nothing done is ever undone
            model.recs = {o: r for o, r in recs.items()}
            for o in range(start):
                model.recs[o] = Rec(S.ARCHIVED)  # below the durable SPSO: done
        elif pending:  # a delayed persist completes
            t, _ = pending.pop(rng.randrange(len(pending)))
            apply_complete(t, rng.random() < 0.8)
        check(sp, model)
    for t, _ in pending:
        apply_complete(t, True)
    check(sp, model)


@pytest.mark.parametrize("seed", range(40))
def test_engine_matches_the_model(seed: int) -> None:
    run_scenario(seed)
