"""``bench --scenario ingest|bulk|mixed``: the API's submit rate, bulk persistence, and
interactive latency beside a bulk job.

- **ingest** steps the offered single-submit rate up (Poisson, open loop) against a variant with
  a wide batch, so the workers keep up and the API is what is measured, and reports each step's
  submit latency; the figure is the highest rate whose p99 stays under ``max_p99_ms`` with every
  request accepted.
- **bulk** uploads a JSONL job with no batcher or worker running and times how fast the job
  driver validates, persists (``COPY``) and publishes it: created -> ``in_progress``.
- **mixed** measures interactive latency (send to long-polled answer) first alone, then while a
  bulk job large enough to keep every slot busy is being ingested and run.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from batchserve.bench.jobs import get_job, job_uuid, start_job, wait_job
from batchserve.bench.loadgen import Submitted, open_loop, poisson_schedule
from batchserve.bench.stack import (
    BenchDeployment,
    Variant,
    busy_share,
    cores_busy,
    cpu_per,
    percentile,
    server_cpu_per,
    server_cpu_s,
    tcp_counters,
    tcp_delta,
)


@dataclass(frozen=True, slots=True)
class IngestPlan:
    variant: Variant
    rates: list[float]
    step_s: float
    max_p99_ms: float
    seed: int


async def run_ingest(deployment: BenchDeployment, plan: IngestPlan) -> dict[str, Any]:
    await deployment.start_variant(plan.variant)
    # Warm-up, not recorded: the API's connection pool fills and its key cache is filled.
    await _ingest_step(deployment, plan, min(plan.rates[0], 100.0), plan.seed - 1, 2.0)
    steps: list[dict[str, Any]] = []
    saturated_in_a_row = 0
    for index, rate in enumerate(plan.rates):
        step = await _ingest_step(deployment, plan, rate, plan.seed + index)
        steps.append(step)
        saturated = step["p50_ms"] > plan.max_p99_ms or step["errors"] > 0
        saturated_in_a_row = saturated_in_a_row + 1 if saturated else 0
        if saturated_in_a_row == 2:
            break  # past the knee: higher rates only take longer to say the same
    await deployment.stop_variant(plan.variant)
    passing = [s["rate"] for s in steps if s["ok"]]
    return {
        "scenario": "ingest",
        "variant": plan.variant.label,
        "max_batch_size": plan.variant.max_batch_size,
        "max_p99_ms": plan.max_p99_ms,
        "steps": steps,
        "max_rate_ok": max(passing) if passing else 0.0,
    }


async def _ingest_step(
    deployment: BenchDeployment,
    plan: IngestPlan,
    rate: float,
    seed: int,
    step_s: float | None = None,
) -> dict[str, Any]:
    step_s = step_s or plan.step_s
    # Scraped before the CPU figures start: the scrape is the bench's work, not the step's.
    gc_before = await asyncio.to_thread(deployment.api_gc)
    roles_before, servers_before = deployment.cpu_s(), server_cpu_s()
    tcp_before, busy_before = tcp_counters(), cores_busy()
    cpu_started, wall_started = time.process_time(), time.perf_counter()
    load = await open_loop(
        deployment.url,
        poisson_schedule(rate, step_s, seed),
        lambda i: {"model": plan.variant.name, "input": f"ingest {seed} {i}"},
        headers=deployment.headers,
    )
    tcp, busy = tcp_delta(tcp_before, tcp_counters()), busy_share(busy_before, cores_busy())
    wall_s = time.perf_counter() - wall_started
    loadgen_cpu = (time.process_time() - cpu_started) / wall_s
    latencies_ms = [s.latency_s * 1000.0 for s in load.submitted]
    sent_at = sorted(s.sent_at for s in load.submitted)
    span_s = sent_at[-1] - sent_at[0] if len(sent_at) > 1 else step_s
    accepted = [s.request_id for s in load.accepted if s.request_id]
    p99 = percentile(latencies_ms, 0.99)
    refused = len(load.submitted) - len(accepted)
    # Let the step's requests finish, so the next step starts from an empty pipeline.
    await deployment.clock.wait_for(accepted, timeout_s=30)
    cpu_ms = cpu_per(roles_before, deployment.cpu_s(), len(accepted))
    servers_ms = server_cpu_per(servers_before, server_cpu_s(), len(accepted))
    gc_after = await asyncio.to_thread(deployment.api_gc)
    return {
        "rate": rate,
        "sent": len(load.submitted) + load.errors,
        "sent_rps": round(len(sent_at) / span_s, 1) if span_s > 0 else 0.0,
        "accepted": len(accepted),
        "refused": refused,
        "errors": load.errors,
        "p50_ms": round(percentile(latencies_ms, 0.5), 2),
        "p99_ms": round(p99, 2),
        "max_ms": round(max(latencies_ms), 2) if latencies_ms else math.nan,
        "loadgen_cpu": round(loadgen_cpu, 2),
        "cpu_ms_per_request": cpu_ms,
        "server_cpu_ms_per_request": servers_ms,
        # How much of the machine's CPU was busy while the step sent: near 1, every figure
        # above is the machine's limit as much as batchserve's.
        "cores_busy": busy,
        "api_gc": {
            "collections": int(gc_after["collections"] - gc_before["collections"]),
            "full": int(gc_after["full"] - gc_before["full"]),
            "ms": round((gc_after["seconds"] - gc_before["seconds"]) * 1000, 2),
        },
        "tcp": tcp,
        "loadgen_gc": load.collector.as_dict(),
        "ok": bool(p99 <= plan.max_p99_ms and refused == 0 and load.errors == 0),
    }


async def run_bulk(deployment: BenchDeployment, variant: Variant, requests: int) -> dict[str, Any]:
    """Persist a job with nothing consuming its queue: the job driver's rate alone."""
    job = await start_job(deployment.url, deployment.headers, variant.name, requests, "bulk")
    await wait_job(deployment.url, deployment.headers, job.id, ("in_progress",), 900)
    figures = _ingest_times(deployment, job.id)
    created, in_progress = figures["created"], figures["in_progress"]
    chunks: list[tuple[float, int]] = figures["chunks"]
    after_first = sum(n for _, n in chunks[1:])
    chunk_span = chunks[-1][0] - chunks[0][0] if len(chunks) > 1 else 0.0
    return {
        "scenario": "bulk",
        "requests": requests,
        "upload_s": round(job.upload_s, 3),
        "chunks": len(chunks),
        "created_to_first_chunk_s": round(chunks[0][0] - created, 3),
        "created_to_in_progress_s": round(in_progress - created, 3),
        "ingest_rps": round(requests / (in_progress - created), 1),
        "persist_rps": round(after_first / chunk_span, 1) if chunk_span > 0 else math.nan,
    }


