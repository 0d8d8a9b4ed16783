"""Plots of simulator sweeps (matplotlib, written to PNG)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from batchserve.batching.scenarios import SweepRow


def plot_sweep(rows: Sequence[SweepRow], path: Path, title: str) -> None:
    """p99 latency against load, one line per policy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(r.policy for r in rows))
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for policy in policies:
        points = sorted((r.load, r.p99_ms) for r in rows if r.policy == policy)
        style = {"linewidth": 3.0, "color": "black"} if policy == "adaptive" else {"linewidth": 1.5}
        ax.plot(
            [p[0] * 100 for p in points], [p[1] for p in points], marker="o", label=policy, **style
        )
    ax.set_xlabel("offered load (% of capacity with full batches)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
