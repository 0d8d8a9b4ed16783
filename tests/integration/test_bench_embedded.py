"""``scripts/bench_embedded.py`` measures the embedded mode it starts."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

import bench_embedded


def test_a_short_round_answers_every_request_and_counts_the_process_cpu() -> None:
    """A fresh embedded service (no servers, its own home directory): lone requests measured
    from send to answer, around a batch of the seeds' 100 ms model, then a short open-loop
    step with every request answered and the process's CPU counted."""
    run = bench_embedded.run_round([20.0], 1.0, 7, seed=7)
    lone = run["lone"]
    assert lone["to_end"] >= 100.0  # the model's 100 ms are inside acceptance to the end
    assert lone["total"] > lone["to_end"] > 0 and lone["submit"] > 0
    assert lone["end_to_answer"] >= 0
    (step,) = run["steps"]
    assert step["answered"] == step["sent"] > 0
    assert step["p50_ms"] >= 100.0 and step["cpu_ms_per_request"] > 0
