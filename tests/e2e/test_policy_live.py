"""The live batcher runs the simulator's policy. (Admission by deadline is checked on the
stepped stack: tests/unit/test_stack_stepped.py.)"""

from __future__ import annotations

import itertools
import re
import statistics
from datetime import datetime

import httpx
import pytest

from batchserve.batching.batcher import policy_config
from batchserve.batching.estimate import FixedBatchTime
from batchserve.batching.simulator import Arrival, simulate
from batchserve.bench.loadgen import open_loop, poisson_schedule
from batchserve.models.registry import load_registry
from batchserve.testing.deployment import Stack
from tests.conftest import TEST_MODELS
from tests.support import keys
from tests.support.live import db_rows, wait_terminal

ECHO = "echo-100ms"


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
    # What the replay cannot give the simulator is the batcher's own lateness: starved of CPU
    # (the suite's model tests beside it), it decides late and its batches grow (a loaded CI
    # machine: 28.6 live against 22.9 simulated at 220/s). A policy that sent each request
    # alone, or held batches to a fixed size, would miss by far more.
    assert live_mean == pytest.approx(simulated.mean_batch, rel=0.3)


async def test_requests_that_arrive_within_the_lead_join_the_batch_sent_ahead(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    """On the real stack (Postgres, RabbitMQ, Redis, Celery with standby processes) at 100/s:
    batches sent behind a running one take late joiners, claimed by the worker as the model
    starts, and every request still ends once, in a batch whose row counts it."""
    stack.start_all({ECHO: 1})
    await wait_terminal(
        http,
        [(await http.post("/v1/requests", json={"model": ECHO, "input": "warm"})).json()["id"]],
    )
    load = await open_loop(
        stack.url,
        poisson_schedule(100.0, duration_s=6.0, seed=7),
        lambda i: {"model": ECHO, "input": f"load {i}"},
        headers=keys.auth(),
    )
    assert load.errors == 0 and len(load.accepted) == len(load.submitted)
    ids = [s.request_id for s in load.accepted if s.request_id]
    results = await wait_terminal(http, ids, timeout_s=120)
    assert all(r["status"] == "succeeded" and r["attempts"] == 1 for r in results.values())
    # Each batch's size is the number of its members (its late joiners included).
    rows = db_rows(
        stack,
        "SELECT b.id, b.size, count(r.id), extract(epoch FROM b.dispatched_at) FROM batches b "
        "JOIN requests r ON r.batch_id = b.id GROUP BY b.id",
    )
    assert all(int(size) == int(members) <= 32 for _, size, members, _ in rows)
    # Joiners: held by the batcher only after their batch had left it.
    dispatched = {str(r[0]): float(r[3]) for r in rows}
    joined = [r for r in results.values() if received_at(r) > dispatched[str(r["batch_id"])]]
    log = stack.logs(f"worker:{ECHO}")
    claimed = sum(int(n) for n in re.findall(r"batch_joined .*?joined=(\d+)", log))
    print(f"\n{len(joined)} of {len(ids)} requests joined a batch sent before they arrived")
    assert joined and claimed >= len(joined)
    # The API put some of them in the box itself, as it admitted them (BatchJoinable).
    metrics = (await http.get(f"{stack.ops_url}/metrics")).text
    by_api = re.search(
        rf'batchserve_batch_joins_offered_total\{{by="api",model="{ECHO}"\}} (\S+)', metrics
    )
    print(f"the API offered {by_api.group(1) if by_api else 0} of them")
    assert by_api is not None and float(by_api.group(1)) > 0
