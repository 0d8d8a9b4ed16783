"""A Celery pool process's runtime (``WorkerRuntime``) on the live servers, called as Celery's
task calls it, from a thread of its own: the lease and the results on the runtime's loop, the
model in the calling thread."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from batchserve.core.domain import BatchMessage, RequestState
from batchserve.core.ids import uuid7
from batchserve.core.settings import Settings
from batchserve.core.wiring import connect
from batchserve.models.registry import ModelSpec
from batchserve.workers import runtime as runtime_module
from batchserve.workers.runtime import WorkerRuntime
from batchserve.workers.slot_gate import SlotGate
from tests.support.stepped import submit

ECHO = ModelSpec(name="echo-runtime", backend="fixed", batch_time_ms=20, max_batch_size=4)

pytestmark = pytest.mark.usefixtures("live_servers")


@pytest.mark.parametrize(("write_s", "wait_s"), [(0.05, 5.0), (0.5, 0.05)])
async def test_with_standby_processes_a_task_returns_once_its_results_are_written(
    settings: Settings,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    write_s: float,
    wait_s: float,
) -> None:
    """With two processes a slot, the next batch runs in the other one: the task hands its
    process back to Celery once its batch's results are committed, so that Celery's handling
    of its end does not compete with that write, but never waits past ``WRITE_WAIT_S`` (a
    write that takes longer goes on, and lands, after the task returned)."""
    monkeypatch.setattr(runtime_module, "WRITE_WAIT_S", wait_s)
    adapters = connect(settings, pool_size=1)
    runtime = None
    try:
        now = time.time()
        ids = await submit(adapters.store, ["a", "b"], model=ECHO.name, now=now)
        batch_id = uuid7()
        claimed = await adapters.store.claim_batch(
            batch_id=batch_id,
            model=ECHO.name,
            request_ids=ids,
            now=now,
            estimated_s=0.02,
            lease_until=now + 5.0,
        )
        items = tuple(c.item(now) for c in claimed)
        message = BatchMessage(str(batch_id), ECHO.name, now, 0.02, items)
        gate = SlotGate.create(tmp_path / "gate", 1)
        runtime = await asyncio.to_thread(WorkerRuntime, settings, ECHO, gate)
        complete_batch = runtime.store.complete_batch

        async def slow_write(*args: Any, **kwargs: Any) -> Any:
            await asyncio.sleep(write_s)
            return await complete_batch(*args, **kwargs)

        runtime.store.complete_batch = slow_write  # type: ignore[method-assign]
        began = time.monotonic()
        await asyncio.to_thread(runtime.run, message.as_dict())
        returned_s = time.monotonic() - began
        states = await adapters.store.states_of(ids)  # at once, as the task returns
        if write_s < wait_s:
            assert states == dict.fromkeys(ids, RequestState.SUCCEEDED)
        else:
            assert states == dict.fromkeys(ids, RequestState.RUNNING)
            assert returned_s < write_s
            await asyncio.to_thread(runtime.drain)
            assert await adapters.store.states_of(ids) == dict.fromkeys(ids, RequestState.SUCCEEDED)
    finally:
        if runtime is not None:
            await asyncio.to_thread(runtime.close)
        await adapters.close()
