"""Regenerate docs/benchmarks.md, its plots and raw figures: `python scripts/benchmarks_docs.py`.

Runs every ``batchserve bench`` scenario (each on a fresh deployment of the servers named by
``BATCHSERVE_DATABASE_URL``, ``_BROKER_URL`` and ``_REDIS_URL``, defaulting to the local ones),
writes the figures to docs/benchmarks.json, the plots to docs/bench-*.png, and the page from
them plus the hand-written findings in scripts/benchmarks_notes.md. With ``--profiles`` it also
records py-spy flame graphs of the processes the findings discuss (docs/profile-*.svg).
About 15 minutes on two cores (20 with ``--profiles``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
from benchmarks_streaming import streaming_md, verdict_rows
from frontdoor_docs import SEEDS_SERVED, at, cpu_table, over, roles_cpu, seeds_served, worst_gap
from md_table import table

from batchserve.bench.frontdoor import GOAL_P50_MS, GOAL_P99_MS, GOAL_RATES

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
LOCAL = {
    "BATCHSERVE_DATABASE_URL": "postgresql+psycopg://postgres@127.0.0.1:5432/batchserve",
    "BATCHSERVE_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//",
    "BATCHSERVE_REDIS_URL": "redis://127.0.0.1:6379/0",
}
# Between runs: the last one's clean-up (a dropped database, deleted queues) settles first.
SETTLE_S = 10.0
# name, bench arguments, plot (or None)
RUNS: list[tuple[str, list[str], str | None]] = [
    (
        "saturation",
        ["--scenario", "saturation", "--variants", "adaptive,timer,nobatch,nostandby"],
        "bench-saturation.png",
    ),
    ("overhead", ["--scenario", "overhead"], None),
    (
        "latency",
        [
            *("--scenario", "overhead", "--variants", "adaptive,timer"),
            *("--loads", "0.1,0.3,0.5,0.7,0.9", "--duration", "10"),
        ],
        "bench-latency.png",
    ),
    ("ingest", ["--scenario", "ingest"], "bench-ingest.png"),
    ("bulk", ["--scenario", "bulk"], None),
    ("mixed", ["--scenario", "mixed"], None),
    (
        "streaming",
        [
            *("--scenario", "streaming", "--stream-models", "echo-100ms:160,smollm2-135m:24"),
            *("--pairs", "4", "--max-tokens", "32"),
        ],
        None,
    ),
    (
        "frontdoor",
        [
            *("--scenario", "frontdoor", "--workers", "1", "--batch", "32", "--duration", "10"),
            *("--frontdoor-rates", "30,100,200,300"),
        ],
        None,
    ),
    (
        "seeds",
        [
            *("--scenario", "frontdoor", "--workers", "4", "--batch", "32", "--duration", "10"),
            *("--frontdoor-rates", "1000"),
        ],
        None,
    ),
]
# The front door's paths, as the issue that set its goals names them.
FRONTDOOR_PATHS = {
    "baseline": "in-process asyncio batcher behind FastAPI (nothing durable)",
    "sync": "batchserve, sync `/v1/chat/completions`",
    "longpoll": "batchserve, submit + long-poll",
}
PROFILES: list[tuple[str, list[str]]] = [
    ("worker", ["--scenario", "saturation", "--variants", "adaptive", "--http-load", "0"]),
    ("batcher", ["--scenario", "saturation", "--variants", "adaptive", "--http-load", "0"]),
    ("api", ["--scenario", "ingest", "--rates", "800", "--step-s", "10"]),
    ("maintenance", ["--scenario", "bulk"]),
]


def bench(args: list[str]) -> dict[str, Any]:
    env = {**LOCAL, **os.environ}
    command = [sys.executable, "-m", "batchserve.cli", "bench", *args, "--json"]
    print("$ batchserve bench " + " ".join(args), file=sys.stderr, flush=True)
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"bench failed:\n{done.stderr[-4000:]}")
    document: dict[str, Any] = orjson.loads(done.stdout)
    return document


def recorded_runs(script: str, runs: list[dict[str, Any]]) -> str:
    """A measuring script's JSON document: the command that ran it (``python scripts/NAME``
    and its arguments), the machine, and its runs."""
    command = shlex.join(["python", f"scripts/{script}", *sys.argv[1:]])
    return json.dumps({"command": command, "machine": machine(), "runs": runs}, indent=1)


def machine() -> dict[str, Any]:
    model = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    memory_kb = next(
        int(line.split()[1])
        for line in Path("/proc/meminfo").read_text().splitlines()
        if line.startswith("MemTotal")
    )
    return {
        "cores": os.cpu_count(),
        "cpu": model,
        "memory_gb": round(memory_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "load_avg": [round(x, 2) for x in os.getloadavg()],
        "when": time.strftime("%Y-%m-%d %H:%M %Z"),
    }


def load_note(doc: dict[str, Any]) -> str:
    before, after = doc["machine"]["before"], doc["machine"]["after"]
    return (
        f"Load average (1 min) {before['load_avg_1m']:.1f} before, {after['load_avg_1m']:.1f} "
        f"after; {doc['wall_s']:.0f} s."
    )


def saturation_md(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["variant"],
            r["max_batch_size"],
            f"{r['ideal_rps']:.0f}",
            r["backlog"],
            f"{r['drain_rps']:.1f}",
            f"**{r['ratio_to_ideal']:.3f}**",
            f"{r['announced_rps']:.1f}",
            f"{r['mean_batch']:.1f}",
            f"{r['idle_gap_p50_ms']:.1f} / {r['idle_gap_p99_ms']:.1f}",
            f"{r['handover_p50_ms']:.1f}",
            f"{r['lease_p50_ms']:.1f}",
            _cpu(r["cpu_ms_per_request"]),
        ]
        for r in doc["results"]
    ]
    text = table(
        ["variant", "B", "ideal/s", "backlog", "drain/s", "ratio", "results announced/s",
         "mean batch", "idle gap p50 / p99 ms", "hand-over p50 ms", "lease p50 ms",
         "CPU ms a request"],
        rows,
    )  # fmt: skip
    http = doc.get("http")
    if http:
        text += (
            f"\n\nOpen-loop HTTP, {http['variant']}: offered {http['offered_rps']:.0f}/s "
            f"(Poisson), served **{http['served_rps']:.1f}/s = {http['ratio_to_ideal']:.3f}** "
            f"of the ideal; submit p50 {http['submit']['p50_ms']:.1f} ms, p99 "
            f"{http['submit']['p99_ms']:.1f} ms; refused {http['refused']}, errors "
            f"{http['errors']}."
        )
    return text


def _cpu(cpu: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in cpu.items() if v >= 0.01)


def overhead_md(doc: dict[str, Any]) -> str:
    rows = [
        [
            r["variant"],
            f"{r['load']:.0%}",
            f"{r['offered_rps']:.0f}",
            r.get("succeeded", 0),
            r["refused"],
            f"{r.get('live_p50_ms', 0):.1f} / {r.get('live_p99_ms', 0):.1f}",
            f"{r.get('sim_p50_ms', 0):.1f} / {r.get('sim_p99_ms', 0):.1f}",
            f"**{r.get('overhead_p50_ms', 0):.1f} / {r.get('overhead_p99_ms', 0):.1f}**",
            f"{r.get('mean_batch', 0):.1f} / {r.get('sim_mean_batch', 0):.1f}",
            f"{r['submit']['p50_ms']:.1f}",
            _cpu(r["cpu_ms_per_request"]),
        ]
        for r in doc["results"]
    ]
    text = table(
        ["variant", "load", "offered/s", "answered", "refused", "live p50 / p99 ms",
         "simulated p50 / p99 ms", "live - simulated p50 / p99 ms", "mean batch live / sim",
         "submit p50 ms", "CPU ms a request"],
        rows,
    )  # fmt: skip
    for r in doc["results"]:
        if "breakdown" not in r:
            continue
        stages = [
            [name, *(f"{r['breakdown'][name][k]:.1f}" for k in ("p50_ms", "p99_ms", "mean_ms"))]
            for name in doc["stages"]
        ]
        sim = r["sim_batch_wait"]
        stages.append(
            ["batch_wait, simulated", *(f"{sim[k]:.1f}" for k in ("p50_ms", "p99_ms", "mean_ms"))]
        )
        text += f"\n\nWhere the time goes, {r['variant']} at {r['load']:.0%} (ms):\n\n"
        text += table(["stage", "p50", "p99", "mean"], stages)
    return text


def ingest_md(doc: dict[str, Any]) -> str:
    rows = [
        [
            f"{s['rate']:.0f}",
            f"{s['sent_rps']:.0f}",
            s["accepted"],
            s["refused"],
            s["errors"],
            f"{s['p50_ms']:.1f}",
            f"**{s['p99_ms']:.1f}**",
            f"{s['loadgen_cpu']:.0%}",
            _cpu(s["cpu_ms_per_request"]),
            _overflows(s),
            "yes" if s["ok"] else "no",
        ]
        for s in doc["steps"]
    ]
    text = table(
        ["offered/s", "sent/s", "accepted", "refused", "errors", "p50 ms", "p99 ms",
         "load generator CPU", "CPU ms a request", "listen overflows",
         f"p99 ≤ {doc['max_p99_ms']:g} ms"],
        rows,
    )  # fmt: skip
    return text + f"\n\nHighest rate within the bound: **{doc['max_rate_ok']:.0f} submits/s**."


def frontdoor_md(doc: dict[str, Any]) -> str:
    """Each offered rate's p50 / p99 ms (served/s) by path, their distance from the baseline,
    and where the CPU went at 100/s."""
    results = {(r["offered_rps"], r["path"]): r for r in doc["results"]}
    rates = sorted({r["offered_rps"] for r in doc["results"]})
    rows = []
    for rate in rates:
        cells = []
        for path in FRONTDOOR_PATHS:
            r = results[(rate, path)]
            cells.append(f"{r['p50_ms']:,.0f} / {r['p99_ms']:,.0f} ({r['served_rps']:.0f})")
        rows.append([f"{rate:,.0f}", *cells])
    text = "p50 / p99 ms (served/s), every caller checking that the answer is its own:\n\n"
    text += table(["offered/s", *FRONTDOOR_PATHS.values()], rows)
    gaps = over(doc)
    rows = [
        [
            f"{rate:,.0f}",
            path,
            f"{gaps[(path, rate)][0]:+.1f}",
            f"{gaps[(path, rate)][1]:+.1f}",
            _overflows(results[(rate, path)]),
        ]
        for rate in rates
        for path in ("sync", "longpoll")
    ]
    text += "\n\nOver the baseline in the same run (ms), and the connections the kernel "
    text += "turned away meanwhile because the API's accept queue was full:\n\n"
    text += table(["offered/s", "path", "p50", "p99", "listen overflows"], rows)
    unanswered = sum(r["sent"] - r["answered"] for r in doc["results"])
    wrong = sum(r["wrong"] for r in doc["results"])
    text += f"\n\nUnanswered callers {unanswered}, wrong answers {wrong}. "
    if any(r["offered_rps"] == 100.0 for r in doc["results"]):
        text += "CPU ms a request at 100/s, by role and by server:\n\n" + cpu_table(doc)
    return text


def seeds_md(doc: dict[str, Any]) -> str:
    rows = [
        [
            FRONTDOOR_PATHS[r["path"]],
            f"{r['answered']:,} of {r['sent']:,}",
            r["refused"],
            f"{r['p50_ms']:,.1f} / {r['p99_ms']:,.1f}",
            f"{r['served_rps']:.1f}",
            _overflows(r),
            r.get("tcp", {}).get("resets", ""),
        ]
        for r in doc["results"]
    ]
    header = ["path", "answered", "refused", "p50 / p99 ms", "served/s", "listen overflows"]
    header += ["connections reset"]
    return table(header, rows)


def frontdoor_verdicts(front: dict[str, Any], seeds: dict[str, Any] | None) -> list[list[str]]:
    """The front door's goals: latency over the in-process baseline, served through HTTP, the
    seeds' deployment answered, and the roles' CPU a request (ingest is its own row)."""
    p50, p99 = worst_gap(front)
    served = front["goals"]["served_vs_ideal"]
    ideal = 10.0 * front["workers"] * front["max_batch_size"]
    roles = {p: roles_cpu(front, p) for p in ("longpoll", "sync")}
    servers = {p: sum(at(front, 100.0, p)["server_cpu_ms_per_request"].values()) for p in roles}
    rows = [
        [
            "front door over an in-process batcher at "
            + " and ".join(f"{r:g}" for r in GOAL_RATES)
            + "/s, worst of long-poll and sync",
            f"p50 ≤ +{GOAL_P50_MS:g} ms, p99 ≤ +{GOAL_P99_MS:g} ms",
            f"p50 {p50:+.1f} ms, p99 {p99:+.1f} ms",
            f"p50 {_met(p50 <= GOAL_P50_MS)}, p99 {_met(p99 <= GOAL_P99_MS)}",
        ],
        [
            f"served through HTTP, W={front['workers']}, B={front['max_batch_size']}, "
            "long-poll / sync",
            f"≥ 0.90 of {ideal:.0f}/s",
            f"{served['longpoll']:.3f} / {served['sync']:.3f} (baseline {served['baseline']:.3f})",
            _met(min(served["longpoll"], served["sync"]) >= 0.90),
        ],
        [
            "CPU of all roles a request at 100/s, long-poll / sync",
            "≤ 1.0 ms (Postgres + RabbitMQ + Redis beside)",
            f"{roles['longpoll']:.2f} / {roles['sync']:.2f} ms (servers {servers['longpoll']:.2f}"
            f" / {servers['sync']:.2f})",
            _met(max(roles.values()) <= 1.0),
        ],
    ]
    if seeds is not None:
        paths = [r for r in seeds["results"] if r["path"] != "baseline"]
        rate = paths[0]["offered_rps"]
        rows.append(
            [
                f"the seeds' deployment: {seeds['workers']} slots x {seeds['max_batch_size']}, "
                f"{rate:,.0f}/s offered",
                f"served (≥ {SEEDS_SERVED:.2f} of the offered rate), nothing refused, "
                "every caller answered, p99 reported",
                "; ".join(
                    f"{r['path']}: {r['served_rps']:,.0f}/s served, {r['answered']:,} of "
                    f"{r['sent']:,} answered, {r['refused']} refused, "
                    f"p99 {r['p99_ms'] / 1000:.1f} s"
                    for r in paths
                ),
                _met(all(seeds_served(r) for r in paths)),
            ]
        )
    return rows


def _overflows(row: dict[str, Any]) -> str:
    """Connections the kernel dropped at a full accept queue during the row's span (figures
    recorded before the benchmarks counted them: blank)."""
    return f"{row['tcp']['listen_overflows']:,}" if "tcp" in row else ""


def flat_md(doc: dict[str, Any]) -> str:
    skip = {"scenario", "machine", "wall_s", "logs", "plot"}
    rows = [
        [key, f"{value:,.2f}" if isinstance(value, float) else value]
        for key, value in doc.items()
        if key not in skip
    ]
    return table(["figure", "value"], rows)


def verdicts(docs: dict[str, dict[str, Any]]) -> str:
    adaptive = next(r for r in docs["saturation"]["results"] if r["variant"] == "adaptive")
    over = next(
        r for r in docs["overhead"]["results"] if r["variant"] == "adaptive" and r["load"] == 0.3
    )
    ingest, bulk = docs["ingest"], docs["bulk"]
    rows = [
        [
            "saturation drain, W=2, B=16",
            "≥ 0.97 of 320/s",
            f"{adaptive['ratio_to_ideal']:.3f} ({adaptive['drain_rps']:.0f}/s)",
            _met(adaptive["ratio_to_ideal"] >= 0.97),
        ],
        [
            "overhead against the simulator at 30 % load",
            "p50 ≤ 5 ms, p99 ≤ 25 ms",
            f"p50 {over['overhead_p50_ms']:.1f} ms, p99 {over['overhead_p99_ms']:.1f} ms",
            _met(over["overhead_p50_ms"] <= 5 and over["overhead_p99_ms"] <= 25),
        ],
        [
            "single submits with p99 ≤ 50 ms",
            "≥ 1,000/s",
            f"{ingest['max_rate_ok']:.0f}/s",
            _met(ingest["max_rate_ok"] >= 1000),
        ],
        [
            "bulk: requests persisted per second",
            "≥ 20,000/s",
            f"{bulk['persist_rps']:,.0f}/s while chunking; {bulk['ingest_rps']:,.0f}/s "
            "created → in_progress",
            _met(bulk["persist_rps"] >= 20_000) + _bulk_caveat(bulk),
        ],
    ]
    if "streaming" in docs:
        rows += verdict_rows(docs["streaming"])
    if "frontdoor" in docs:
        rows += frontdoor_verdicts(docs["frontdoor"], docs.get("seeds"))
    return table(["target", "asked", "measured", ""], rows)


def _met(ok: bool) -> str:
    return "met" if ok else "**missed**"


def _bulk_caveat(bulk: dict[str, Any]) -> str:
    """The whole job, validation included, is judged too where it falls short."""
    if bulk["persist_rps"] < 20_000 or bulk["ingest_rps"] >= 20_000:
        return ""
    return " while persisting; **missed** for the whole job (validation included)"


SECTIONS = [
    ("saturation", "Saturation: draining a backlog", saturation_md),
    ("overhead", "Overhead: live against the simulator at 30 % load", overhead_md),
    ("latency", "Latency against offered load", overhead_md),
    ("ingest", "Ingest: single submits", ingest_md),
    ("bulk", "Bulk: persisting a JSONL job", flat_md),
    ("mixed", "Mixed: interactive latency beside a bulk job", flat_md),
    (
        "streaming",
        "Streaming: the same requests plain and streamed, and an outside client",
        streaming_md,
    ),
    ("frontdoor", "Front door: batchserve against an in-process batcher", frontdoor_md),
    ("seeds", "Front door: the seeds' deployment, 1,000 requests/s offered", seeds_md),
]


def host_note(host: dict[str, Any]) -> str:
    return (
        f"Run apart from the rest of the page: {host['cores']} cores ({host['cpu']}), "
        f"{host['when']} (load average {host['load_avg'][0]:.1f} when it began)."
    )


def render(docs: dict[str, dict[str, Any]], host: dict[str, Any], commands: dict[str, str]) -> str:
    parts = [
        "# Benchmarks\n",
        "Generated by `python scripts/benchmarks_docs.py` (raw figures: "
        "[benchmarks.json](benchmarks.json)); the findings at the end are written by hand in "
        "`scripts/benchmarks_notes.md`. Every scenario starts its own deployment (API, "
        "maintenance, and per variant a batcher and a worker) on the local Postgres, RabbitMQ "
        'and Redis, with the fixed 100 ms model (`backend = "fixed"`), W = 2 worker slots, '
        "B = 16 (where a command names other W and B, those), and the load generator in the "
        "same machine.\n",
        f"**Machine**: {host['cores']} cores ({host['cpu']}), {host['memory_gb']} GB, Python "
        f"{host['python']}, {host['when']}. The servers and the load generator share the two "
        "cores, and so did other engineers' test runs: each section gives the load average "
        f"around its run (it was {host['load_avg'][0]:.1f} / {host['load_avg'][1]:.1f} / "
        f"{host['load_avg'][2]:.1f} when the page was generated). Latencies move with that "
        "load; CPU per request does much less.\n",
        "## Targets\n",
        verdicts(docs) + "\n",
    ]
    for name, title, render_section in SECTIONS:
        doc = docs.get(name)
        if doc is None:  # figures saved before the scenario existed
            continue
        parts.append(f"## {title}\n")
        parts.append(f"`{commands[name]}`\n")
        if doc.get("plot"):
            parts.append(f"![{title}]({Path(doc['plot']).name})\n")
        if "host" in doc:  # rerun with --only
            parts.append(host_note(doc["host"]) + "\n")
        parts.append(render_section(doc) + "\n")
        parts.append(load_note(doc) + "\n")
    parts.append((Path(__file__).with_name("benchmarks_notes.md")).read_text())
    return "\n".join(parts)


def _commands() -> dict[str, str]:
    return {
        name: "batchserve bench " + " ".join(args + (["--plot", f"docs/{plot}"] if plot else []))
        for name, args, plot in RUNS
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", action="store_true", help="also record flame graphs")
    parser.add_argument(
        "--render-only", action="store_true", help="rewrite the page from docs/benchmarks.json"
    )
    parser.add_argument(
        "--only", default="", help="rerun these runs (comma-separated), keep the others' figures"
    )
    options = parser.parse_args()
    if options.render_only:
        saved = orjson.loads((DOCS / "benchmarks.json").read_bytes())
        host = saved.pop("machine")
        (DOCS / "benchmarks.md").write_text(render(saved, host, _commands()))
        return
    host = machine()
    docs: dict[str, dict[str, Any]] = {}
    only = {name for name in options.only.split(",") if name}
    if only:
        docs = orjson.loads((DOCS / "benchmarks.json").read_bytes())
        host = docs.pop("machine")
    for name, args, plot in RUNS:
        if only and name not in only:
            continue
        extra = ["--plot", str(DOCS / plot)] if plot else []
        docs[name] = bench(args + extra)
        if only:  # the page's machine line is the other runs'
            docs[name]["host"] = machine()
        time.sleep(SETTLE_S)
    commands = _commands()
    if options.profiles:
        for role, args in PROFILES:
            out = DOCS / f"profile-{role}.svg"
            bench([*args, "--profile", role, "--profile-out", str(out)])
    (DOCS / "benchmarks.json").write_bytes(
        orjson.dumps({"machine": host, **docs}, option=orjson.OPT_INDENT_2)
    )
    (DOCS / "benchmarks.md").write_text(render(docs, host, commands))


if __name__ == "__main__":
    main()
