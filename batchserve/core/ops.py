"""What an operator sees: the deployment's state now, read from the store and the slot directory.

One :class:`OpsView` per API process builds two things, each cached for about a second so any
number of dashboards and scrapers cost one round of queries a second:

- :meth:`OpsView.gauges`: queue depth and oldest queued age per model and lane, worker slots
  live and busy per model; the API's ``/metrics`` exports them (:class:`ClusterCollector`).
- :meth:`OpsView.snapshot`: the gauges plus recent batch sizes, latency percentiles over time,
  arrival rate, the capacity planner's advice and recent failures, for ``/dashboard`` and
  ``batchserve status``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from batchserve.batching.capacity import plan_capacity
from batchserve.core.clock import deployment_time
from batchserve.core.domain import Lane, RequestState
from batchserve.core.loadboard import LoadBoard
from batchserve.core.slots import SlotDirectory
from batchserve.core.store.stats import FinishedRequest, RecentBatch, StatsReader
from batchserve.models.registry import ModelSpec, Registry

WINDOW_S = 300.0  # what "recent" covers: batch sizes, the latency series, failures
STEP_S = 10.0  # one point of the latency series
RATE_WINDOW_S = 60.0  # arrival rate, throughput and current percentiles
HEADROOM = 0.25  # the capacity planner's default: at most 75 % busy


@dataclass(frozen=True, slots=True)
class Percentiles:
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None

    @classmethod
    def of(cls, values_ms: Iterable[float]) -> Percentiles:
        ordered = sorted(values_ms)
        return cls(
            len(ordered),
            percentile(ordered, 50),
            percentile(ordered, 95),
            percentile(ordered, 99),
        )


def percentile(ordered: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile of sorted values; ``None`` when there are none."""
    if not ordered:
        return None
    rank = max(1, math.ceil(p / 100.0 * len(ordered)))
    return round(ordered[rank - 1], 3)


@dataclass(frozen=True, slots=True)
class LaneQueue:
    lane: str
    depth: int
    oldest_age_s: float | None


@dataclass(frozen=True, slots=True)
class ModelGauges:
    model: str
    lanes: tuple[LaneQueue, ...]
    slots_live: int | None  # None: the slot directory (Redis) is unreachable
    slots_busy: int

    @property
    def queued(self) -> int:
        return sum(lane.depth for lane in self.lanes)


@dataclass(frozen=True, slots=True)
class CapacityAdvice:
    arrival_rps: float
    batch_time_ms: float  # observed mean model time of recent batches, else configured
    max_batch_size: int
    per_worker_rps: float
    min_workers: int
    recommended_workers: int  # worker slots, at HEADROOM headroom


@dataclass(frozen=True, slots=True)
class ModelStatus:
    name: str
    backend: str
    max_batch_size: int
    gauges: ModelGauges
    arrival_rps: float
    throughput_rps: float
    batches: int
    mean_batch_size: float | None
    mean_fill_ratio: float | None
    mean_model_ms: float | None
    batch_sizes: dict[int, int]
    latency: Percentiles
    capacity: CapacityAdvice | None
    kind: str = "batch"
    # The batcher's current time estimate (a batch's, or an engine model's sequence's) and
    # where it comes from; None without a live batcher.
    estimate: dict[str, Any] | None = None


@dataclass(frozen=True, slots=True)
class SeriesPoint:
    t: float
    count: int
    p50_ms: float | None
    p95_ms: float | None
    p99_ms: float | None


@dataclass(frozen=True, slots=True)
class FailureView:
    kind: str
    id: str
    model: str
    state: str
    code: str | None
    message: str | None
    at: float


@dataclass(frozen=True, slots=True)
class Snapshot:
    at: float
    window_s: float
    models: tuple[ModelStatus, ...]
    latency_series: tuple[SeriesPoint, ...]
    finished: dict[str, int]
    recent_failures: tuple[FailureView, ...]
    totals: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for model in data["models"]:
            model["batch_sizes"] = {str(k): v for k, v in sorted(model["batch_sizes"].items())}
            model["queued"] = sum(lane["depth"] for lane in model["gauges"]["lanes"])
        return data