def _ingest_times(deployment: BenchDeployment, job_id: str) -> dict[str, Any]:
    """The job's created and in_progress times, and each chunk's time and row count (a chunk's
    rows share the ``created_at`` the driver stamped before writing it)."""
    job = deployment.query(
        "SELECT extract(epoch FROM created_at), extract(epoch FROM in_progress_at)"
        " FROM batch_jobs WHERE id = %s",
        (job_uuid(job_id),),
    )[0]
    chunks = deployment.query(
        "SELECT extract(epoch FROM created_at), count(*) FROM requests WHERE job_id = %s"
        " GROUP BY created_at ORDER BY created_at",
        (job_uuid(job_id),),
    )
    return {
        "created": float(job[0]),
        "in_progress": float(job[1]),
        "chunks": [(float(t), int(n)) for t, n in chunks],
    }


@dataclass(frozen=True, slots=True)
class MixedPlan:
    variant: Variant
    workers: int
    rate: float  # interactive requests/s
    duration_s: float  # of each phase
    seed: int


async def run_mixed(deployment: BenchDeployment, plan: MixedPlan) -> dict[str, Any]:
    variant = plan.variant
    await deployment.start_variant(variant)
    await _interactive(deployment, variant, 20.0, 1.0, plan.seed)  # warm-up
    alone = await _interactive(deployment, variant, plan.rate, plan.duration_s, plan.seed)
    ideal = variant.ideal_rps(plan.workers)
    requests = max(1000, math.ceil(ideal * (plan.duration_s + 10.0)))
    job = await start_job(deployment.url, deployment.headers, variant.name, requests, "mixed")
    beside = await _interactive(deployment, variant, plan.rate, plan.duration_s, plan.seed + 1)
    progress = await get_job(deployment.url, deployment.headers, job.id)
    await deployment.stop_variant(variant)
    counts = progress["request_counts"]
    a50, a99 = percentile(alone.latencies_ms, 0.5), percentile(alone.latencies_ms, 0.99)
    b50, b99 = percentile(beside.latencies_ms, 0.5), percentile(beside.latencies_ms, 0.99)
    return {
        "scenario": "mixed",
        "interactive_rps": plan.rate,
        "job_requests": requests,
        "job_done_during": counts["completed"] + counts["failed"],
        "alone_sent": alone.sent,
        "alone_n": len(alone.latencies_ms),
        "alone_p50_ms": round(a50, 1),
        "alone_p99_ms": round(a99, 1),
        "with_job_sent": beside.sent,
        "with_job_n": len(beside.latencies_ms),
        "with_job_p50_ms": round(b50, 1),
        "with_job_p99_ms": round(b99, 1),
        "p50_ratio": round(b50 / a50, 2) if a50 else math.nan,
        "p99_ratio": round(b99 / a99, 2) if a99 else math.nan,
    }


@dataclass(frozen=True, slots=True)
class _Phase:
    latencies_ms: list[float]  # of the requests that succeeded
    sent: int


async def _interactive(
    deployment: BenchDeployment, variant: Variant, rate: float, duration_s: float, seed: int
) -> _Phase:
    """Send to answer, in ms, of each request of a Poisson trace that succeeded."""
    latencies: list[float] = []

    async def poll(session: aiohttp.ClientSession, submitted: Submitted) -> None:
        for _ in range(4):
            path = f"/v1/requests/{submitted.request_id}"
            async with session.get(path, params={"wait": "30"}) as got:
                body = orjson.loads(await got.read())
            if body.get("status") == "succeeded":
                latencies.append((time.time() - submitted.sent_at) * 1000.0)
                return
            if body.get("status") in ("failed", "cancelled", "expired"):
                return

    load = await open_loop(
        deployment.url,
        poisson_schedule(rate, duration_s, seed),
        lambda i: {"model": variant.name, "input": f"interactive {seed} {i}"},
        headers=deployment.headers,
        on_accepted=poll,
    )
    return _Phase(latencies, len(load.submitted) + load.errors)
