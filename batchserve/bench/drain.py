"""``bench --scenario saturation``: how close W workers with batch B come to 10·W·B requests/s.

A backlog is loaded through the bulk path (a JSONL job) while the variant has no batcher or
worker, so nothing runs until it is all queued; then the batcher and a worker with W slots
start and drain it. The drain rate is measured per slot, from batch ends in Postgres, between
the end of the warm-up and the last full batch (the tail, where the backlog runs out, is not
steady state), and summed over the slots. The rate at which results were announced (committed
and published) over the same window is reported beside it, as is each slot's idle gap between
one batch's model end and the next one's model start.

The open-loop HTTP figure offers Poisson traffic a little above capacity to the adaptive
variant and counts the results announced per second: the same engine, now also carrying the
API and the load generator on the same cores.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from batchserve.bench.jobs import job_uuid, start_job, wait_job
from batchserve.bench.loadgen import open_loop, poisson_schedule
from batchserve.bench.stack import BenchDeployment, Variant, cpu_per, percentile, summary_ms


@dataclass(frozen=True, slots=True)
class SaturationPlan:
    variants: list[Variant]
    workers: int
    backlog_s: float  # the backlog, in seconds of the variant's ideal capacity
    warmup_s: float
    http_load: float  # offered rate of the HTTP figure, as a fraction of the ideal
    http_duration_s: float
    seed: int


@dataclass(frozen=True, slots=True)
class _BatchRow:
    worker: str
    size: int
    dispatched: float
    started: float
    finished: float
    model_s: float


async def run_saturation(deployment: BenchDeployment, plan: SaturationPlan) -> dict[str, Any]:
    results = []
    http: dict[str, Any] | None = None
    for variant in plan.variants:
        results.append(await _drain(deployment, plan, variant))
        if variant.label == "adaptive" and plan.http_duration_s > 0 and plan.http_load > 0:
            http = await _http_figure(deployment, plan, variant)
        await deployment.stop_variant(variant)
    return {
        "scenario": "saturation",
        "workers": plan.workers,
        "backlog_s": plan.backlog_s,
        "results": results,
        "http": http,
    }


async def _drain(
    deployment: BenchDeployment, plan: SaturationPlan, variant: Variant
) -> dict[str, Any]:
    ideal = variant.ideal_rps(plan.workers)
    count = max(4 * variant.max_batch_size * plan.workers, round(plan.backlog_s * ideal))
    job = await start_job(
        deployment.url, deployment.headers, variant.name, count, f"drain-{variant.label}"
    )
    await wait_job(deployment.url, deployment.headers, job.id, ("in_progress",), 600)
    ids = [
        str(r[0])
        for r in deployment.query("SELECT id FROM requests WHERE job_id = %s", (job_uuid(job.id),))
    ]
    await deployment.start_variant(variant)
    roles_before = deployment.cpu_s()
    drained = await deployment.clock.wait_for(ids, timeout_s=10 * count / ideal + 60)
    cpu_ms = cpu_per(roles_before, deployment.cpu_s(), count)
    rows = [
        _BatchRow(str(r[0]), int(r[1]), float(r[2]), float(r[3]), float(r[4]), float(r[5]) / 1000.0)
        for r in deployment.query(
            "SELECT worker, size, extract(epoch FROM dispatched_at),"
            " extract(epoch FROM started_at), extract(epoch FROM finished_at), model_ms"
            " FROM batches WHERE model = %s AND outcome = 'succeeded' ORDER BY finished_at",
            (variant.name,),
        )
    ]
    figures = drain_figures(rows, variant.max_batch_size, plan.warmup_s, plan.workers)
    heard = [deployment.clock.heard[i] for i in ids if i in deployment.clock.heard]
    start, end = figures.pop("window")
    announced = sum(start < t <= end for t in heard) / (end - start) if end > start else 0.0
    return {
        "variant": variant.label,
        "policy": variant.policy,
        "max_batch_size": variant.max_batch_size,
        "ideal_rps": ideal,
        "backlog": count,
        "drained": drained,
        **figures,
        "ratio_to_ideal": round(figures["drain_rps"] / ideal, 4),
        "announced_rps": round(announced, 1),
        "announced_ratio": round(announced / ideal, 4),
        "cpu_ms_per_request": cpu_ms,
        "timeline": _timeline([r.finished for r in rows], [r.size for r in rows]),
    }


def drain_figures(
    rows: list[_BatchRow], max_batch_size: int, warmup_s: float, slots: int
) -> dict[str, Any]:
    """Steady drain rate summed over slots, mean batch size and idle gaps, in the window."""
    if not rows:
        return {"drain_rps": 0.0, "mean_batch": 0.0, "batches": 0, "window": (0.0, 0.0)}
    by_slot = _lay_on_slots(rows, slots)
    first = min(r.started for r in rows)
    # Steady state ends where the first slot ran out of full batches.
    end = min(
        max((r.finished for r in slot if r.size == max_batch_size), default=0.0)
        for slot in by_slot.values()
    )
    begin = first + min(warmup_s, max(0.0, end - first) / 4)  # a short run keeps most of it
    drain_rps, sizes = 0.0, []
    gaps: dict[str, list[float]] = {"idle_gap": [], "sent_ahead": [], "handover": [], "lease": []}
    for slot in by_slot.values():
        inside = [r for r in slot if begin <= r.finished <= end]
        if len(inside) >= 2:
            span_s = inside[-1].finished - inside[0].finished
            drain_rps += sum(r.size for r in inside[1:]) / span_s
        sizes += [r.size for r in inside]
        for a, b in itertools.pairwise(inside):
            model_start = b.finished - b.model_s
            # A standby process may start its model a hair before the last one's end is
            # read (the end is taken after the gate opens): no overlap, a zero gap.
            gaps["idle_gap"].append(max(0.0, model_start - a.finished))
            gaps["sent_ahead"].append(a.finished - b.dispatched)
            # With standby processes the lease is taken while the previous model runs.
            gaps["handover"].append(max(0.0, b.started - max(b.dispatched, a.finished)))
            gaps["lease"].append(max(0.0, model_start - max(b.started, a.finished)))
    return {
        "drain_rps": round(drain_rps, 1),
        "mean_batch": round(sum(sizes) / len(sizes), 2) if sizes else 0.0,
        "batches": len(sizes),
        "window_s": round(max(0.0, end - begin), 2),
        "slots": len(by_slot),
        # Between a slot's batches: the model's idle time; how early the next batch was sent;
        # from the later of its dispatch and the last model end to its lease, and the lease.
        **{
            f"{name}_{q}_ms": round(percentile(spans, p) * 1000.0, 2)
            for name, spans in gaps.items()
            for q, p in (("p50", 0.5), ("p99", 0.99))
        },
        "window": (begin, end),
    }


def _lay_on_slots(rows: list[_BatchRow], slots: int) -> dict[int, list[_BatchRow]]:
    """The batches each slot ran, in order: every batch, by model start, goes to the slot that
    freed first. A slot is not a process: with standby processes two of them take turns."""
    free = [(0.0, n) for n in range(max(1, slots))]
    by_slot: dict[int, list[_BatchRow]] = defaultdict(list)
    for row in sorted(rows, key=lambda r: r.finished - r.model_s):
        _, n = heapq.heappop(free)
        by_slot[n].append(row)
        heapq.heappush(free, (row.finished, n))
    return by_slot


def _timeline(finished: list[float], sizes: list[int], bucket_s: float = 0.5) -> list[list[float]]:
    """Requests finished per second, in ``bucket_s`` buckets from the first batch end."""
    if not finished:
        return []
    first = min(finished)
    counts: dict[int, int] = defaultdict(int)
    for at, size in zip(finished, sizes, strict=True):
        counts[int((at - first) / bucket_s)] += size
    last = max(counts)
    return [[round(i * bucket_s, 2), counts.get(i, 0) / bucket_s] for i in range(last + 1)]


async def _http_figure(
    deployment: BenchDeployment, plan: SaturationPlan, variant: Variant
) -> dict[str, Any]:
    ideal = variant.ideal_rps(plan.workers)
    offered = plan.http_load * ideal
    schedule = poisson_schedule(offered, plan.http_duration_s, plan.seed)
    started = time.time()
    load = await open_loop(
        deployment.url,
        schedule,
        lambda i: {"model": variant.name, "input": f"http {i}", "timeout_s": 120},
        headers=deployment.headers,
    )
    begin, end = started + plan.warmup_s, started + plan.http_duration_s
    await asyncio.sleep(1.0)  # results of the last batches of the window
    served = sum(begin < t <= end for t in deployment.clock.heard.values())
    served_rps = served / (end - begin)
    return {
        "variant": variant.label,
        "offered_rps": round(offered, 1),
        "sent": len(load.submitted) + load.errors,
        "accepted": len(load.accepted),
        "refused": len(load.submitted) - len(load.accepted),
        "errors": load.errors,
        "served_rps": round(served_rps, 1),
        "ratio_to_ideal": round(served_rps / ideal, 4),
        "submit": summary_ms([s.latency_s for s in load.submitted]),
    }
