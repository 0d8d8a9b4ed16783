"""The live batcher runs the simulator's policy; admission refuses hopeless deadlines early."""

from __future__ import annotations

import asyncio
import itertools
import statistics
import time
from datetime import datetime

import httpx
import pytest

from batchserve.batching.batcher import policy_config
from batchserve.batching.estimate import FixedBatchTime
from batchserve.batching.simulator import Arrival, simulate
from batchserve.bench.loadgen import open_loop, poisson_schedule
from batchserve.core.loadboard import RedisLoadBoard
from batchserve.models.registry import load_registry
from batchserve.testing.deployment import Stack
from tests.conftest import TEST_MODELS
from tests.support import keys
from tests.support.live import db_rows, wait_terminal

ECHO = "echo-100ms"
SLOW = "echo-slow"  # 1 s batches


def received_at(result: dict[str, object]) -> float:
    created = datetime.fromisoformat(str(result["created_at"])).timestamp()
    return created + float(result["timings"]["queued_ms"]) / 1000.0  # type: ignore[index]


@pytest.mark.parametrize("rate", [100.0, 220.0])
async def test_live_mean_batch_matches_the_simulator(
    stack: Stack, http: httpx.AsyncClient, rate: float
) -> None:
    stack.start_all({ECHO: 1})
    await wait_terminal(
        http,
        [(await http.post("/v1/requests", json={"model": ECHO, "input": "warm"})).json()["id"]],
    )
    load = await open_loop(
        stack.url,
        poisson_schedule(rate, duration_s=6.0, seed=int(rate)),
        lambda i: {"model": ECHO, "input": f"load {i}"},
        headers=keys.auth(),
    )
    assert load.errors == 0 and len(load.accepted) == len(load.submitted)
    ids = [s.request_id for s in load.accepted if s.request_id]
    results = await wait_terminal(http, ids, timeout_s=120)
    assert all(r["status"] == "succeeded" for r in results.values())
    batch_ids = {r["batch_id"] for r in results.values()}
    rows = db_rows(
        stack,
        "SELECT id, size, extract(epoch FROM dispatched_at), extract(epoch FROM finished_at) "
        "FROM batches ORDER BY dispatched_at",
    )
    window = [r for r in rows if str(r[0]) in batch_ids]
    live_mean = statistics.mean(r[1] for r in window)
    # The simulated worker takes the live one's time for each batch in turn (model, result
    # write and dispatch to the next batch): a batch slowed by the machine lets the next one
    # grow in both, rather than only in the live run.
    gaps = [
        float(b[2]) - float(a[3])
        for a, b in itertools.pairwise(window)
        if float(b[2]) - float(a[3]) < 0.05
    ]
    turnaround_s = statistics.median(gaps) if gaps else 0.0
    live_cycles_s = [float(r[3]) - float(r[2]) + turnaround_s for r in window]
    median_cycle_s = statistics.median(live_cycles_s)
    cycles = iter(live_cycles_s)
    spec = load_registry(TEST_MODELS).get(ECHO)
    assert spec is not None
    arrivals = [Arrival(received_at(r), request_id) for request_id, r in results.items()]
    simulated = simulate(
        arrivals,
        workers=1,
        config=policy_config(spec),
        estimator=FixedBatchTime(spec.batch_time_ms / 1000.0),
        run_time=lambda _batch: next(cycles, median_cycle_s),
    )
    print(
        f"\n{rate:.0f}/s: live mean batch {live_mean:.1f} over {len(window)} batches, "
        f"simulated {simulated.mean_batch:.1f} (median cycle {median_cycle_s * 1000:.0f} ms)"
    )
    assert live_mean == pytest.approx(simulated.mean_batch, rel=0.2)


async def backlog_published(stack: Stack, model: str, at_least: int) -> None:
    """Wait until the batcher's published load (what admission reads) shows a live slot and
    ``at_least`` requests ahead: on a busy machine a fixed pause may end before it does."""
    board = RedisLoadBoard(stack.env["BATCHSERVE_REDIS_URL"], stack.env["BATCHSERVE_NAMESPACE"])
    try:
        for _ in range(100):
            snapshot = await board.fresh(model, time.time())
            if snapshot and snapshot.slots and snapshot.ahead_of(bulk=False) >= at_least:
                await asyncio.sleep(0.2)  # the API's own copy refreshes every 100 ms
                return
            await asyncio.sleep(0.05)
    finally:
        await board.close()
    raise AssertionError(f"no fresh load snapshot of {model} with {at_least} requests ahead")


async def test_a_hopeless_deadline_is_refused_at_admission(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    # One slot of 1 s batches of 32: the backlog of 400 takes 12 s to drain, so it cannot
    # drain below what the check needs while a busy machine is still publishing it (with the
    # 100 ms model, 960 requests drained in 3 s and the check sometimes came too late).
    stack.start_all({SLOW: 1})
    backlog = await open_loop(
        stack.url,
        [0.0] * 400,
        lambda i: {"model": SLOW, "input": f"backlog {i}"},
        headers=keys.auth(),
    )
    assert len(backlog.accepted) == 400
    await backlog_published(stack, SLOW, at_least=64)
    hopeless = await http.post(
        "/v1/requests", json={"model": SLOW, "input": "now!", "timeout_s": 0.5}
    )
    assert hopeless.status_code == 503, hopeless.text
    assert hopeless.headers["content-type"].startswith("application/problem+json")
    assert int(hopeless.headers["retry-after"]) >= 1
    problem = hopeless.json()
    assert problem["code"] == "deadline_unmeetable" and problem["field"] == "deadline"
    assert (
        problem["estimated_s"] > 0.5 and "deadline" in problem and "estimated_completion" in problem
    )
    patient = await http.post(
        "/v1/requests", json={"model": SLOW, "input": "later", "timeout_s": 60}
    )
    assert patient.status_code == 202
    accepted = [s.request_id for s in backlog.accepted if s.request_id] + [patient.json()["id"]]
    results = await wait_terminal(http, accepted, timeout_s=120)
    assert all(r["status"] == "succeeded" for r in results.values())
    assert db_rows(stack, "SELECT count(*) FROM requests")[0][0] == len(accepted)
