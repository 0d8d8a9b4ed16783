"""Servers restarted under load: every role recovers by itself."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest

from batchserve.bench.loadgen import open_loop, poisson_schedule
from batchserve.testing.deployment import Stack
from batchserve.testing.faults import (
    restart_rabbitmq,
    restart_redis,
    start_postgres,
    start_redis,
    stop_postgres,
    stop_redis,
)
from tests.chaos.conftest import exactly_once
from tests.support import keys
from tests.support.live import wait_terminal

# Postgres, RabbitMQ and Redis go down here: nothing else may run meanwhile (`make test` runs
# these after the rest, alone).
pytestmark = pytest.mark.exclusive

ECHO = "echo-100ms"


def body(i: int) -> dict[str, object]:
    return {"model": ECHO, "input": f"under fault {i}", "timeout_s": 300}


async def traffic(stack: Stack, rate: float, seconds: float, seed: int) -> list[str]:
    result = await open_loop(
        stack.url, poisson_schedule(rate, seconds, seed), body, headers=keys.auth()
    )
    return [s.request_id for s in result.accepted if s.request_id]


async def with_fault(stack: Stack, fault_after_s: float, fault: object) -> list[str]:
    """Run 8 s of traffic at 100/s with ``fault`` (a blocking callable) injected midway."""
    load = asyncio.create_task(traffic(stack, 100.0, 8.0, seed=int(fault_after_s * 10)))
    await asyncio.sleep(fault_after_s)
    await asyncio.to_thread(fault)  # type: ignore[arg-type]
    return await load


async def test_rabbitmq_restart_under_load(stack: Stack, http: httpx.AsyncClient) -> None:
    stack.start_all({ECHO: 2})
    accepted = await with_fault(stack, 2.0, restart_rabbitmq)
    assert len(accepted) > 300
    results = await wait_terminal(http, accepted, timeout_s=120)
    assert all(r["status"] == "succeeded" for r in results.values())
    exactly_once(stack, accepted)


async def test_redis_restart_under_load_and_long_poll_falls_back(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({ECHO: 2})
    accepted = await with_fault(stack, 2.0, restart_redis)
    results = await wait_terminal(http, accepted, timeout_s=120)
    assert all(r["status"] == "succeeded" for r in results.values())
    # While Redis is away a long-poll still returns when the request finishes (it polls).
    await asyncio.to_thread(stop_redis)
    try:
        request_id = (await http.post("/v1/requests", json=body(-1))).json()["id"]
        started = time.monotonic()
        response = await http.get(f"/v1/requests/{request_id}", params={"wait": 20})
        assert response.json()["status"] == "succeeded"
        assert time.monotonic() - started < 10
        accepted.append(request_id)
    finally:
        await asyncio.to_thread(start_redis)
    exactly_once(stack, accepted)


async def test_postgres_down_is_503_and_everything_reconnects(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start_all({ECHO: 2})
    before = await traffic(stack, 100.0, 2.0, seed=1)
    await asyncio.to_thread(stop_postgres)
    try:
        down = await http.post("/v1/requests", json=body(0))
        assert down.status_code == 503
        assert down.headers["content-type"].startswith("application/problem+json")
        assert down.json()["code"] == "unavailable" and "retry-after" in down.headers
        poll = await http.get(f"/v1/requests/{before[0]}")
        assert poll.status_code == 503
    finally:
        await asyncio.to_thread(start_postgres)
    after = await traffic(stack, 100.0, 3.0, seed=2)
    results = await wait_terminal(http, before + after, timeout_s=120)
    assert all(r["status"] == "succeeded" for r in results.values())
    exactly_once(stack, before + after)
