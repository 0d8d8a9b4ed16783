"""The operator's figures, from hand-made store rows and a fake clock: percentiles, the latency
series, the capacity advice and the Prometheus gauges."""

from __future__ import annotations

import itertools
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batchserve.core.ops import STEP_S, ClusterCollector, OpsView, percentile
from batchserve.core.slots import MemorySlotDirectory
from batchserve.core.store.stats import FinishedRequest, QueueDepth, RecentBatch
from batchserve.models.registry import ModelSpec, Registry

NOW = 1_800_000_000.0
ECHO = ModelSpec(name="echo-100ms", backend="fixed", max_batch_size=32, batch_time_ms=100.0)


class FakeStats:
    def __init__(self) -> None:
        self.queries = 0
        self.depths = [QueueDepth("echo-100ms", "interactive", 7, NOW - 4.0)]
        self.finished = [
            FinishedRequest("echo-100ms", "succeeded", NOW - 5.0 - i * 0.01, 100.0 + i)
            for i in range(100)
        ] + [FinishedRequest("echo-100ms", "expired", NOW - 3.0, None)]
        self.batches = [RecentBatch("echo-100ms", 25, NOW - 6.0, 101.0, "succeeded")] * 4

    async def queue_depths(self) -> list[QueueDepth]:
        self.queries += 1
        return self.depths

    async def running_batches(self) -> dict[str, int]:
        return {"echo-100ms": 1}

    async def arrivals(self, since: float) -> dict[str, int]:
        return {"echo-100ms": 1200}  # 20/s over the last minute

    async def finished_requests(self, since: float, limit: int = 50_000) -> list[FinishedRequest]:
        return [f for f in self.finished if f.finished_at >= since]

    async def recent_batches(self, since: float, limit: int = 20_000) -> list[RecentBatch]:
        return self.batches

    async def recent_failures(self, since: float, limit: int = 20) -> list[Any]:
        return []


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> float:
        return self.now


def view() -> tuple[OpsView, FakeStats, Clock]:
    stats = FakeStats()
    slots = MemorySlotDirectory()
    slots.register("echo-100ms", "w1", 2, float("inf"))
    clock = Clock()
    return OpsView(stats, slots, Registry({"echo-100ms": ECHO}), clock=clock), stats, clock  # type: ignore[arg-type]


def test_percentile_is_the_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile([7.0], 99) == 7.0
    assert percentile([], 50) is None


async def test_snapshot_has_gauges_batches_latency_and_advice() -> None:
    ops, _, _ = view()
    snapshot = (await ops.snapshot()).as_dict()
    (echo,) = snapshot["models"]
    assert echo["queued"] == 7 and echo["gauges"]["slots_live"] == 2
    assert echo["gauges"]["slots_busy"] == 1
    assert echo["gauges"]["lanes"][0] == {"lane": "interactive", "depth": 7, "oldest_age_s": 4.0}
    assert echo["batch_sizes"] == {"25": 4} and echo["mean_fill_ratio"] == 0.781
    assert echo["latency"] == {"count": 100, "p50_ms": 149.0, "p95_ms": 194.0, "p99_ms": 198.0}
    # 20 requests/s, full batches of 32 in the observed 101 ms: one slot serves 317/s.
    advice = echo["capacity"]
    assert advice["arrival_rps"] == 20.0 and advice["batch_time_ms"] == 101.0
    assert advice["recommended_workers"] == 1
    assert snapshot["finished"] == {"succeeded": 100, "expired": 1}
    series = snapshot["latency_series"]
    assert all(b["t"] - a["t"] == STEP_S for a, b in itertools.pairwise(series))
    assert sum(point["count"] for point in series) == 100


async def test_figures_are_cached_for_a_second() -> None:
    ops, stats, clock = view()
    await ops.gauges()
    await ops.gauges()
    assert stats.queries == 1
    clock.now += 1.5
    stats.depths = []
    assert (await ops.gauges())[0].queued == 0


async def test_the_collector_exports_the_gauges_under_prometheus_names() -> None:
    ops, _, _ = view()
    await ops.gauges()
    registry = CollectorRegistry()
    registry.register(ClusterCollector(ops))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(registry).decode())
        for s in family.samples
    }
    lane = (("lane", "interactive"), ("model", "echo-100ms"))
    assert samples[("batchserve_queue_depth", lane)] == 7
    assert samples[("batchserve_queue_oldest_age_seconds", lane)] == 4.0
    assert samples[("batchserve_queue_depth", (("lane", "bulk"), ("model", "echo-100ms")))] == 0
    assert samples[("batchserve_worker_slots_live", (("model", "echo-100ms"),))] == 2
    assert samples[("batchserve_worker_slots_busy", (("model", "echo-100ms"),))] == 1
