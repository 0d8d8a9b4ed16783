"""Tables and plots of ``bench`` results (the JSON documents the scenarios return)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=title)
    for column in columns:
        table.add_column(column, justify="right")
    return table


def _ms(value: float) -> str:
    return f"{value:.1f}"


def render_saturation(doc: dict[str, Any], console: Console) -> None:
    table = _table(
        f"saturation: backlog of {doc['backlog_s']:g} s of capacity, {doc['workers']} slot(s)",
        ["variant", "B", "ideal/s", "drain/s", "ratio", "announced/s", "mean batch",
         "idle gap p50 ms", "p99 ms"],
    )  # fmt: skip
    for r in doc["results"]:
        table.add_row(
            r["variant"],
            str(r["max_batch_size"]),
            f"{r['ideal_rps']:.0f}",
            f"{r['drain_rps']:.1f}",
            f"{r['ratio_to_ideal']:.3f}",
            f"{r['announced_rps']:.1f}",
            f"{r['mean_batch']:.1f}",
            _ms(r["idle_gap_p50_ms"]),
            _ms(r["idle_gap_p99_ms"]),
        )
    console.print(table)
    http = doc.get("http")
    if http:
        console.print(
            f"open-loop HTTP ({http['variant']}): offered {http['offered_rps']:.0f}/s, "
            f"served {http['served_rps']:.1f}/s = {http['ratio_to_ideal']:.3f} of the ideal; "
            f"submit p50 {http['submit']['p50_ms']:.1f} ms, p99 {http['submit']['p99_ms']:.1f} ms; "
            f"refused {http['refused']}, errors {http['errors']}"
        )


def render_overhead(doc: dict[str, Any], console: Console) -> None:
    table = _table(
        f"overhead: live against simulated, {doc['workers']} slot(s), "
        f"{doc['duration_s']:g} s traces",
        ["variant", "load", "offered/s", "ok", "refused", "live p50", "p99", "sim p50", "p99",
         "overhead p50", "p99", "batch", "sim batch"],
    )  # fmt: skip
    for r in doc["results"]:
        table.add_row(
            r["variant"],
            f"{r['load']:.0%}",
            f"{r['offered_rps']:.0f}",
            str(r.get("succeeded", 0)),
            str(r["refused"]),
            *(_ms(r.get(k, float("nan"))) for k in ("live_p50_ms", "live_p99_ms")),
            *(_ms(r.get(k, float("nan"))) for k in ("sim_p50_ms", "sim_p99_ms")),
            *(_ms(r.get(k, float("nan"))) for k in ("overhead_p50_ms", "overhead_p99_ms")),
            f"{r.get('mean_batch', 0):.1f}",
            f"{r.get('sim_mean_batch', 0):.1f}",
        )
    console.print(table)
    for r in doc["results"]:
        breakdown = r.get("breakdown")
        if not breakdown:
            continue
        stages = _table(
            f"where the time goes: {r['variant']} at {r['load']:.0%} (ms)",
            ["stage", "p50", "p99", "mean"],
        )
        for name in doc["stages"]:
            s = breakdown[name]
            stages.add_row(name, _ms(s["p50_ms"]), _ms(s["p99_ms"]), _ms(s["mean_ms"]))
        sim = r["sim_batch_wait"]
        stages.add_row(
            "(simulated batch_wait)", _ms(sim["p50_ms"]), _ms(sim["p99_ms"]), _ms(sim["mean_ms"])
        )
        console.print(stages)


def render_ingest(doc: dict[str, Any], console: Console) -> None:
    table = _table(
        f"ingest: single submits, open loop ({doc['variant']}, batch {doc['max_batch_size']})",
        ["offered/s", "sent/s", "accepted", "refused", "errors", "p50 ms", "p99 ms", "max ms",
         "loadgen cpu", "cores busy", "listen overflows", f"p99 <= {doc['max_p99_ms']:g} ms"],
    )  # fmt: skip
    for s in doc["steps"]:
        table.add_row(
            f"{s['rate']:.0f}",
            f"{s['sent_rps']:.0f}",
            str(s["accepted"]),
            str(s["refused"]),
            str(s["errors"]),
            _ms(s["p50_ms"]),
            _ms(s["p99_ms"]),
            _ms(s["max_ms"]),
            f"{s['loadgen_cpu']:.0%}",
            f"{s['cores_busy']:.0%}" if "cores_busy" in s else "",
            str(s.get("tcp", {}).get("listen_overflows", "")),
            "yes" if s["ok"] else "no",
        )
    console.print(table)
    console.print(f"highest rate with p99 within bound: {doc['max_rate_ok']:.0f} requests/s")


def render_flat(doc: dict[str, Any], console: Console) -> None:
    table = _table(doc["scenario"], ["figure", "value"])
    for key, value in doc.items():
        if key != "scenario":
            table.add_row(key, f"{value:,.1f}" if isinstance(value, float) else str(value))
    console.print(table)


def render_streaming(doc: dict[str, Any], console: Console) -> None:
    order = " ".join(doc["models"][0]["order"]) if doc["models"] else ""
    table = _table(
        "streaming: the same chat requests answered whole and streamed, closed loop of "
        f"{doc['concurrency']}, rounds {order}",
        ["model", "variant", "requests", "errors", "seconds", "requests/s", "tokens/s",
         "CPU ms a request"],
    )  # fmt: skip
    for m in doc["models"]:
        for variant in ("plain", "stream"):
            v = m[variant]
            table.add_row(
                m["model"],
                variant,
                str(v["requests"]),
                str(v["errors"]),
                f"{v['seconds']:.1f}",
                f"{v['rps']:.1f}",
                f"{v['tokens_per_s']:.1f}",
                ", ".join(f"{k} {ms:.2f}" for k, ms in v["cpu_ms"].items()),
            )
    console.print(table)
    for m in doc["models"]:
        console.print(
            f"{m['model']}: streamed / plain = {m['rps_ratio']:.3f} in requests/s, "
            f"{m['tokens_ratio']:.3f} in tokens/s; median of the pairs of rounds "
            f"{m['median_pair_rps_ratio']:.3f}; CPU a request, plain / streamed "
            f"{m['cpu_ratio']:.3f}"
        )
        c = m.get("client")
        if c:
            console.print(
                f"  {c['client']} (streaming, {c['requests']} requests, {c['errors']} errors): "
                f"TTFT p50 {c['ttft_p50_ms']:.1f} ms, p99 {c['ttft_p99_ms']:.1f} ms; "
                f"ITL p50 {c['itl_p50_ms']:.2f} ms, p99 {c['itl_p99_ms']:.2f} ms; "
                f"{c['request_throughput']:.1f} requests/s, "
                f"{c['output_token_throughput']:.1f} output tokens/s"
            )


def render_frontdoor(doc: dict[str, Any], console: Console) -> None:
    table = _table(
        f"frontdoor: {doc['workers']} slot(s) x B={doc['max_batch_size']}, "
        f"{doc['batch_ms']:g} ms batches (ideal {doc['ideal_rps']:.0f}/s), "
        f"{doc['duration_s']:g} s a path and rate",
        ["offered/s", "path", "answered", "wrong", "refused", "p50 ms", "p99 ms", "served/s",
         "CPU ms/request", "pg/mq/redis ms/request", "listen overflows", "p50 over baseline",
         "p99 over baseline"],
    )  # fmt: skip
    over = {(g["path"], g["offered_rps"]): g for g in doc["goals"]["latency"]}
    for r in doc["results"]:
        goal = over.get((r["path"], r["offered_rps"]))
        table.add_row(
            f"{r['offered_rps']:g}",
            r["path"],
            str(r["answered"]),
            str(r["wrong"]),
            str(r["refused"]),
            _ms(r["p50_ms"]),
            _ms(r["p99_ms"]),
            f"{r['served_rps']:.1f}",
            f"{sum(r['cpu_ms_per_request'].values()):.2f}",
            "/".join(f"{v:.2f}" for v in r.get("server_cpu_ms_per_request", {}).values()),
            str(r.get("tcp", {}).get("listen_overflows", "")),
            "" if goal is None else f"{goal['p50_over_baseline_ms']:+.1f}",
            "" if goal is None else f"{goal['p99_over_baseline_ms']:+.1f}",
        )
    console.print(table)
    served = ", ".join(f"{k} {v:.3f}" for k, v in doc["goals"]["served_vs_ideal"].items())
    console.print(f"best served/s against the ideal: {served}")
    missed = [
        f"{r['path']} at {r['offered_rps']:g}/s {r['missed']['count']} of {r['missed']['of']}"
        for r in doc["results"]
        if r.get("missed")
    ]
    if missed:
        console.print(
            "came before the batch ahead of theirs started, with room, and waited for the next: "
            + ", ".join(missed)
        )
    after = [
        f"{r['path']} at {r['offered_rps']:g}/s {r['after_model_ms']['p50_ms']:.1f}"
        for r in doc["results"]
        if r.get("after_model_ms")
    ]
    if after:
        console.print("answered after the batch's model ended, p50 ms: " + ", ".join(after))


RENDERERS: dict[str, Callable[[dict[str, Any], Console], None]] = {
    "saturation": render_saturation,
    "overhead": render_overhead,
    "ingest": render_ingest,
    "bulk": render_flat,
    "mixed": render_flat,
    "streaming": render_streaming,
    "frontdoor": render_frontdoor,
}


def plot(doc: dict[str, Any], path: Path) -> bool:
    """Write the scenario's plot; False when it has none."""
    draw = {"saturation": _plot_saturation, "overhead": _plot_overhead, "ingest": _plot_ingest}
    if doc["scenario"] not in draw:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    draw[doc["scenario"]](doc, ax)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return True


