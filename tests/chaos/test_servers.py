"""RabbitMQ restarted under load: every role recovers by itself. (Redis and PostgreSQL go down
in test_own_servers.py, on servers of those tests' own.)"""

from __future__ import annotations

import asyncio

import httpx
import pytest

from batchserve.testing.deployment import Stack
from batchserve.testing.faults import restart_rabbitmq
from tests.chaos.conftest import ECHO, exactly_once, traffic
from tests.support.live import wait_terminal

# The shared RabbitMQ goes down here: nothing else may run meanwhile (`make test` runs this after
# the rest, alone).
pytestmark = pytest.mark.exclusive


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
