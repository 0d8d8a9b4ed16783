"""Simulator scenarios: the seeds' three exercises, and load sweeps across policies. Pure."""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from batchserve.batching.estimate import FixedBatchTime
from batchserve.batching.policy import PolicyConfig
from batchserve.batching.simulator import Arrival, SimResult, simulate


@dataclass(frozen=True, slots=True)
class Check:
    exercise: str
    what: str
    expected: str
    actual: str

    @property
    def ok(self) -> bool:
        return self.expected == self.actual


@dataclass(frozen=True, slots=True)
class TimelineRow:
    exercise: str
    request: str
    arrived_ms: float
    dispatched_ms: float | None
    finished_ms: float | None
    latency_ms: float | None
    note: str


SEED_CONFIG = PolicyConfig(kind="timer", max_batch_size=4, max_batch_delay_s=0.010)
SEED_BATCH = FixedBatchTime(0.100)

SEED_EXERCISES: dict[str, list[Arrival]] = {
    "1. sparse: A at 0, B at 7": [Arrival(0.000, "A"), Arrival(0.007, "B")],
    "1b. four at 0": [Arrival(0.000, n) for n in ("r1", "r2", "r3", "r4")],
    "2. busy worker: four at 0, E at 1": [
        *(Arrival(0.000, n) for n in ("r1", "r2", "r3", "r4")),
        Arrival(0.001, "E"),
    ],
    "3. deadline: E at 1, due at 150": [
        *(Arrival(0.000, n) for n in ("r1", "r2", "r3", "r4")),
        Arrival(0.001, "E", deadline=0.150),
    ],
}

# (exercise, request) -> (dispatched ms, finished ms); None = never runs.
SEED_EXPECTED: dict[tuple[str, str], tuple[int, int] | None] = {
    ("1. sparse: A at 0, B at 7", "A"): (10, 110),
    ("1. sparse: A at 0, B at 7", "B"): (10, 110),
    ("1b. four at 0", "r1"): (0, 100),
    ("1b. four at 0", "r4"): (0, 100),
    ("2. busy worker: four at 0, E at 1", "E"): (100, 200),
    ("3. deadline: E at 1, due at 150", "E"): None,
}


def _ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000.0, 3)


def seed_exercises() -> tuple[list[TimelineRow], list[Check]]:
    """The seeds' exercises on one worker, batch limit 4, 10 ms delay, 100 ms batches."""
    rows: list[TimelineRow] = []
    checks: list[Check] = []
    for name, arrivals in SEED_EXERCISES.items():
        result = simulate(
            arrivals, workers=1, config=SEED_CONFIG, estimator=SEED_BATCH, admission=True
        )
        for arrival in arrivals:
            o = result.outcomes[arrival.id]
            note = "refused at admission" if o.refused else ("expired" if o.expired_at else "")
            rows.append(
                TimelineRow(
                    name,
                    arrival.id,
                    _ms(o.arrived) or 0.0,
                    _ms(o.dispatched),
                    _ms(o.finished),
                    _ms(o.latency_s),
                    note,
                )
            )
            if (name, arrival.id) in SEED_EXPECTED:
                expected = SEED_EXPECTED[(name, arrival.id)]
                actual = None if o.finished is None else (o.dispatched, o.finished)
                checks.append(
                    Check(
                        name,
                        f"{arrival.id} dispatched/finished (ms)",
                        _describe(expected),
                        _describe(
                            None
                            if actual is None
                            else (round((actual[0] or 0) * 1000), round(actual[1] * 1000))
                        ),
                    )
                )
    return rows, checks


def _describe(value: tuple[int, int] | None) -> str:
    return "never runs" if value is None else f"{value[0]} / {value[1]}"


# -- load sweeps ---------------------------------------------------------------------------


def poisson_arrivals(rate: float, count: int, rng: random.Random) -> list[Arrival]:
    t = 0.0
    out = []
    for i in range(count):
        t += rng.expovariate(rate)
        out.append(Arrival(t, f"r{i}"))
    return out


def bursty_arrivals(
    rate: float,
    count: int,
    rng: random.Random,
    *,
    burst_factor: float = 3.0,
    burst_share: float = 0.2,
    mean_period_s: float = 0.5,
) -> list[Arrival]:
    """Poisson with an on/off modulated rate: ``burst_factor`` times the mean during bursts that
    take ``burst_share`` of the time, slower in between, so the mean stays ``rate``."""
    high = rate * burst_factor
    low = rate * (1.0 - burst_factor * burst_share) / (1.0 - burst_share)
    if low < 0:
        raise ValueError("burst_factor * burst_share must be below 1")
    t, i, bursting = 0.0, 0, False
    out: list[Arrival] = []
    while i < count:
        share = burst_share if bursting else 1.0 - burst_share
        period_end = t + rng.expovariate(1.0 / (2.0 * mean_period_s * share))
        current = high if bursting else low
        while i < count and current > 0:
            t += rng.expovariate(current)
            if t >= period_end:
                t = period_end
                break
            out.append(Arrival(t, f"r{i}"))
            i += 1
        t = period_end
        bursting = not bursting
    return out


