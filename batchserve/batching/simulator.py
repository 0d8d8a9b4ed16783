"""A discrete-event simulation of the batcher: the real policy, simulated workers and clock.

It runs exactly the loop the live batcher runs (decide, dispatch, decide again; sleep until the
next arrival, free slot or wake-up) with ``decide`` imported from :mod:`batching.policy`, so
what it predicts is what the policy does, minus the live system's overheads. Pure: no I/O.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from batchserve.batching.estimate import BatchTimeEstimator
from batchserve.batching.eta import estimate_finish
from batchserve.batching.policy import Load, Pending, PolicyConfig, decide, estimate_batch_s
from batchserve.batching.rate import RateMeter
from batchserve.core.domain import Lane

RunTime = Callable[[Sequence[Pending]], float]


@dataclass(frozen=True, slots=True)
class Arrival:
    at: float
    id: str
    deadline: float = math.inf
    lane: Lane = Lane.INTERACTIVE
    prompt_tokens: int = 1
    max_tokens: int = 1
    tenant: str = ""


@dataclass(slots=True)
class Outcome:
    """What happened to one request: its batch's start and end, or how it was turned away."""

    arrived: float
    dispatched: float | None = None
    finished: float | None = None
    batch: int | None = None
    refused: bool = False
    expired_at: float | None = None

    @property
    def latency_s(self) -> float | None:
        return None if self.finished is None else self.finished - self.arrived


@dataclass(frozen=True, slots=True)
class SimBatch:
    index: int
    size: int
    start: float
    end: float
    slot: int


@dataclass
class SimResult:
    outcomes: dict[str, Outcome]
    batches: list[SimBatch] = field(default_factory=list)
    workers: int = 1

    def latencies_s(self) -> list[float]:
        return sorted(o.latency_s for o in self.outcomes.values() if o.latency_s is not None)

    def percentile_ms(self, q: float) -> float:
        values = self.latencies_s()
        if not values:
            return math.nan
        rank = min(len(values) - 1, max(0, math.ceil(q / 100.0 * len(values)) - 1))
        return values[rank] * 1000.0

    @property
    def mean_batch(self) -> float:
        return sum(b.size for b in self.batches) / len(self.batches) if self.batches else 0.0

    @property
    def utilization(self) -> float:
        """Busy slot time over available slot time, from the first arrival to the last end."""
        if not self.batches:
            return 0.0
        start = min(o.arrived for o in self.outcomes.values())
        end = max(b.end for b in self.batches)
        busy = sum(b.end - b.start for b in self.batches)
        return busy / (self.workers * (end - start)) if end > start else 0.0

    @property
    def num_refused(self) -> int:
        return sum(o.refused for o in self.outcomes.values())

    @property
    def num_expired(self) -> int:
        return sum(o.expired_at is not None for o in self.outcomes.values())


_ARRIVE, _FREE, _WAKE = 0, 1, 2


@dataclass
class _State:
    free: list[int]
    busy_until: dict[int, float] = field(default_factory=dict)
    last_dispatch_at: float = -math.inf
    weights: dict[str, float] = field(default_factory=dict)
    pending: dict[str, Pending] = field(default_factory=dict)
    next_wake: float = math.inf


def simulate(
    arrivals: Sequence[Arrival],
    *,
    workers: int,
    config: PolicyConfig,
    estimator: BatchTimeEstimator,
    run_time: RunTime | None = None,
    admission: bool = False,
    rate_tau_s: float = 1.0,
    weights: Mapping[str, float] | None = None,
) -> SimResult:
    """Run ``arrivals`` through the policy on ``workers`` simulated slots.

    ``run_time`` gives a batch's actual duration (default: the estimate). With ``admission``,
    a request whose estimated completion is past its deadline is refused on arrival, as the
    API does.
    """
    run = run_time or (lambda batch: estimate_batch_s(batch, estimator))
    result = SimResult(outcomes={}, workers=workers)
    state = _State(free=list(range(workers)), weights=dict(weights or {}))
    rate = RateMeter(rate_tau_s)
    events: list[tuple[float, int, int, object]] = []
    seq = 0
    for arrival in sorted(arrivals, key=lambda a: a.at):
        events.append((arrival.at, seq, _ARRIVE, arrival))
        seq += 1
    heapq.heapify(events)
    while events:
        now = events[0][0]
        while events and events[0][0] == now:
            _, _, kind, payload = heapq.heappop(events)
            if kind == _ARRIVE:
                assert isinstance(payload, Arrival)
                _arrive(payload, now, state, result, rate, config, estimator, admission)
            elif kind == _FREE:
                assert isinstance(payload, int)
                state.busy_until.pop(payload, None)
                state.free.append(payload)
        load = _load(state, rate.rate(now))
        while True:
            decision = decide(
                list(state.pending.values()), now, len(state.free), config, estimator, load
            )
            for p in decision.expire:
                state.pending.pop(p.id)
                result.outcomes[p.id].expired_at = now
            for batch in decision.batches:
                seq = _dispatch(batch, now, state, result, run, events, seq)
            if not decision.batches:
                break
            load = _load(state, load.arrival_rate)
        if decision.wake_at is not None and decision.wake_at < state.next_wake:
            state.next_wake = decision.wake_at
            heapq.heappush(events, (decision.wake_at, seq, _WAKE, None))
            seq += 1
        if state.next_wake <= now:
            state.next_wake = math.inf
    return result


def _load(state: _State, arrival_rate: float) -> Load:
    return Load(
        arrival_rate=arrival_rate,
        busy_until=tuple(state.busy_until.values()),
        last_dispatch_at=state.last_dispatch_at,
        weights=state.weights,
    )


def _arrive(
    arrival: Arrival,
    now: float,
    state: _State,
    result: SimResult,
    rate: RateMeter,
    config: PolicyConfig,
    estimator: BatchTimeEstimator,
    admission: bool,
) -> None:
    outcome = result.outcomes[arrival.id] = Outcome(arrived=now)
    rate.observe(now)
    pending = Pending(
        id=arrival.id,
        arrived_at=now,
        deadline=arrival.deadline,
        lane=arrival.lane,
        prompt_tokens=arrival.prompt_tokens,
        max_tokens=arrival.max_tokens,
        tenant=arrival.tenant,
    )
    if admission and math.isfinite(arrival.deadline):
        slot_free_at = [now] * len(state.free) + list(state.busy_until.values())
        finish = estimate_finish(
            now=now,
            ahead=sum(1 for p in state.pending.values() if p.lane is Lane.INTERACTIVE),
            slot_free_at=slot_free_at,
            max_batch_size=config.max_batch_size,
            batch_s=estimate_batch_s((pending,), estimator),
        )
        if finish is not None and finish > arrival.deadline:
            outcome.refused = True
            return
    state.pending[arrival.id] = pending


def _dispatch(
    batch: Sequence[Pending],
    now: float,
    state: _State,
    result: SimResult,
    run: RunTime,
    events: list[tuple[float, int, int, object]],
    seq: int,
) -> int:
    slot = min(state.free)
    state.free.remove(slot)
    end = now + run(batch)
    state.busy_until[slot] = end
    state.last_dispatch_at = now
    index = len(result.batches)
    result.batches.append(SimBatch(index=index, size=len(batch), start=now, end=end, slot=slot))
    for p in batch:
        state.pending.pop(p.id)
        outcome = result.outcomes[p.id]
        outcome.dispatched, outcome.finished, outcome.batch = now, end, index
    heapq.heappush(events, (end, seq, _FREE, slot))
    return seq + 1
