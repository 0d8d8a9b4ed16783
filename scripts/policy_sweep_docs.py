"""Regenerate docs/policy-sweep.md and its plots: `python scripts/policy_sweep_docs.py`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BASE = ["--requests", "20000"]
BURSTY = ["--arrivals", "bursty"]
SWEEPS = [
    ("w1", ["--workers", "1", *BASE], "1 worker (the issue's sweep)"),
    ("w4", ["--workers", "4", *BASE], "4 workers"),
    ("w1-bursty", ["--workers", "1", *BASE, *BURSTY], "1 worker, bursty arrivals"),
    ("w4-bursty", ["--workers", "4", *BASE, *BURSTY], "4 workers, bursty arrivals"),
]


def run(name: str, args: list[str]) -> dict[str, Any]:
    command = [
        sys.executable,
        "-m",
        "batchserve.cli",
        "simulate",
        "--scenario",
        "sweep",
        *args,
        "--plot",
        str(DOCS / f"policy-sweep-{name}.png"),
        "--json",
    ]
    out = subprocess.run(command, cwd=ROOT, check=True, capture_output=True, text=True).stdout
    return orjson.loads(out)


def table(results: list[dict[str, Any]]) -> str:
    lines = [
        "| policy | load | p50 ms | p95 ms | p99 ms | mean batch | utilization |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['policy']} | {r['load']:.0%} | {r['p50_ms']:.1f} | {r['p95_ms']:.1f} | "
            f"**{r['p99_ms']:.1f}** | {r['mean_batch']:.1f} | {r['utilization']:.1%} |"
        )
    return "\n".join(lines)


def main() -> None:
    parts = [Path(__file__).with_name("policy_sweep_intro.md").read_text()]
    for name, args, title in SWEEPS:
        document = run(name, args)
        verdict = document["verdict"]
        beaten = ", ".join(
            f"{p} at {load:.0%}" for p, load in verdict["beaten_at"].items() if load is not None
        )
        command = f"batchserve simulate --scenario sweep {' '.join(args)}"
        parts.append(
            f"## {title}\n\n`{command} --plot docs/policy-sweep-{name}.png`\n\n"
            f"![p99 against load](policy-sweep-{name}.png)\n\n{table(document['results'])}\n\n"
            "Adaptive p99 over the best static policy's p99: at most "
            f"**{verdict['worst_ratio_to_best']:.3f}** (at {verdict['worst_load']:.0%} load). "
            f"Adaptive is strictly better than: {beaten or 'none'}.\n"
        )
    (DOCS / "policy-sweep.md").write_text("\n".join(parts))


if __name__ == "__main__":
    main()
