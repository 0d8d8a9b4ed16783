"""Running bench scenarios: one fresh deployment each, torn down after, with the machine noted."""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from batchserve.bench.drain import SaturationPlan, run_saturation
from batchserve.bench.frontdoor import FrontDoorPlan, run_frontdoor
from batchserve.bench.ingest import IngestPlan, MixedPlan, run_bulk, run_ingest, run_mixed
from batchserve.bench.latency import LatencyPlan, run_overhead
from batchserve.bench.stack import BenchDeployment, bench_log_dir, variants
from batchserve.core.logs import setup_logging
from batchserve.core.settings import load_settings


@dataclass(frozen=True, slots=True)
class BenchOptions:
    workers: int
    batch: int
    variants: list[str]
    timer_delay_ms: float
    duration_s: float
    loads: list[float]
    backlog_s: float
    warmup_s: float
    http_load: float
    rates: list[float]
    frontdoor_rates: list[float]
    step_s: float
    max_p99_ms: float
    wide_batch: int
    interactive_rps: float
    bulk_requests: int
    timeout_s: float
    seed: int
    profile: str | None = None
    profile_out: Path = Path("profile.svg")
    keep: bool = False
    api_processes: int = 1
    role_log_level: str = "WARNING"
    log_root: Path | None = None


def machine() -> dict[str, Any]:
    """Cores and how busy they were: other work on the box moves every figure."""
    one, five, fifteen = os.getloadavg()
    return {
        "cores": os.cpu_count(),
        "load_avg_1m": round(one, 2),
        "load_avg_5m": round(five, 2),
        "load_avg_15m": round(fifteen, 2),
    }


async def run_scenarios(names: list[str], options: BenchOptions) -> list[dict[str, Any]]:
    settings = load_settings()
    if settings.embedded:
        raise typer.BadParameter(
            "bench needs servers: set BATCHSERVE_DATABASE_URL, _BROKER_URL, _REDIS_URL"
        )
    setup_logging("bench", fmt="text", level="WARNING")
    logging.getLogger("aiormq").setLevel(logging.ERROR)
    catalogue = variants(options.batch, options.timer_delay_ms, options.wide_batch)
    unknown = [v for v in options.variants if v not in catalogue]
    if unknown:
        raise typer.BadParameter(f"unknown variant(s) {unknown}; one of {', '.join(catalogue)}")
    documents = []
    for name in names:
        deployment = BenchDeployment(
            settings,
            catalogue,
            options.workers,
            keep=options.keep,
            profile_role=options.profile,
            profile_out=options.profile_out,
            api_processes=options.api_processes,
            log_level=options.role_log_level,
            log_dir=bench_log_dir(options.log_root),
        )
        before = machine()
        started = time.monotonic()
        async with deployment.running():
            doc = await _run_one(name, deployment, options, catalogue)
        doc["machine"] = {"before": before, "after": machine()}
        doc["api_processes"] = options.api_processes
        doc["role_log_level"] = options.role_log_level
        doc["wall_s"] = round(time.monotonic() - started, 1)
        doc["logs"] = str(deployment.log_dir)
        documents.append(doc)
    return documents


async def _run_one(
    name: str, deployment: BenchDeployment, options: BenchOptions, catalogue: dict[str, Any]
) -> dict[str, Any]:
    chosen = [catalogue[v] for v in options.variants]
    adaptive = catalogue["adaptive"]
    if name == "saturation":
        return await run_saturation(
            deployment,
            SaturationPlan(
                variants=chosen,
                workers=options.workers,
                backlog_s=options.backlog_s,
                warmup_s=options.warmup_s,
                http_load=options.http_load,
                http_duration_s=options.duration_s,
                seed=options.seed,
            ),
        )
    if name == "overhead":
        return await run_overhead(
            deployment,
            LatencyPlan(
                variants=chosen,
                workers=options.workers,
                reference_rps=adaptive.ideal_rps(options.workers),
                loads=options.loads,
                duration_s=options.duration_s,
                timeout_s=options.timeout_s,
                seed=options.seed,
            ),
        )
    if name == "ingest":
        plan = IngestPlan(
            catalogue["wide"], options.rates, options.step_s, options.max_p99_ms, options.seed
        )
        return await run_ingest(deployment, plan)
    if name == "frontdoor":
        return await run_frontdoor(
            deployment,
            FrontDoorPlan(
                adaptive, options.workers, options.frontdoor_rates, options.duration_s, options.seed
            ),
        )
    if name == "bulk":
        return await run_bulk(deployment, adaptive, options.bulk_requests)
    if name == "mixed":
        return await run_mixed(
            deployment,
            MixedPlan(
                adaptive, options.workers, options.interactive_rps, options.duration_s, options.seed
            ),
        )
    raise ValueError(f"unknown scenario {name}")