class _Cached:
    """A value recomputed at most once per ``ttl_s``, by one caller at a time."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.value: Any = None
        self.at = -math.inf
        self._lock = asyncio.Lock()

    async def get(self, now: float, compute: Callable[[float], Awaitable[Any]]) -> Any:
        if now - self.at < self.ttl_s and self.value is not None:
            return self.value
        async with self._lock:  # callers that waited here find it fresh
            if now - self.at >= self.ttl_s or self.value is None:
                self.value = await compute(now)
                self.at = now
        return self.value


class OpsView:
    """The figures an operator watches, computed from the store and the slot directory."""

    def __init__(
        self,
        stats: StatsReader,
        slots: SlotDirectory,
        registry: Registry,
        *,
        loadboard: LoadBoard | None = None,
        ttl_s: float = 1.0,
        clock: Callable[[], float] = deployment_time,
    ) -> None:
        self._stats = stats
        self._slots = slots
        self._loadboard = loadboard
        self._registry = registry
        self._clock = clock
        self._gauges = _Cached(ttl_s)
        self._snapshot = _Cached(ttl_s)
        self.last_gauges: tuple[ModelGauges, ...] = ()

    async def gauges(self) -> tuple[ModelGauges, ...]:
        gauges: tuple[ModelGauges, ...] = await self._gauges.get(self._clock(), self._read_gauges)
        self.last_gauges = gauges
        return gauges

    async def snapshot(self) -> Snapshot:
        snapshot: Snapshot = await self._snapshot.get(self._clock(), self._build_snapshot)
        return snapshot

    async def _read_gauges(self, now: float) -> tuple[ModelGauges, ...]:
        depths = await self._stats.queue_depths()
        running = await self._stats.running_batches()
        result = []
        for spec in self._registry.specs():
            lanes = []
            for lane in Lane:
                found = [d for d in depths if d.model == spec.name and d.lane == lane.value]
                depth = sum(d.depth for d in found)
                oldest = min((d.oldest_created_at for d in found), default=None)
                age = None if oldest is None else round(max(0.0, now - oldest), 3)
                lanes.append(LaneQueue(lane.value, depth, age))
            live = await self._slots.total_slots(spec.name, now)
            busy = running.get(spec.name, 0)
            result.append(
                ModelGauges(
                    spec.name,
                    tuple(lanes),
                    live,
                    min(busy, live) if live is not None else busy,
                )
            )
        return tuple(result)

    async def _build_snapshot(self, now: float) -> Snapshot:
        gauges = {g.model: g for g in await self.gauges()}
        since = now - WINDOW_S
        recent = now - RATE_WINDOW_S
        finished = await self._stats.finished_requests(since)
        batches = await self._stats.recent_batches(since)
        arrivals = await self._stats.arrivals(recent)
        failures = await self._stats.recent_failures(since)
        models = []
        for spec in self._registry.specs():
            status = _model_status(
                spec,
                gauges[spec.name],
                [f for f in finished if f.model == spec.name],
                [b for b in batches if b.model == spec.name],
                arrivals.get(spec.name, 0) / RATE_WINDOW_S,
                recent,
            )
            models.append(await self._with_estimate(status, now))
        return Snapshot(
            at=now,
            window_s=WINDOW_S,
            models=tuple(models),
            latency_series=tuple(_series(finished, since, now)),
            finished=dict(Counter(f.state for f in finished)),
            recent_failures=tuple(FailureView(**asdict(f)) for f in failures),
            totals={
                "queued": sum(g.queued for g in gauges.values()),
                "slots_live": sum(g.slots_live or 0 for g in gauges.values()),
                "slots_busy": sum(g.slots_busy for g in gauges.values()),
                "arrival_rps": round(sum(m.arrival_rps for m in models), 3),
                "throughput_rps": round(sum(m.throughput_rps for m in models), 3),
            },
        )

    async def _with_estimate(self, status: ModelStatus, now: float) -> ModelStatus:
        """The batcher's estimate for the model; for an engine model also the capacity advice
        from it (an engine serves its sequences every typical sequence time)."""
        if self._loadboard is None:
            return status
        snapshot = await self._loadboard.fresh(status.name, now)
        if snapshot is None:
            return status
        capacity = status.capacity
        if snapshot.kind == "engine":
            capacity = None
            found = await self._slots.capacity(status.name, now)
            if found is not None and found.workers and status.arrival_rps > 0:
                capacity = advise_engine(
                    status.arrival_rps, found.units // found.workers, snapshot.batch_s
                )
        return dataclasses.replace(
            status, kind=snapshot.kind, estimate=snapshot.estimate or None, capacity=capacity
        )


def advise_engine(arrival_rps: float, seqs_per_engine: int, sequence_s: float) -> CapacityAdvice:
    """Engines for the observed rate: each keeps ``seqs_per_engine`` sequences running and
    finishes them in a typical sequence's time."""
    plan = plan_capacity(
        rate_rps=arrival_rps,
        max_batch=max(1, seqs_per_engine),
        batch_time_s=max(sequence_s, 1e-6),
        headroom=HEADROOM,
    )
    return CapacityAdvice(
        arrival_rps=round(arrival_rps, 3),
        batch_time_ms=round(sequence_s * 1000.0, 2),
        max_batch_size=seqs_per_engine,
        per_worker_rps=round(plan.per_worker_rps, 2),
        min_workers=plan.min_workers,
        recommended_workers=plan.recommended_workers,
    )


