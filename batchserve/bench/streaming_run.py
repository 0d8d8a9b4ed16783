"""Running ``bench --scenario streaming``: one deployment serving every model compared (its
registry entries copied from the configured registry), one model's batcher and worker at a
time; the comparison itself is ``batchserve/bench/streaming.py``."""

from __future__ import annotations

import asyncio
import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchserve.bench.stack import BenchDeployment, bench_log_dir
from batchserve.bench.streaming import StreamingPlan, Workload, compare_model
from batchserve.models.plugins import is_engine
from batchserve.models.registry import ModelSpec, Registry
from batchserve.testing.deployment import ROOT, settled


def registry_toml(spec: ModelSpec) -> str:
    """``spec`` as a registry table: the deployment serves the model under its own name."""
    lines = [f"[models.{spec.name}]", f'backend = "{spec.backend}"']
    defaults = ModelSpec(name=spec.name, backend=spec.backend)
    for name in ModelSpec.__dataclass_fields__:
        value = getattr(spec, name)
        if name in ("name", "backend", "options", "description") or value is None:
            continue
        if value != getattr(defaults, name):
            lines.append(
                f"{name} = {json.dumps(list(value) if isinstance(value, tuple) else value)}"
            )
    for key, value in spec.options.items():
        if isinstance(value, str | int | float | bool):
            lines.append(f"{key} = {json.dumps(value)}")
    return "\n".join(lines) + "\n"


async def streaming_scenario(
    plan: StreamingPlan,
    registry: Registry,
    tokenizer: Path | None,
    keep: bool = False,
    say: Callable[[str], Any] = print,
    log_root: Path | None = None,
) -> dict[str, Any]:
    """Every model's comparison (and the client's run), on one deployment serving them all,
    one model's batcher and worker at a time."""
    from batchserve.bench.run import machine
    from batchserve.core.settings import load_settings

    specs = [registry_spec(registry, w.model) for w in plan.workloads]
    deployment = BenchDeployment(
        load_settings(),
        {},
        plan.workers,
        keep=keep,
        extra_models={s.name: registry_toml(s) for s in specs},
        log_dir=bench_log_dir(log_root),
    )
    before, started = machine(), time.monotonic()
    results: list[dict[str, Any]] = []
    async with deployment.running():
        for workload, spec in zip(plan.workloads, specs, strict=True):
            kind = "engine" if is_engine(spec) else "batch"
            await settled(deployment.stack, _start_model, deployment, spec.name, kind, plan.workers)
            result = await compare_model(deployment, workload, plan, kind, say)
            if plan.client and tokenizer is not None:
                result.client = await asyncio.to_thread(
                    _client, deployment, workload, plan, tokenizer
                )
                c = result.client
                say(
                    f"{workload.model} {c['client']}: TTFT p50 {c['ttft_p50_ms']:.1f} ms, "
                    f"ITL p50 {c['itl_p50_ms']:.2f} ms, {c['request_throughput']:.1f} requests/s"
                )
            await settled(deployment.stack, _stop_model, deployment, spec.name)
            results.append(result.as_dict())
    return {
        "scenario": "streaming",
        "concurrency": plan.concurrency,
        "pairs": plan.pairs,
        "workers": plan.workers,
        "models": results,
        "machine": {"before": before, "after": machine()},
        "wall_s": round(time.monotonic() - started, 1),
        "logs": str(deployment.log_dir),
    }


def registry_spec(registry: Registry, name: str) -> ModelSpec:
    spec = registry.get(name)
    if spec is None:
        raise ValueError(f"unknown model {name!r}; the registry has {', '.join(registry.names())}")
    return spec


def _start_model(deployment: BenchDeployment, name: str, kind: str, workers: int) -> None:
    stack = deployment.stack
    stack.start(f"batcher:{name}", "batcher", "--model", name)
    slots = () if kind == "engine" else ("--slots", str(workers))
    stack.start(f"worker:{name}", "worker", "--model", name, *slots)
    # An engine worker loads its model and measures its speed first.
    stack.wait_slots(name, 1 if kind == "engine" else workers, timeout_s=600)


def _stop_model(deployment: BenchDeployment, name: str) -> None:
    for role in (f"worker:{name}", f"batcher:{name}"):
        deployment.stack.stop(role, timeout_s=90)


def _client(
    deployment: BenchDeployment, workload: Workload, plan: StreamingPlan, tokenizer: Path
) -> dict[str, Any]:
    from batchserve.bench.client import ClientRun, client_command, ensure_client, run_client

    ensure_client()
    run = ClientRun(
        url=deployment.url,
        api_key=deployment.headers["Authorization"].removeprefix("Bearer "),
        model=workload.model,
        tokenizer=tokenizer,
        requests=workload.requests,
        concurrency=plan.concurrency,
        input_tokens=workload.prompt_words * 2,
        output_tokens=workload.max_tokens,
    )
    out_dir = deployment.log_dir / f"aiperf-{workload.model}"
    figures = run_client(run, out_dir, plan.client_timeout_s).as_dict()
    # As a reader would type it: the key, the environment and the run's log folder by name.
    shown = client_command(run, out_dir)
    shown[shown.index(run.api_key)] = "$BATCHSERVE_API_KEY"
    shown[0] = str(Path(shown[0]).relative_to(ROOT))
    shown[shown.index(str(out_dir))] = f"$LOGS/{out_dir.name}"
    return {**figures, "command": shlex.join(shown)}


def client_tokenizer(registry: Registry, plan: StreamingPlan) -> Path | None:
    """The local tokenizer directory the client counts tokens with: the first compared
    model's that has one, else the registry's SmolLM2 (for the echo model, whose output is its
    input, any tokenizer counts alike); converted from its GGUF file first if need be."""
    from batchserve.models.hf import ensure_converted
    from batchserve.models.plugins import plugin_for

    names = [w.model for w in plan.workloads] + ["smollm2-135m"]
    for name in names:
        spec = registry.get(name)
        if spec is not None and plugin_for(spec).tokenizer_dir is not None:
            return ensure_converted(spec)
    return None
