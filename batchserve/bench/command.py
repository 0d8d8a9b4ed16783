"""``batchserve bench``: benchmarks that print figures (never pass/fail timing tests).

Every scenario but ``model`` starts its own deployment (API, maintenance, and per variant a
batcher and a worker with W slots) on a scratch database and queue namespace of the configured
servers, measures, and removes it. See docs/benchmarks.md for what each one measures.
"""

from __future__ import annotations

import json
import math
from collections.abc import Coroutine
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from batchserve.bench.streaming import StreamingPlan

console = Console(width=140)
T = TypeVar("T")

SCENARIOS = (
    "saturation",
    "overhead",
    "ingest",
    "bulk",
    "mixed",
    "frontdoor",
    "model",
    "streaming",
    "embeddings",
    "all",
)
ALL = ("saturation", "overhead", "ingest", "bulk", "mixed")


# Scenarios that deploy (or load) what they measure their own way, not through BenchOptions.
_OWN_DEPLOYMENT = ("model", "embeddings", "streaming")


class RoleLogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


def _floats(text: str) -> list[float]:
    return [float(part) for part in text.split(",") if part.strip()]


def bench(
    scenario: Annotated[str, typer.Option(help="Which benchmark: " + ", ".join(SCENARIOS))],
    workers: Annotated[int, typer.Option(help="W: worker slots")] = 2,
    batch: Annotated[int, typer.Option(help="B: max batch size of the batched variants")] = 16,
    variants: Annotated[
        str,
        typer.Option(
            help="Variants compared (saturation, overhead): adaptive,timer,nobatch,nostandby"
        ),
    ] = "adaptive,timer,nobatch",
    timer_delay_ms: Annotated[float, typer.Option(help="The timer variant's delay")] = 10.0,
    duration: Annotated[
        float, typer.Option(help="Seconds of traffic (overhead trace, mixed phase, HTTP figure)")
    ] = 15.0,
    loads: Annotated[
        str, typer.Option(help="overhead: offered loads, fractions of 10·W·B")
    ] = "0.3",
    backlog_s: Annotated[
        float, typer.Option(help="saturation: backlog, in seconds of ideal capacity")
    ] = 20.0,
    warmup_s: Annotated[float, typer.Option(help="saturation: warm-up left out")] = 1.0,
    http_load: Annotated[
        float, typer.Option(help="saturation: HTTP figure's offered rate / ideal (0: skip)")
    ] = 1.1,
    rates: Annotated[
        str, typer.Option(help="ingest: offered submit rates, stepped")
    ] = "250,500,750,1000,1250,1500",
    step_s: Annotated[float, typer.Option(help="ingest: seconds per rate")] = 5.0,
    frontdoor_rates: Annotated[
        str, typer.Option(help="frontdoor: offered rates, each path --duration s at each")
    ] = "30,100,200,300",
    max_p99_ms: Annotated[float, typer.Option(help="ingest: the submit p99 bound")] = 50.0,
    wide_batch: Annotated[int, typer.Option(help="ingest: batch size of its workers")] = 128,
    rate: Annotated[float, typer.Option(help="mixed: interactive requests/s")] = 10.0,
    requests: Annotated[int, typer.Option(help="bulk: lines in the JSONL job")] = 20_000,
    timeout_s: Annotated[float, typer.Option(help="overhead: each request's deadline")] = 30.0,
    seed: Annotated[int, typer.Option(help="Arrival seed")] = 1,
    profile: Annotated[
        str | None,
        typer.Option(help="py-spy the first api, batcher, worker or maintenance process"),
    ] = None,
    profile_out: Annotated[Path, typer.Option(help="Flame graph (SVG) of --profile")] = Path(
        "profile.svg"
    ),
    keep: Annotated[bool, typer.Option(help="Keep the run's database and logs")] = False,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Where each deployment's log folder goes (default: the temporary directory)",
        ),
    ] = None,
    api_processes: Annotated[
        int, typer.Option(min=1, max=64, help="Processes of batchserve's API (api --processes)")
    ] = 1,
    role_log_level: Annotated[
        RoleLogLevel,
        typer.Option(help="The roles' log level (BATCHSERVE_LOG_LEVEL; the service's: INFO)"),
    ] = RoleLogLevel.WARNING,
    model: Annotated[str, typer.Option(help="Model (scenario model)")] = "smollm2-135m",
    prompts: Annotated[int, typer.Option(help="Chat prompts (scenario model)")] = 64,
    max_tokens: Annotated[int, typer.Option(help="New tokens a request (scenario model)")] = 64,
    mixed_s: Annotated[
        float, typer.Option(help="Scenario model: seconds of mixed short/long traffic (0: skip)")
    ] = 120.0,
    vllm: Annotated[
        bool, typer.Option(help="Scenario model: also vLLM, direct and as a backend")
    ] = True,
    transformers_cb: Annotated[
        bool, typer.Option(help="Scenario model: also transformers' own continuous batching")
    ] = True,
    stream_models: Annotated[
        str,
        typer.Option(help="Scenario streaming: MODEL:REQUESTS a round, comma-separated"),
    ] = "echo-100ms:160,smollm2-135m:24",
    concurrency: Annotated[
        int, typer.Option(help="Scenario streaming: clients, each waiting for its answer")
    ] = 32,
    pairs: Annotated[
        int, typer.Option(help="Scenario streaming: ABBA pairs of rounds (plain, stream)")
    ] = 4,
    client: Annotated[
        bool, typer.Option(help="Scenario streaming: also the aiperf client, streaming")
    ] = True,
    embedding_model: Annotated[
        str, typer.Option(help="Scenario embeddings: the encoder")
    ] = "all-minilm-l6-v2",
    texts: Annotated[
        int, typer.Option(help="Scenario embeddings: texts of each batched figure")
    ] = 2000,
    one_at_a_time: Annotated[
        int, typer.Option(help="Scenario embeddings: texts of each one-at-a-time figure")
    ] = 200,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG plot here")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
) -> None:
    """Measure and print figures: see docs/benchmarks.md for each scenario."""
    if scenario not in SCENARIOS:
        raise typer.BadParameter(f"unknown scenario {scenario!r}; one of {', '.join(SCENARIOS)}")
    from batchserve.core.settings import load_settings

    if load_settings().embedded:
        raise typer.BadParameter(
            "benchmarks deploy on servers: set BATCHSERVE_DATABASE_URL, BATCHSERVE_BROKER_URL and "
            "BATCHSERVE_REDIS_URL (e.g. the local ones `make run` uses)",
            param_hint="--scenario",
        )
    if role_log_level is not RoleLogLevel.WARNING and scenario in _OWN_DEPLOYMENT:
        raise typer.BadParameter(
            f"the {scenario} scenario runs its roles at its own log level; --role-log-level "
            f"applies to {', '.join(s for s in SCENARIOS if s not in _OWN_DEPLOYMENT)}",
            param_hint="--role-log-level",
        )
    if scenario == "model":
        _model(model, prompts, max_tokens, mixed_s, vllm, transformers_cb, as_json, log_dir)
        return
    if scenario == "embeddings":
        _embeddings(embedding_model, texts, one_at_a_time, as_json, log_dir)
        return
    if scenario == "streaming":
        from batchserve.bench.streaming import StreamingPlan, parse_workloads

        try:
            workloads = parse_workloads(stream_models, max_tokens)
        except ValueError as error:
            raise typer.BadParameter(str(error), param_hint="--stream-models") from error
        plan = StreamingPlan(
            workloads=workloads,
            concurrency=concurrency,
            pairs=pairs,
            workers=workers,
            client=client,
        )
        _report([_streaming(plan, keep, as_json, log_dir)], None, as_json)
        return
    from batchserve.bench.run import BenchOptions, run_scenarios

    options = BenchOptions(
        workers=workers,
        batch=batch,
        variants=[v.strip() for v in variants.split(",") if v.strip()],
        timer_delay_ms=timer_delay_ms,
        duration_s=duration,
        loads=_floats(loads),
        backlog_s=backlog_s,
        warmup_s=warmup_s,
        http_load=http_load,
        rates=_floats(rates),
        frontdoor_rates=_floats(frontdoor_rates),
        step_s=step_s,
        max_p99_ms=max_p99_ms,
        wide_batch=wide_batch,
        interactive_rps=rate,
        bulk_requests=requests,
        timeout_s=timeout_s,
        seed=seed,
        profile=profile,
        profile_out=profile_out,
        keep=keep,
        api_processes=api_processes,
        role_log_level=role_log_level.value,
        log_root=log_dir,
    )
    names = list(ALL) if scenario == "all" else [scenario]
    documents = run_loop(run_scenarios(names, options))
    _report(documents, plot, as_json)


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """The load generator shares the cores with the service it measures: uvloop makes each
    request it sends and polls cost less of them. Its collector is tuned as the roles' is
    (``tune_gc``: start-up's objects out of every pass), and ``open_loop`` turns it off while
    it sends (docs/frontdoor.md, "The load generator timed its own pauses").

    A Ctrl-C or a SIGTERM stops a bench and removes its deployment (``run_stoppable``)."""
    from batchserve.core.loops import tune_gc
    from batchserve.testing.deployment import run_stoppable

    tune_gc()
    try:
        import uvloop
    except ImportError:
        return run_stoppable(main, "bench")
    return run_stoppable(main, "bench", uvloop.run)


