"""The active batcher killed under load: the standby takes over and nothing is lost. (No shared
server goes down here, so unlike the server restarts this runs beside other tests.)"""

from __future__ import annotations

import asyncio

import httpx

from batchserve.testing.deployment import Stack
from tests.chaos.conftest import ECHO, exactly_once, traffic
from tests.support.live import wait_terminal


async def test_killing_the_active_batcher_hands_over_to_the_standby(
    stack: Stack, http: httpx.AsyncClient
) -> None:
    stack.start("batcher-a", "batcher")
    await asyncio.sleep(1.0)  # a registers first: it is the active consumer
    stack.start("batcher-b", "batcher")
    stack.start("maintenance", "maintenance")
    stack.start(f"worker:{ECHO}", "worker", "--model", ECHO, "--slots", "2")
    stack.start_api()
    stack.wait_slots(ECHO, 2)
    load = asyncio.create_task(traffic(stack, 100.0, 6.0, seed=3))
    await asyncio.sleep(2.0)
    stack.kill("batcher-a")
    accepted = await load
    results = await wait_terminal(http, accepted, timeout_s=120)
    assert all(r["status"] == "succeeded" for r in results.values())
    assert "batch_dispatched" in stack.logs("batcher-b")  # the standby took over
    exactly_once(stack, accepted)
