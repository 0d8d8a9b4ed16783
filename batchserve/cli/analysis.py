"""``batchserve simulate`` and ``batchserve capacity``: the policy's numbers, before any server."""

from __future__ import annotations

import json
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from batchserve.batching.capacity import (
    CapacityPlan,
    EngineLoad,
    plan_capacity,
    plan_engine_capacity,
)
from batchserve.batching.scenarios import SweepRow, adaptive_verdict, seed_exercises, sweep
from batchserve.core.clock import deployment_time

console = Console(width=120)

DEFAULT_LOADS = "0.1,0.3,0.5,0.7,0.85,0.95"
DEFAULT_POLICIES = "size-only,timer:10,timer:25,timer:50,greedy,adaptive"


def simulate(
    scenario: Annotated[str, typer.Option(help="seed-exercises or sweep")] = "seed-exercises",
    loads: Annotated[str, typer.Option(help="Fractions of capacity")] = DEFAULT_LOADS,
    policies: Annotated[
        str, typer.Option(help="size-only, greedy, timer:<ms>, adaptive")
    ] = DEFAULT_POLICIES,
    workers: Annotated[int, typer.Option(help="Worker slots")] = 1,
    max_batch: Annotated[int, typer.Option(help="Batch size limit")] = 32,
    batch_time_ms: Annotated[float, typer.Option(help="Time of one batch")] = 100.0,
    requests: Annotated[int, typer.Option(help="Requests per (policy, load)")] = 20_000,
    arrivals: Annotated[str, typer.Option(help="poisson or bursty")] = "poisson",
    seed: Annotated[int, typer.Option(help="Random seed (runs are reproducible)")] = 1,
    plot: Annotated[Path | None, typer.Option(help="Write p99 vs load to this PNG")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
) -> None:
    """Discrete-event simulation of the batching policy (the same code the batcher runs)."""
    if scenario == "seed-exercises":
        _seed_exercises(as_json)
        return
    if scenario != "sweep":
        raise typer.BadParameter("scenario must be seed-exercises or sweep")
    load_list = [float(x) for x in loads.split(",") if x.strip()]
    policy_list = [p.strip() for p in policies.split(",") if p.strip()]
    kwargs = {
        "policies": policy_list,
        "workers": workers,
        "max_batch_size": max_batch,
        "batch_time_s": batch_time_ms / 1000.0,
        "requests": requests,
        "arrivals": arrivals,
        "seed": seed,
    }
    with ProcessPoolExecutor() as pool:  # one load per process: the sweep is CPU-bound
        parts = pool.map(_sweep_one, [(load, kwargs) for load in load_list])
        rows = [row for part in parts for row in part]
    verdict = adaptive_verdict(rows) if "adaptive" in policy_list and len(policy_list) > 1 else None
    if plot is not None:
        from batchserve.cli.plots import plot_sweep

        title = f"{workers} worker(s), batch {max_batch}, {batch_time_ms:g} ms, {arrivals} arrivals"
        plot_sweep(rows, plot, title)
    if as_json:
        document: dict[str, object] = {"results": [asdict(r) for r in rows]}
        if verdict is not None:
            document["verdict"] = {**asdict(verdict), "within_5_percent": verdict.within_5_percent}
        typer.echo(json.dumps(document, indent=2))
        return
    _print_sweep(rows)
    if verdict is not None:
        beaten = ", ".join(
            f"{p} at {load:.0%}" for p, load in verdict.beaten_at.items() if load is not None
        )
        console.print(
            f"adaptive p99 / best static p99: at most {verdict.worst_ratio_to_best:.3f} "
            f"(at {verdict.worst_load:.0%} load); strictly better than: {beaten or 'none'}"
        )


def _sweep_one(job: tuple[float, dict[str, object]]) -> list[SweepRow]:
    load, kwargs = job
    return sweep(loads=[load], **kwargs)  # type: ignore[arg-type]


def _print_sweep(rows: list[SweepRow]) -> None:
    table = Table(title="Policy sweep")
    for column in ("policy", "load", "p50 ms", "p95 ms", "p99 ms", "mean batch", "utilization"):
        table.add_column(column, justify="right")
    for r in rows:
        table.add_row(
            r.policy,
            f"{r.load:.0%}",
            f"{r.p50_ms:.1f}",
            f"{r.p95_ms:.1f}",
            f"{r.p99_ms:.1f}",
            f"{r.mean_batch:.1f}",
            f"{r.utilization:.1%}",
        )
    console.print(table)


def _seed_exercises(as_json: bool) -> None:
    rows, checks = seed_exercises()
    ok = all(c.ok for c in checks)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "timeline": [asdict(r) for r in rows],
                    "checks": [asdict(c) | {"ok": c.ok} for c in checks],
                    "ok": ok,
                },
                indent=2,
            )
        )
    else:
        table = Table(
            title="The seeds' exercises: 1 worker, batch limit 4, 10 ms delay, 100 ms batches"
        )
        for column in (
            "exercise",
            "request",
            "arrived",
            "dispatched",
            "finished",
            "latency",
            "note",
        ):
            table.add_column(column)
        for r in rows:
            table.add_row(
                r.exercise,
                r.request,
                _ms(r.arrived_ms),
                _ms(r.dispatched_ms),
                _ms(r.finished_ms),
                _ms(r.latency_ms),
                r.note,
            )
        console.print(table)
        for c in checks:
            mark = "ok  " if c.ok else "FAIL"
            console.print(f"{mark} {c.exercise}: {c.what}: expected {c.expected}, got {c.actual}")
    if not ok:
        raise typer.Exit(1)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:g} ms"