def _report(documents: list[dict[str, Any]], plot: Path | None, as_json: bool) -> None:
    from batchserve.bench.report import RENDERERS
    from batchserve.bench.report import plot as draw

    for doc in documents:
        if plot is not None:
            path = plot if len(documents) == 1 else plot.with_stem(f"{plot.stem}-{doc['scenario']}")
            if draw(doc, path):
                doc["plot"] = str(path)
    if as_json:
        body: Any = documents[0] if len(documents) == 1 else {"scenarios": documents}
        typer.echo(json.dumps(_finite(body), indent=2))
        return
    for doc in documents:
        RENDERERS[doc["scenario"]](doc, console)
        console.print(f"[dim]machine: {doc['machine']}; logs: {doc['logs']}[/dim]")


def _finite(value: Any) -> Any:
    """NaN is not JSON: ``null`` instead."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


def _model(
    name: str,
    prompts: int,
    max_tokens: int,
    mixed_s: float,
    vllm: bool,
    transformers_cb: bool,
    as_json: bool,
    log_root: Path | None,
) -> None:
    from batchserve.bench.model import model_scenario
    from batchserve.core.settings import load_settings
    from batchserve.models.registry import load_registry

    spec = load_registry(load_settings().models).get(name)
    if spec is None:
        raise typer.BadParameter(f"unknown model {name}")
    # With --json the document is stdout's: progress goes to stderr.
    say = Console(stderr=True).print if as_json else console.print
    result = run_loop(
        model_scenario(
            spec,
            prompts=prompts,
            max_tokens=max_tokens,
            mixed_s=mixed_s,
            vllm=vllm,
            transformers_cb=transformers_cb,
            say=say,
            log_root=log_root,
        )
    )
    doc = result.as_dict()
    if as_json:
        typer.echo(json.dumps(_finite(doc), indent=2))
        return
    title = (
        f"{name}: {prompts} chat prompts of {min(doc['prompt_tokens'])}-"
        f"{max(doc['prompt_tokens'])} tokens, {max_tokens} new tokens each, greedy, "
        f"{doc['threads']} thread(s)"
    )
    _print_figures(title, doc, "tokens")
    if doc["mixed"]:
        m = doc["mixed"]
        console.print(
            f"mixed (80% 16 tokens, 20% 256, {m['rate_rps']:.2f} req/s = {m['load']:.0%} of "
            f"capacity, {m['requests']} requests): short p90 {m['short_mixed_p90_s']:.2f} s "
            f"against {m['short_alone_p90_s']:.2f} s alone = {m['short_p90_vs_alone']:.2f}x"
        )


def _embeddings(
    name: str, count: int, one_at_a_time: int, as_json: bool, log_root: Path | None
) -> None:
    from batchserve.bench.embeddings import embeddings_scenario
    from batchserve.core.settings import load_settings
    from batchserve.models.registry import load_registry

    spec = load_registry(load_settings().models).get(name)
    if spec is None or spec.backend != "sentence-embedding":
        raise typer.BadParameter(f"no embedding model {name}", param_hint="--embedding-model")
    say = Console(stderr=True).print if as_json else console.print
    result = run_loop(
        embeddings_scenario(
            spec, count=count, one_at_a_time=one_at_a_time, say=say, log_root=log_root
        )
    )
    doc = result.as_dict()
    if as_json:
        typer.echo(json.dumps(_finite(doc), indent=2))
        return
    _print_figures(
        f"{name}: {doc['threads']} thread(s), {doc['micro_batch']} a pass", doc, "vectors"
    )


def _print_figures(title: str, doc: dict[str, Any], unit: str) -> None:
    """A benchmark's figures (each ``unit`` counted, seconds, a rate) and its ratios."""
    table = Table(title=title)
    for column in ("how", unit, "seconds", f"{unit}/s", ""):
        table.add_column(column, justify="right")
    for figure in doc["figures"]:
        table.add_row(
            figure["name"],
            str(figure[unit]),
            f"{figure['seconds']:.2f}",
            f"{figure[f'{unit}_per_s']:.1f}",
            figure["notes"],
        )
    console.print(table)
    for key, value in doc["ratios"].items():
        if value is not None:
            console.print(f"{key}: {value:.2f}x")


def _streaming(
    plan: StreamingPlan, keep: bool, as_json: bool, log_root: Path | None
) -> dict[str, Any]:
    from batchserve.bench.streaming_run import client_tokenizer, streaming_scenario
    from batchserve.core.settings import load_settings
    from batchserve.models.registry import load_registry

    registry = load_registry(load_settings().models)
    say = Console(stderr=True).print if as_json else console.print
    tokenizer = client_tokenizer(registry, plan) if plan.client else None
    document: dict[str, Any] = run_loop(
        streaming_scenario(plan, registry, tokenizer, keep=keep, say=say, log_root=log_root)
    )
    return document
