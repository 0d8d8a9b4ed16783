"""docs/frontdoor.md shows the figures its benchmark runs recorded (the JSON files beside it)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "frontdoor.md").read_text()
PROSE = " ".join(DOC.split())
RUNS = ("frontdoor.json", "frontdoor-before.json")


def _run(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((ROOT / "docs" / name).read_text())
    return document


def _section(name: str) -> str:
    """The docs' text from the run's link to the next run's link (or the end)."""
    starts = sorted(DOC.index(f"([{n}]({n}))") for n in RUNS)
    start = DOC.index(f"([{name}]({name}))")
    later = [s for s in starts if s > start]
    return DOC[start : later[0] if later else len(DOC)]


@pytest.mark.parametrize("name", RUNS)
def test_each_row_is_the_recorded_figure(name: str) -> None:
    run = _run(name)
    table = {}
    for line in _section(name).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1] in run["paths"]:
            table[(float(cells[0]), cells[1])] = cells
    over = {(g["path"], g["offered_rps"]): g for g in run["goals"]["latency"]}
    assert len(table) == len(run["results"])
    for r in run["results"]:
        cells = table[(r["offered_rps"], r["path"])]
        assert int(cells[2]) == r["answered"] == r["sent"]  # every caller answered
        assert r["wrong"] == r["refused"] == r["errors"] == 0
        assert float(cells[3]) == r["p50_ms"] and float(cells[4]) == r["p99_ms"]
        assert float(cells[5]) == r["served_rps"]
        assert float(cells[6]) == round(sum(r["cpu_ms_per_request"].values()), 2)
        goal = over.get((r["path"], r["offered_rps"]))
        if goal is not None:
            p50, p99 = goal["p50_over_baseline_ms"], goal["p99_over_baseline_ms"]
            assert cells[7] == f"{p50:+.1f} / {p99:+.1f}"


def test_the_verdicts_are_the_recorded_ones() -> None:
    now, before = _run("frontdoor.json"), _run("frontdoor-before.json")
    served = now["goals"]["served_vs_ideal"]
    assert "0.90 of 320/s served): **none is met on this machine**" in PROSE
    assert all(g["met"] is False for g in now["goals"]["latency"] if g["met"] is not None)
    assert max(served["longpoll"], served["sync"]) < 0.9
    assert f"serves {served['baseline']} of the ideal at best" in PROSE
    assert f"batchserve {served['longpoll']} (longpoll) and {served['sync']} (sync)" in PROSE
    was = before["goals"]["served_vs_ideal"]
    assert f"batchserve served {was['longpoll']} (longpoll) and {was['sync']} (sync)" in PROSE
    # What the changes between the runs bought, as the docs say: more served on both paths.
    assert served["longpoll"] > was["longpoll"] and served["sync"] > was["sync"]
    at_100 = {r["path"]: r for r in now["results"] if r["offered_rps"] == 100.0}
    cpu = {p: round(sum(at_100[p]["cpu_ms_per_request"].values()), 2) for p in at_100}
    assert f"spend {cpu['longpoll']} ms of CPU a long-polled request" in PROSE
    assert f"and {cpu['sync']} ms a synchronous one" in PROSE
    api = [at_100[p]["cpu_ms_per_request"]["api"] for p in ("longpoll", "sync")]
    assert f"(the API {api[0]:.2f} and {api[1]:.2f} of them)" in PROSE


def test_the_pool_comparison_is_the_recorded_one() -> None:
    runs = _run("frontdoor-pool-ab.json")["runs"]

    def p50(overflow: int, path: str) -> list[float]:
        return [
            r["p50_ms"]
            for run in runs
            if run["api_db_max_overflow"] == overflow
            for r in run["results"]
            if r["path"] == path
        ]

    for path in ("longpoll", "sync"):
        fixed, churning = p50(0, path), p50(10, path)
        assert len(fixed) == len(churning) == 2
        assert max(fixed) < min(churning)  # the order held in every pair
        shown = f"{path} {fixed[0]} and {fixed[1]} against {churning[0]} and {churning[1]}"
        assert shown in PROSE
    assert re.search(r"\[frontdoor-pool-ab\.json\]", DOC)


def test_server_cpu_counts_each_process_between_two_readings() -> None:
    from batchserve.bench.stack import server_cpu_per

    before = {10: ("postgres", 1.0), 11: ("postgres", 2.0), 12: ("redis", 5.0)}
    # 11 exited (drops out), 13 started (counts from zero), RabbitMQ did nothing.
    after = {10: ("postgres", 1.5), 12: ("redis", 5.1), 13: ("postgres", 0.25)}
    spent = server_cpu_per(before, after, 100)
    assert spent == {"postgres": 7.5, "rabbitmq": 0.0, "redis": 1.0}
    assert server_cpu_per(before, after, 0) == {}


def test_the_server_cpu_figures_are_the_recorded_ones() -> None:
    rows = {r["path"]: r for r in _run("frontdoor-servers.json")["results"]}
    labels = {"longpoll": "per long-polled request", "sync": "per synchronous request"}
    for path, label in labels.items():
        row = rows[path]
        roles = round(sum(row["cpu_ms_per_request"].values()), 2)
        servers = row["server_cpu_ms_per_request"]
        assert f"{label}: the roles {roles:.2f} ms" in PROSE
        figures = [f"{servers[s]:.2f}" for s in ("postgres", "rabbitmq", "redis")]
        assert f"Postgres {figures[0]}, RabbitMQ {figures[1]}, Redis {figures[2]}" in PROSE
        assert row["answered"] == row["sent"] and row["wrong"] == 0
    assert f"(the API {rows['longpoll']['cpu_ms_per_request']['api']:.2f})" in PROSE
    assert f"baseline: {rows['baseline']['cpu_ms_per_request']['baseline']:.2f} ms" in PROSE
