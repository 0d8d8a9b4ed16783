"""Tenants on the live stack: fair share in batches under a 20x burst, and a burst far beyond
capacity refused early (503 + Retry-After) with everything accepted still completed."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import httpx

from batchserve.bench.loadgen import LoadResult, open_loop, poisson_schedule
from batchserve.testing.deployment import Stack
from tests.support.live import db_rows, wait_terminal

B8 = "echo-b8"  # one slot: 80 requests/s


def p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(0.99 * len(ordered)) - 1)]


async def traffic(stack: Stack, tenant: str, rate: float, seconds: float, seed: int) -> LoadResult:
    return await open_loop(
        stack.url,
        poisson_schedule(rate, seconds, seed),
        lambda i: {"model": B8, "input": f"{tenant} {i}"},
        headers=stack.auth(tenant),
    )


async def latencies_ms(stack: Stack, tenant: str, load: LoadResult) -> dict[str, float]:
    assert load.errors == 0 and len(load.accepted) == len(load.submitted)
    ids = [s.request_id for s in load.accepted if s.request_id]
    async with httpx.AsyncClient(base_url=stack.url, headers=stack.auth(tenant)) as client:
        results = await wait_terminal(client, ids, timeout_s=180)
    assert all(r["status"] == "succeeded" for r in results.values())
    return {i: float(r["timings"]["total_ms"]) for i, r in results.items()}


async def test_a_small_tenant_waits_out_at_most_two_batches_beside_one_sending_20x(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({B8: 1})
    for tenant in ("small", "big"):
        stack.auth(tenant)  # keys first, so the load starts on time
    alone = await latencies_ms(stack, "small", await traffic(stack, "small", 4.0, 12.0, seed=1))
    small_load, big_load = await asyncio.gather(
        traffic(stack, "small", 4.0, 12.0, seed=2), traffic(stack, "big", 80.0, 12.0, seed=3)
    )
    shared = await latencies_ms(stack, "small", small_load)
    big = await latencies_ms(stack, "big", big_load)
    alone_p99, shared_p99, big_p99 = (
        p99(list(alone.values())),
        p99(list(shared.values())),
        p99(list(big.values())),
    )
    print(
        f"small tenant p99 alone {alone_p99:.0f} ms, beside the 20x tenant {shared_p99:.0f} ms "
        f"({shared_p99 / alone_p99:.2f}x); big tenant p99 {big_p99:.0f} ms"
    )
    # Latency is reported, not asserted: on two shared cores it swings with whatever else runs.
    # The fairness claim is structural and exact: every small request rode one of the first
    # two batches that left after it reached the batcher, however many of the big tenant's waited.
    small_waited = batches_waited_out(stack, "small", list(shared))
    big_waited = batches_waited_out(stack, "big", list(big))
    print(
        f"batches waited out: small max {max(small_waited)}, "
        f"mean {sum(small_waited) / len(small_waited):.2f}; big max {max(big_waited)}"
    )
    assert len(small_waited) == len(shared) and len(big_waited) == len(big)
    assert max(big_waited) > 2  # the big tenant really did build a queue
    assert max(small_waited) <= 2


def batches_waited_out(stack: Stack, tenant: str, ids: list[str]) -> list[int]:
    """Per request: batches of the model that left after it reached the batcher and before its
    own.

    Counted from the batcher's receipt (``created_at + queued_ms``), not the submit: under load
    the API may take a while to publish it and the broker to deliver it, and those delays are
    the front's and the broker's; a batch that left before the batcher had the request could not
    have held it. (Counted from the publish, two clean-clone CIs on a loaded 2-core machine saw
    4 and 7.)"""
    rows = db_rows(
        stack,
        "SELECT (SELECT count(*) FROM batches o WHERE o.model = :m"
        "  AND o.dispatched_at > r.created_at + r.queued_ms * interval '1 millisecond'"
        "  AND o.dispatched_at < b.dispatched_at) AS skipped "
        "FROM requests r JOIN batches b ON b.id = r.batch_id "
        "WHERE r.tenant = :t AND r.id = ANY(CAST(:ids AS uuid[]))",
        m=B8,
        t=tenant,
        ids=ids,
    )
    return [int(row.skipped) for row in rows]


async def test_a_burst_far_beyond_capacity_is_refused_early_and_nothing_accepted_is_lost(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    # One slot of 8 per 100 ms = 80/s; the backlog may hold 1 s of that. The burst must come
    # in faster than the slot drains it, however slowly a busy host's API admits: with a slot
    # of 32 (320/s) a CI host running other suites beside it once admitted the whole burst at
    # about the pace the slot served it, and rightly refused nothing.
    stack.env = {**stack.env, "BATCHSERVE_MAX_QUEUE_S": "1", "BATCHSERVE_MIN_BACKLOG": "50"}
    stack.start_all({B8: 1})
    await wait_terminal(
        http,
        [(await http.post("/v1/requests", json={"model": B8, "input": "warm"})).json()["id"]],
    )
    await asyncio.sleep(0.3)  # a fresh load snapshot
    burst = await open_loop(
        stack.url,
        [0.0] * 2000,
        lambda i: {"model": B8, "input": f"burst {i}"},
        headers=stack.auth("tests"),
    )
    codes: dict[int, int] = {}
    for s in burst.submitted:
        codes[s.status] = codes.get(s.status, 0) + 1
    answered = [s.sent_at + s.latency_s for s in burst.submitted]
    span_s = max(answered) - min(s.sent_at for s in burst.submitted)
    print(f"burst of 2000: {codes}, errors {burst.errors}, answered within {span_s:.1f} s")
    assert burst.errors == 0 and set(codes) <= {202, 503}
    # The bound is 1 s of the slot's measured capacity (80 at 100 ms a batch), never below
    # BATCHSERVE_MIN_BACKLOG: a busy CI host measures its batches slower (one run took 50).
    assert codes.get(503, 0) > 0 and codes.get(202, 0) >= 50
    refusals: list[dict[str, Any]] = []
    async with httpx.AsyncClient(base_url=stack.url, headers=stack.auth("tests")) as client:
        for _ in range(3):
            late = await client.post("/v1/requests", json={"model": B8, "input": "late"})
            if late.status_code == 503:
                refusals.append({"retry_after": int(late.headers["retry-after"]), **late.json()})
    if refusals:
        problem = refusals[0]
        assert problem["code"] == "overloaded" and problem["limit_name"] == "max_backlog"
        assert 1 <= problem["retry_after"] <= 30
    accepted = [s.request_id for s in burst.accepted if s.request_id]
    results = await wait_terminal(http, accepted, timeout_s=120)
    assert all(r["status"] == "succeeded" for r in results.values())
    total = db_rows(stack, "SELECT count(*) AS n FROM requests WHERE tenant = 'tests'")[0].n
    extra = 1 + (3 - len(refusals))  # the warm-up, and any late submit that was taken
    assert total == len(accepted) + extra  # nothing refused was persisted, nothing dropped