def _plot_saturation(doc: dict[str, Any], ax: Any) -> None:
    for r in doc["results"]:
        points = _rebin(r["timeline"], window_s=2.0)
        line = ax.plot([p[0] for p in points], [p[1] for p in points], label=r["variant"])
        ax.axhline(r["ideal_rps"], color=line[0].get_color(), linestyle=":", linewidth=1)
    ax.set_xlabel("seconds since the first batch ended")
    ax.set_ylabel("requests finished per second (dotted: 10·W·B)")
    ax.set_title(f"draining a backlog, {doc['workers']} slot(s)")


def _rebin(points: list[list[float]], window_s: float) -> list[list[float]]:
    """Average rates over ``window_s``: single batch ends make short buckets jagged."""
    if len(points) < 2:
        return points
    per = max(1, round(window_s / (points[1][0] - points[0][0])))
    return [
        [points[i][0], sum(p[1] for p in points[i : i + per]) / len(points[i : i + per])]
        for i in range(0, len(points), per)
    ]


def _plot_overhead(doc: dict[str, Any], ax: Any) -> None:
    for variant in dict.fromkeys(r["variant"] for r in doc["results"]):
        rows = [r for r in doc["results"] if r["variant"] == variant]
        rows.sort(key=lambda r: r["load"])
        loads = [r["load"] * 100 for r in rows]
        for key, style in (("p50", "o-"), ("p99", "s-")):
            live_ms = [r.get(f"live_{key}_ms") for r in rows]
            sim_ms = [r.get(f"sim_{key}_ms") for r in rows]
            live = ax.plot(loads, live_ms, style, label=f"{variant} live {key}")
            color = live[0].get_color()
            dashed = style.replace("-", "--")
            ax.plot(loads, sim_ms, dashed, color=color, alpha=0.6, label=f"{variant} sim {key}")
    ax.set_yscale("log")
    ax.set_xlabel("offered load (% of the adaptive variant's 10·W·B)")
    ax.set_ylabel("latency, send to answer (ms)")
    ax.set_title(f"latency against offered load, {doc['workers']} slot(s)")


def _plot_ingest(doc: dict[str, Any], ax: Any) -> None:
    steps = doc["steps"]
    rates = [s["rate"] for s in steps]
    ax.plot(rates, [s["p50_ms"] for s in steps], "o-", label="p50")
    ax.plot(rates, [s["p99_ms"] for s in steps], "s-", label="p99")
    ax.axhline(doc["max_p99_ms"], color="grey", linestyle=":", label="p99 bound")
    ax.set_yscale("log")
    ax.set_xlabel("offered single submits per second")
    ax.set_ylabel("submit latency (ms)")
    ax.set_title("POST /v1/requests latency against offered rate")