def capacity(
    rate: Annotated[float, typer.Option(help="Requests per second to serve")],
    max_batch: Annotated[int, typer.Option(help="Batch size limit")] = 32,
    batch_time_ms: Annotated[float, typer.Option(help="Time of one batch")] = 100.0,
    mean_batch: Annotated[
        float | None, typer.Option(help="Mean batch size (default: full)")
    ] = None,
    headroom: Annotated[float, typer.Option(help="Share of capacity kept for bursts")] = 0.25,
    model: Annotated[
        str | None,
        typer.Option(
            help="Plan for this model from its measured batches (the configured database): "
            "batch size limit from the registry, batch time fitted on what workers reported"
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
) -> None:
    """Worker count from rate, batch size, batch time and headroom."""
    measured: dict[str, object] = {}
    engine_plan: CapacityPlan | None = None
    if model is not None:
        engine_plan, measured = measured_engine_plan(model, rate, headroom)
        if engine_plan is None:
            max_batch, batch_time_ms, measured = measured_batch_time(model)
        if not as_json:
            console.print(_measured_line(model, measured, batch_time_ms))
    try:
        plan = engine_plan or plan_capacity(
            rate_rps=rate,
            max_batch=max_batch,
            batch_time_s=batch_time_ms / 1000.0,
            mean_batch=mean_batch,
            headroom=headroom,
        )
    except ValueError as error:
        raise typer.BadParameter(str(error)) from error
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "rate_rps": plan.rate_rps,
                    "max_batch": plan.max_batch,
                    "batch_time_ms": plan.batch_time_s * 1000,
                    "mean_batch": plan.mean_batch,
                    "headroom": plan.headroom,
                    "per_worker_rps": plan.per_worker_rps,
                    "min_workers": plan.min_workers,
                    "recommended_workers": plan.recommended_workers,
                    "min_utilization": round(plan.min_utilization, 4),
                    "recommended_utilization": round(plan.recommended_utilization, 4),
                    "options": [asdict(o) for o in plan.options],
                    **({"model": model, "measured": measured} if model else {}),
                },
                indent=2,
            )
        )
        return
    console.print(f"per-worker capacity: {plan.per_worker_rps:.0f} requests/s")
    console.print(
        f"minimum workers:     {plan.min_workers} (utilization {plan.min_utilization:.1%})"
    )
    console.print(
        f"recommended workers: {plan.recommended_workers} at {plan.headroom:.0%} headroom "
        f"(utilization {plan.recommended_utilization:.1%})"
    )
    table = Table()
    for column in ("workers", "capacity/s", "utilization", ""):
        table.add_column(column, justify="right")
    for o in plan.options:
        note = (
            "falls behind"
            if o.utilization > 1
            else ("recommended" if o.workers == plan.recommended_workers else "")
        )
        table.add_row(str(o.workers), f"{o.capacity_rps:.0f}", f"{o.utilization:.1%}", note)
    console.print(table)
    console.print(plan.explain())


def _measured_line(model: str, measured: dict[str, object], batch_time_ms: float) -> str:
    if "requests" in measured:
        return (
            f"{model}: an engine of {measured['max_num_seqs']} sequences; "
            f"{measured['requests']} finished requests, typically "
            f"{measured['typical_prompt_tokens']:.0f} prompt and "
            f"{measured['typical_generated_tokens']:.0f} generated tokens; the engine measured "
            f"{measured['prefill_tokens_per_s']:.0f} prefill tokens/s and "
            f"{float(str(measured['decode_step_s'])) * 1000:.0f} ms a full decode step"
        )
    return (
        f"{model}: {measured['batches']} measured batches; a full batch of the typical "
        f"shape takes {batch_time_ms:.0f} ms (fitted)"
    )