def _succeeded(rows: Iterable[FinishedRequest]) -> list[FinishedRequest]:
    return [r for r in rows if r.state == RequestState.SUCCEEDED.value and r.total_ms is not None]


def _succeeded_ms(rows: Iterable[FinishedRequest]) -> list[float]:
    return [r.total_ms for r in _succeeded(rows) if r.total_ms is not None]


def _model_status(
    spec: ModelSpec,
    gauges: ModelGauges,
    finished: list[FinishedRequest],
    batches: list[RecentBatch],
    arrival_rps: float,
    recent: float,
) -> ModelStatus:
    sizes = [b.size for b in batches]
    model_ms = [b.model_ms for b in batches if b.model_ms is not None]
    mean_size = sum(sizes) / len(sizes) if sizes else None
    mean_model_ms = sum(model_ms) / len(model_ms) if model_ms else None
    last_minute = [f for f in finished if f.finished_at >= recent]
    return ModelStatus(
        name=spec.name,
        backend=spec.backend,
        max_batch_size=spec.max_batch_size,
        gauges=gauges,
        arrival_rps=round(arrival_rps, 3),
        throughput_rps=round(len(last_minute) / RATE_WINDOW_S, 3),
        batches=len(batches),
        mean_batch_size=None if mean_size is None else round(mean_size, 2),
        mean_fill_ratio=None if mean_size is None else round(mean_size / spec.max_batch_size, 3),
        mean_model_ms=None if mean_model_ms is None else round(mean_model_ms, 2),
        batch_sizes=dict(Counter(sizes)),
        latency=Percentiles.of(_succeeded_ms(last_minute)),
        capacity=advise(spec, arrival_rps, mean_model_ms),
    )


def advise(
    spec: ModelSpec, arrival_rps: float, mean_model_ms: float | None
) -> CapacityAdvice | None:
    """The capacity planner's worker count for the observed arrival rate (full batches, the
    observed batch time when there is one); ``None`` without traffic."""
    if arrival_rps <= 0:
        return None
    batch_time_ms = mean_model_ms or spec.batch_time_ms
    plan = plan_capacity(
        rate_rps=arrival_rps,
        max_batch=spec.max_batch_size,
        batch_time_s=batch_time_ms / 1000.0,
        headroom=HEADROOM,
    )
    return CapacityAdvice(
        arrival_rps=round(arrival_rps, 3),
        batch_time_ms=round(batch_time_ms, 2),
        max_batch_size=spec.max_batch_size,
        per_worker_rps=round(plan.per_worker_rps, 2),
        min_workers=plan.min_workers,
        recommended_workers=plan.recommended_workers,
    )


def _series(finished: Sequence[FinishedRequest], since: float, now: float) -> Iterator[SeriesPoint]:
    """Latency percentiles of succeeded requests, per ``STEP_S`` of finishing time."""
    first = math.floor(since / STEP_S) * STEP_S
    buckets: dict[int, list[float]] = {}
    for row in _succeeded(finished):
        assert row.total_ms is not None
        buckets.setdefault(int((row.finished_at - first) // STEP_S), []).append(row.total_ms)
    steps = math.ceil((now - first) / STEP_S)
    for n in range(steps):
        values = sorted(buckets.get(n, []))
        yield SeriesPoint(
            t=first + n * STEP_S,
            count=len(values),
            p50_ms=percentile(values, 50),
            p95_ms=percentile(values, 95),
            p99_ms=percentile(values, 99),
        )


class ClusterCollector(Collector):
    """Exports the deployment-wide gauges of an :class:`OpsView` (refresh them first: the
    collector reads the last values, as Prometheus collectors must not block)."""

    def __init__(self, view: OpsView) -> None:
        self._view = view

    def collect(self) -> Iterator[GaugeMetricFamily]:
        depth = GaugeMetricFamily(
            "batchserve_queue_depth",
            "Requests waiting for a batch (state queued), per model and lane",
            labels=["model", "lane"],
        )
        age = GaugeMetricFamily(
            "batchserve_queue_oldest_age_seconds",
            "Age of the oldest request waiting for a batch, per model and lane (0 when none)",
            labels=["model", "lane"],
        )
        live = GaugeMetricFamily(
            "batchserve_worker_slots_live",
            "Worker slots announced by live workers, per model",
            labels=["model"],
        )
        busy = GaugeMetricFamily(
            "batchserve_worker_slots_busy",
            "Worker slots running a batch, per model",
            labels=["model"],
        )
        for gauges in self._view.last_gauges:
            for lane in gauges.lanes:
                depth.add_metric([gauges.model, lane.lane], lane.depth)
                age.add_metric([gauges.model, lane.lane], lane.oldest_age_s or 0.0)
            if gauges.slots_live is not None:
                live.add_metric([gauges.model], gauges.slots_live)
            busy.add_metric([gauges.model], gauges.slots_busy)
        yield from (depth, age, live, busy)
