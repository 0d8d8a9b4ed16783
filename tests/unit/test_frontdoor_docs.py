"""docs/frontdoor.md shows the figures its benchmark run recorded (docs/frontdoor.json)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "frontdoor.md").read_text()
RUN = json.loads((ROOT / "docs" / "frontdoor.json").read_text())


def _table() -> dict[tuple[float, str], list[str]]:
    rows = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1] in RUN["paths"]:
            rows[(float(cells[0]), cells[1])] = cells
    return rows


def test_each_row_is_the_recorded_figure() -> None:
    table = _table()
    over = {(g["path"], g["offered_rps"]): g for g in RUN["goals"]["latency"]}
    assert len(table) == len(RUN["results"])
    for r in RUN["results"]:
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
    served = RUN["goals"]["served_vs_ideal"]
    prose = " ".join(DOC.split())
    assert "0.90 of 320/s served): **none is met on this machine**" in prose
    assert all(g["met"] is False for g in RUN["goals"]["latency"] if g["met"] is not None)
    assert max(served["longpoll"], served["sync"]) < 0.9
    longpoll, sync = served["longpoll"], served["sync"]
    assert f"the ideal at best; batchserve {longpoll} (longpoll) and {sync}" in prose
    assert f"serves {served['baseline']} of the" in prose


def test_the_pool_comparison_is_the_recorded_one() -> None:
    runs = json.loads((ROOT / "docs" / "frontdoor-pool-ab.json").read_text())["runs"]
    prose = " ".join(DOC.split())

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
        assert shown in prose