def measured_engine_plan(
    model: str, rate: float, headroom: float
) -> tuple[CapacityPlan | None, dict[str, object]]:
    """For an engine model: the plan from its engines' measured speed (what a live worker
    announced) and the typical request its finished requests show. ``None`` for batch models."""
    import statistics

    from batchserve.cli.keys import with_store
    from batchserve.cli.served import admin_settings
    from batchserve.core.wiring import connect
    from batchserve.models.plugins import is_engine
    from batchserve.models.registry import load_registry

    settings = admin_settings()
    spec = load_registry(settings.models).get(model)
    if spec is None:
        raise typer.BadParameter(f"unknown model {model}", param_hint="--model")
    if not is_engine(spec):
        return None, {}

    async def live_capacity() -> Any:
        adapters = connect(settings, pool_size=1)
        try:
            return await adapters.slots.capacity(model, deployment_time())
        finally:
            await adapters.close()

    found = with_store(settings.effective_database_url, lambda _store: live_capacity())
    if found is None or not found.profile or not found.units:
        raise typer.BadParameter(
            f"no engine of {model} is running: its speed is what a live worker measured "
            f"(start one with `batchserve worker --model {model}`)",
            param_hint="--model",
        )
    rows = with_store(
        settings.effective_database_url, lambda store: store.finished_sequences(model, limit=2000)
    )
    if not rows:
        raise typer.BadParameter(
            f"no finished requests of {model} yet: run some traffic first", param_hint="--model"
        )
    profile = found.profile
    seqs_per_engine = max(1, round(found.units / max(1, found.workers)))
    load = EngineLoad(
        max_num_seqs=seqs_per_engine,
        prefill_tokens_per_s=float(profile["prefill_tokens_per_s"]),
        decode_step_s=float(profile["decode_step_s"]),
        prompt_tokens=statistics.median(r.prompt_tokens for r in rows),
        generated_tokens=statistics.median(r.generated_tokens for r in rows),
    )
    plan = plan_engine_capacity(rate_rps=rate, load=load, headroom=headroom)
    return plan, {
        "requests": len(rows),
        "max_num_seqs": load.max_num_seqs,
        "typical_prompt_tokens": load.prompt_tokens,
        "typical_generated_tokens": load.generated_tokens,
        "prefill_tokens_per_s": round(load.prefill_tokens_per_s, 1),
        "decode_step_s": round(load.decode_step_s, 4),
        "engine_s_per_request": round(load.engine_s_per_request, 4),
    }


def measured_batch_time(model: str) -> tuple[int, float, dict[str, object]]:
    """The registry's batch size limit and the batch time learned from ``model``'s finished
    batches, for a full batch shaped like the typical measured one."""
    import statistics

    from batchserve.batching.batcher import estimator_for
    from batchserve.batching.estimate import BatchObservation, BatchShape, LearnedBatchTime
    from batchserve.cli.keys import with_store
    from batchserve.cli.served import admin_settings
    from batchserve.models.registry import load_registry

    settings = admin_settings()
    spec = load_registry(settings.models).get(model)
    if spec is None:
        raise typer.BadParameter(f"unknown model {model}", param_hint="--model")
    rows = with_store(
        settings.effective_database_url, lambda store: store.finished_batches(model, limit=2000)
    )
    if not rows:
        raise typer.BadParameter(
            f"no finished batches of {model} yet: run some traffic first", param_hint="--model"
        )
    fitted = LearnedBatchTime(estimator_for(spec), window=len(rows), min_observations=4)
    fitted.observe_all(
        BatchObservation(BatchShape(r.size, r.prompt_tokens, r.max_new_tokens), r.seconds)
        for r in rows
    )
    per_request_prompt = sum(r.prompt_tokens for r in rows) / max(1, sum(r.size for r in rows))
    steps = int(statistics.median(r.max_new_tokens for r in rows))
    size = spec.max_batch_size
    batch_s = fitted.batch_s(BatchShape(size, round(per_request_prompt * size), steps))
    return (
        size,
        batch_s * 1000.0,
        {
            "batches": len(rows),
            "mean_batch_size": round(statistics.fmean(r[1] for r in rows), 2),
            "median_model_ms": round(statistics.median(r[4] for r in rows) * 1000.0, 1),
            "typical_steps": steps,
            "coefficients": fitted.coefficients,
        },
    )