def parse_policy(spec: str, max_batch_size: int, adaptive_ceiling_s: float) -> PolicyConfig:
    """``size-only``, ``greedy``, ``timer:<ms>``, or ``adaptive[:<ceiling ms>]``."""
    kind, _, arg = spec.partition(":")
    if kind == "timer":
        if not arg:
            raise ValueError("timer needs its delay: timer:<ms>")
        return PolicyConfig(
            kind="timer", max_batch_size=max_batch_size, max_batch_delay_s=float(arg) / 1000.0
        )
    if kind == "adaptive":
        ceiling = float(arg) / 1000.0 if arg else adaptive_ceiling_s
        return PolicyConfig(
            kind="adaptive", max_batch_size=max_batch_size, max_batch_delay_s=ceiling
        )
    return PolicyConfig(kind=kind, max_batch_size=max_batch_size, max_batch_delay_s=math.inf)


@dataclass(frozen=True, slots=True)
class SweepRow:
    policy: str
    load: float
    p50_ms: float
    p95_ms: float
    p99_ms: float
    mean_batch: float
    utilization: float
    finished: int


def sweep(
    *,
    loads: Sequence[float],
    policies: Sequence[str],
    workers: int = 1,
    max_batch_size: int = 32,
    batch_time_s: float = 0.100,
    requests: int = 20_000,
    arrivals: str = "poisson",
    seed: int = 1,
    adaptive_ceiling_s: float | None = None,
) -> list[SweepRow]:
    """p50/p95/p99 latency, mean batch and utilisation per (policy, load fraction of capacity)."""
    capacity = workers * max_batch_size / batch_time_s
    estimator = FixedBatchTime(batch_time_s)
    ceiling = batch_time_s if adaptive_ceiling_s is None else adaptive_ceiling_s
    rows: list[SweepRow] = []
    for load in loads:
        rng = random.Random(seed * 1_000_003 + round(load * 1000))
        make = bursty_arrivals if arrivals == "bursty" else poisson_arrivals
        trace = make(load * capacity, requests, rng)
        for spec in policies:
            config = parse_policy(spec, max_batch_size, ceiling)
            result = simulate(trace, workers=workers, config=config, estimator=estimator)
            rows.append(_row(spec, load, result))
    return rows


def _row(spec: str, load: float, result: SimResult) -> SweepRow:
    return SweepRow(
        policy=spec,
        load=load,
        p50_ms=round(result.percentile_ms(50), 2),
        p95_ms=round(result.percentile_ms(95), 2),
        p99_ms=round(result.percentile_ms(99), 2),
        mean_batch=round(result.mean_batch, 2),
        utilization=round(result.utilization, 4),
        finished=len(result.latencies_s()),
    )


@dataclass(frozen=True, slots=True)
class Verdict:
    """How the adaptive policy's p99 compares with the static ones across a sweep."""

    worst_ratio_to_best: float  # max over loads of adaptive p99 / best static p99
    worst_load: float
    beaten_at: dict[str, float | None]  # static policy -> a load where adaptive is strictly better

    @property
    def within_5_percent(self) -> bool:
        return self.worst_ratio_to_best <= 1.05

    @property
    def beats_each_static(self) -> bool:
        return all(load is not None for load in self.beaten_at.values())


def adaptive_verdict(rows: Sequence[SweepRow], adaptive: str = "adaptive") -> Verdict:
    by_load: dict[float, dict[str, float]] = {}
    for row in rows:
        by_load.setdefault(row.load, {})[row.policy] = row.p99_ms
    statics = sorted({row.policy for row in rows} - {adaptive})
    worst, worst_load = 0.0, math.nan
    beaten: dict[str, float | None] = dict.fromkeys(statics)
    for load, p99 in sorted(by_load.items()):
        best = min(p99[s] for s in statics)
        ratio = p99[adaptive] / best
        if ratio > worst:
            worst, worst_load = ratio, load
        for s in statics:
            if beaten[s] is None and p99[adaptive] < p99[s]:
                beaten[s] = load
    return Verdict(round(worst, 4), worst_load, beaten)
