"""``batchserve status``: the deployment on one terminal screen, from the API's dashboard data."""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

import httpx
import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table

console = Console(width=140)


def status(
    url: Annotated[
        str | None,
        typer.Option(
            "--ops-url",
            envvar="BATCHSERVE_OPS_URL",
            help="The API's operator listener (default: the last `serve`'s)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
    watch: Annotated[float, typer.Option(help="Redraw every N seconds; 0 = once")] = 0.0,
) -> None:
    """Models, queue depths, slots, recent batch sizes, latency percentiles and the worker count
    the capacity planner advises for the observed arrival rate."""
    from batchserve.cli.served import ops_url

    base = ops_url(url)
    while True:
        report = status_report(fetch_snapshot(base))
        if as_json:
            typer.echo(json.dumps(report, indent=2))
        else:
            if watch > 0:
                console.clear()
            print_report(report)
        if watch <= 0:
            return
        time.sleep(watch)


def fetch_snapshot(url: str) -> dict[str, Any]:
    try:
        response = httpx.get(f"{url.rstrip('/')}/dashboard/data", timeout=10)
    except httpx.HTTPError as error:
        typer.echo(f"batchserve: cannot reach {url}: {error}", err=True)
        raise typer.Exit(1) from error
    if response.status_code != 200:
        typer.echo(f"batchserve: {url} answered {response.status_code}: {response.text}", err=True)
        raise typer.Exit(1)
    snapshot: dict[str, Any] = response.json()
    return snapshot


def status_report(snapshot: dict[str, Any]) -> dict[str, Any]:
    """The figures ``status`` prints, keyed as its columns are named."""
    models = []
    for m in snapshot["models"]:
        lanes = {lane["lane"]: lane for lane in m["gauges"]["lanes"]}
        ages = [lane["oldest_age_s"] for lane in lanes.values() if lane["oldest_age_s"] is not None]
        capacity = m["capacity"]
        models.append(
            {
                "model": m["name"],
                "queued": sum(lane["depth"] for lane in lanes.values()),
                "queued_interactive": lanes.get("interactive", {}).get("depth", 0),
                "queued_bulk": lanes.get("bulk", {}).get("depth", 0),
                "oldest_s": max(ages) if ages else None,
                "slots_busy": m["gauges"]["slots_busy"],
                "slots_live": m["gauges"]["slots_live"],
                "arrival_rps": m["arrival_rps"],
                "done_rps": m["throughput_rps"],
                "batches": m["batches"],
                "mean_batch": m["mean_batch_size"],
                "max_batch": m["max_batch_size"],
                "batch_sizes": {int(k): v for k, v in m["batch_sizes"].items()},
                "model_ms": m["mean_model_ms"],
                "p50_ms": m["latency"]["p50_ms"],
                "p95_ms": m["latency"]["p95_ms"],
                "p99_ms": m["latency"]["p99_ms"],
                "recommended_workers": capacity["recommended_workers"] if capacity else None,
                "min_workers": capacity["min_workers"] if capacity else None,
                "per_worker_rps": capacity["per_worker_rps"] if capacity else None,
                "kind": m.get("kind", "batch"),
                # What the batcher believes a batch (an engine model: a sequence) takes now.
                "estimate": m.get("estimate"),
            }
        )
    return {
        "at": snapshot["at"],
        "window_s": snapshot["window_s"],
        "models": models,
        "finished": snapshot["finished"],
        "recent_failures": [
            {k: f[k] for k in ("kind", "id", "model", "state", "code", "message", "at")}
            for f in snapshot["recent_failures"][:5]
        ],
    }


def _num(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _sizes(sizes: dict[int, int]) -> str:
    """``32x40 17x2 1x3``: the most frequent batch sizes first."""
    top = sorted(sizes.items(), key=lambda kv: (-kv[1], -kv[0]))[:6]
    return " ".join(f"{size}x{count}" for size, count in top) or "-"


def print_report(report: dict[str, Any]) -> None:
    at = time.strftime("%H:%M:%S", time.localtime(report["at"]))
    window_min = report["window_s"] / 60
    console.print(
        f"[bold]batchserve[/bold] at {at}: batches and failures over the last {window_min:g} min,"
        " rates and end-to-end latency percentiles over the last minute"
    )
    table = Table(show_edge=False, pad_edge=False)
    for column in (
        "model",
        "queued",
        "oldest_s",
        "slots",
        "arrival_rps",
        "done_rps",
        "batches",
        "mean_batch",
        "p50_ms",
        "p95_ms",
        "p99_ms",
        "recommended_workers",
    ):
        table.add_column(column, justify="left" if column == "model" else "right")
    for m in report["models"]:
        table.add_row(
            m["model"],
            f"{m['queued']:,}",
            _num(m["oldest_s"], 1),
            f"{m['slots_busy']}/{_num(m['slots_live'])}",
            _num(m["arrival_rps"], 1),
            _num(m["done_rps"], 1),
            f"{m['batches']:,}",
            f"{_num(m['mean_batch'], 1)}/{m['max_batch']}",
            _num(m["p50_ms"]),
            _num(m["p95_ms"]),
            _num(m["p99_ms"]),
            _num(m["recommended_workers"]),
        )
    # As wide as the table needs: a long model name must not cut a column's header short.
    needed = Measurement.get(console, console.options.update(width=10_000), table).maximum
    wide = Console(width=max(console.width, needed), file=console.file)
    wide.print(table)
    for m in report["models"]:
        if m["batches"]:
            console.print(f"batch sizes {m['model']}: {_sizes(m['batch_sizes'])}")
        estimate = m.get("estimate")
        if estimate:
            console.print(
                f"estimate {m['model']}: a typical {estimate['unit']} {estimate['typical_s']:.3f} s"
                f" ({estimate['source']}, {estimate['observations']} observed)"
            )
    finished = ", ".join(f"{state} {n:,}" for state, n in sorted(report["finished"].items()))
    console.print(f"finished: {finished or 'none'}")
    for f in report["recent_failures"]:
        console.print(
            f"[red]{f['kind']} {f['state']}[/red] {f['id']} {f['model']} "
            f"{f['code'] or ''} {f['message'] or ''}"
        )
