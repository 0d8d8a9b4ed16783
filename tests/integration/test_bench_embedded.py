"""``scripts/bench_embedded.py`` measures the embedded mode it starts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_embedded


def test_a_short_round_answers_every_request_on_every_path_and_judges_the_goals() -> None:
    """A fresh embedded service (no servers, its own home directory) and the front door's
    baseline beside it: lone requests measured from send to answer, around a batch of the
    seeds' 100 ms model, then each path at a short open-loop step, every request answered with
    its own answer, the process's CPU counted and the goals judged against the baseline."""
    run = bench_embedded.run_round([20.0], 1.0, 7, seed=7)
    lone = run["lone"]
    assert lone["to_end"] >= 100.0  # the model's 100 ms are inside acceptance to the end
    assert lone["total"] > lone["to_end"] > 0 and lone["submit"] > 0
    assert lone["end_to_answer"] >= 0
    rows = {row["path"]: row for row in run["results"]}
    assert set(rows) == {"baseline", "longpoll", "sync"}
    for row in rows.values():
        assert row["answered"] == row["sent"] > 0 and row["wrong"] == 0
        assert row["p50_ms"] >= 100.0
    assert set(rows["baseline"]["cpu_ms_per_request"]) == {"baseline"}
    for path in ("longpoll", "sync"):
        assert rows[path]["cpu_ms_per_request"]["embedded"] > 0
        assert rows[path]["joined"] is None  # no batches' figures: SQLite, not the bench's
    judged = {(j["path"], j["offered_rps"]) for j in run["goals"]["latency"]}
    assert judged == {("longpoll", 20.0), ("sync", 20.0)}


def test_a_job_beside_lone_requests_ends_with_every_line_and_the_callers_answered() -> None:
    """No front door rates, a small batch job: it completes with every line, and the lone
    requests made while it ran were answered (``lone_request`` raises otherwise)."""
    run = bench_embedded.run_round([], 1.0, 6, seed=7, job_lines=40)
    assert "results" not in run
    job = run["job"]
    assert job["status"] == "completed"
    assert job["request_counts"] == {"total": 40, "completed": 40, "failed": 0}
    assert job["lone_requests"] >= 1 and job["lone_max_ms"] >= job["lone_p50_ms"] >= 100.0
