"""Workers whose hosts' clocks are 5 s off, ahead and behind: leases and slot
liveness are computed on the deployment's one clock (Postgres's), so neither reaps a live batch
nor hides a live slot. On each host's own clock a worker 5 s behind announces slots that the
batcher reads as dead 2 s before they were announced, and writes leases that maintenance reaps
as soon as they are taken."""

from __future__ import annotations

import re
from pathlib import Path

import httpx

from batchserve.testing.deployment import Stack, free_port
from tests.chaos.conftest import ECHO, exactly_once, traffic
from tests.support.live import db_rows

SKEWED_HOST = Path(__file__).parents[1] / "support" / "skewed_host"
SKEWS = {"ahead": 5.0, "behind": -5.0}


def skewed(offset_s: float) -> dict[str, str]:
    """A host whose wall clock is ``offset_s`` off (tests/support/skewed_host: why not
    libfaketime)."""
    return {"PYTHONPATH": str(SKEWED_HOST), "BATCHSERVE_TEST_CLOCK_SKEW_S": str(offset_s)}


async def test_workers_5_s_ahead_and_behind_serve_without_a_reap(stack: Stack) -> None:
    stack.start("batcher", "batcher")
    stack.start("maintenance", "maintenance")
    stack.start_api()
    exporters = {name: free_port() for name in SKEWS}
    for name, offset in SKEWS.items():
        env = {**skewed(offset), "BATCHSERVE_METRICS_PORT": str(exporters[name])}
        stack.start(f"worker:{name}", "worker", "--model", ECHO, "--slots", "1", env=env)
    stack.wait_slots(ECHO, 2)
    accepted = await traffic(stack, 60.0, 6.0, seed=31)
    report = exactly_once(stack, accepted)
    assert report.succeeded == len(accepted) > 250
    # No batch was started twice or reaped, and both hosts ran batches.
    rows = db_rows(
        stack, "SELECT worker, attempt, outcome FROM batches WHERE model = :model", model=ECHO
    )
    assert {outcome for _, _, outcome in rows} == {"succeeded"}
    assert {attempt for _, attempt, _ in rows} == {1}
    ran = {int(worker.rsplit(":", 1)[1]) for worker, _, _ in rows}
    for name in SKEWS:
        assert ran & set(stack.child_pids(f"worker:{name}")), f"the worker {name} ran no batch"
    attempts = db_rows(stack, "SELECT max(attempts) FROM requests")
    assert attempts[0][0] == 1
    # Each worker found its host off and corrected for it.
    for name, offset in SKEWS.items():
        log = Path(stack.roles[f"worker:{name}"].log_path).read_text()
        found = [float(v) for v in re.findall(r"clock_skew.*?offset_s\W*?(-?[\d.]+)", log)]
        assert found, (name, log[-2000:])
        assert all(abs(v + offset) < 0.5 for v in found), (name, found)
        # ... and shows it to Prometheus.
        scrape = httpx.get(f"http://127.0.0.1:{exporters[name]}/metrics", timeout=5).text
        shown = re.search(r"^batchserve_clock_offset_seconds(?:\{[^}]*\})? (\S+)$", scrape, re.M)
        assert shown is not None and abs(float(shown.group(1)) + offset) < 0.5, (name, shown)
