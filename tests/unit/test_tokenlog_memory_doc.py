"""docs/operations.md, "Redis memory: the token logs", against the run it reports
(docs/tokenlog-memory.json, ``scripts/bench_tokenlog_memory.py``): the figures are the run's, a
log kept the hour grew all along, a lingering one levelled off, and the hour's extrapolation is
the arithmetic of the run's own bytes a log."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUN = json.loads((ROOT / "docs" / "tokenlog-memory.json").read_text())
DOC = (ROOT / "docs" / "operations.md").read_text()
README = (ROOT / "README.md").read_text()


def way(linger_s: float) -> dict[str, Any]:
    return next(w for w in RUN["ways"] if w["linger_s"] == linger_s)


def row(found: dict[str, Any]) -> str:
    """The section's table row of one way."""
    samples = " · ".join(f"{s['at_s']} s: {s['logs']:,} ({s['mib']:.1f})" for s in found["samples"])
    return f"| {found['linger_s']:,.0f} s | {samples} |"


def test_the_table_is_the_run() -> None:
    for found in RUN["ways"]:
        assert row(found) in DOC


def test_kept_the_hour_the_logs_grew_and_lingering_they_levelled_off() -> None:
    hour, minute = way(3600.0), way(60.0)
    grown = [s["logs"] for s in hour["samples"]]
    assert grown == sorted(grown) and grown[-1] > 1.5 * grown[len(grown) // 2 - 1]
    rate = RUN["rate"]
    after = [s["logs"] for s in minute["samples"] if s["at_s"] > minute["linger_s"] + 5]
    assert len(after) >= 2 and max(after) <= rate * (minute["linger_s"] + 5)
    assert max(after) - min(after) <= 0.05 * max(after)
    last = minute["samples"][-1]
    assert f"{last['logs']:,} logs, {last['mib']:.1f} MiB" in DOC
    assert f"lingering they level off at {last['mib']:.1f} MiB" in " ".join(README.split())


def test_the_hours_figure_is_the_runs_bytes_a_log() -> None:
    found = way(3600.0)
    held_gb = RUN["rate"] * 3600 * found["bytes_a_log"] / 1e9
    kb = found["bytes_a_log"] / 1000
    assert f"{held_gb:.1f} GB at a steady 100/s" in DOC
    assert f"about {kb:.1f} KB of Redis memory" in DOC
    readme = " ".join(README.split())
    assert f"about {kb:.1f} KB however short" in readme
    assert f"{held_gb:.1f} GB at a steady 100 requests a second" in readme
