"""A worker writes a batch's results, then tells the batcher its slot is free: the callers'
answers do not share the cores with the work the announcement sets off in the batcher (its
next claim, the joiners it settles), and a write that fails still frees the slot."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from typing import Any

import pytest

from batchserve.core.domain import BatchClosed, BatchItem, BatchMessage, Event, ItemResult
from batchserve.core.events import MemoryEventBus
from batchserve.core.store import BatchStart, Reaped
from batchserve.models.base import Backend, OnResult
from batchserve.workers.runner import BatchRunner


class _Echo(Backend):
    def run(self, items: Any, on_result: OnResult | None = None) -> list[ItemResult]:
        return [ItemResult(i.request_id, output="out", finish_reason="stop") for i in items]


class _SlowResults:
    """A store whose results write holds until the test lets it finish."""

    def __init__(self, live: frozenset[str]) -> None:
        self.live = live
        self.writing = asyncio.Event()
        self.finish = asyncio.Event()
        self.written = False
        self.fails = False
        self.renewals = 0

    async def start_batch(self, *_: Any) -> BatchStart:
        return BatchStart(attempt=1, live_ids=self.live)

    async def renew_lease(self, *_: Any) -> bool:
        self.renewals += 1
        return not self.written  # the write ends the batch: its lease is gone with it

    async def ended_by(self, *_: Any) -> bool:
        return self.written

    async def complete_batch(self, *_: Any, **__: Any) -> Reaped:
        self.writing.set()
        await self.finish.wait()
        if self.fails:
            raise RuntimeError("the write failed")
        self.written = True
        return Reaped()


class _HeldBus(MemoryEventBus):
    """An event bus whose publishing of ``BatchClosed`` holds until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.publishing = asyncio.Event()
        self.release = asyncio.Event()
        self.closed: list[BatchClosed] = []

    async def publish(self, event: Event) -> None:
        if isinstance(event, BatchClosed):
            self.publishing.set()
            await self.release.wait()
            self.closed.append(event)
        await super().publish(event)


def rig(
    fails: bool = False, lease_s: float = 2.0
) -> tuple[BatchMessage, _SlowResults, _HeldBus, BatchRunner]:
    items = tuple(
        BatchItem(str(uuid.uuid4()), "hi", None, {"max_tokens": 4}, 1.0, 1.0) for _ in range(3)
    )
    message = BatchMessage(str(uuid.uuid4()), "m", 1.0, 0.1, items)
    store = _SlowResults(frozenset(i.request_id for i in items))
    store.fails = fails
    events = _HeldBus()
    events.release.set()
    runner = BatchRunner(
        store=store,  # type: ignore[arg-type]
        events=events,
        queue=None,  # type: ignore[arg-type]  # nothing is requeued
        backend=_Echo(),
        worker_id="w",
        lease_s=lease_s,
    )
    return message, store, events, runner


async def test_the_slot_is_announced_once_the_results_are_written() -> None:
    message, store, events, runner = rig()
    running = asyncio.create_task(runner.run(message))
    await asyncio.wait_for(store.writing.wait(), 5.0)
    await asyncio.sleep(0.01)
    assert not events.publishing.is_set()  # the batcher hears nothing while the write runs
    store.finish.set()
    await asyncio.wait_for(running, 5.0)
    assert store.written
    assert [(c.batch_id, c.outcome) for c in events.closed] == [(message.batch_id, "succeeded")]


async def test_a_write_that_fails_still_frees_the_slot() -> None:
    message, store, events, runner = rig(fails=True)
    running = asyncio.create_task(runner.run(message))
    await asyncio.wait_for(store.writing.wait(), 5.0)
    store.finish.set()
    with contextlib.suppress(RuntimeError):
        await asyncio.wait_for(running, 5.0)
    assert not store.written
    assert [c.batch_id for c in events.closed] == [message.batch_id]


async def test_a_renewal_after_the_results_were_written_is_no_lost_lease(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The lease is renewed until the batch is through; a renewal that runs once the results
    are written finds it gone, as after a reap. That is no "lease_lost" (whose note says the
    results will be discarded): they were stored."""
    from batchserve.workers import runner as runner_module

    warned: list[str] = []
    monkeypatch.setattr(
        runner_module.log, "warning", lambda event, **_: warned.append(event), raising=False
    )
    message, store, events, runner = rig(lease_s=0.03)  # renewed every 10 ms
    events.release.clear()  # the announcement, after the write, waits
    running = asyncio.create_task(runner.run(message))
    await asyncio.wait_for(store.writing.wait(), 5.0)
    store.finish.set()
    await asyncio.wait_for(events.publishing.wait(), 5.0)
    renewed = store.renewals
    await asyncio.sleep(0.05)  # renewals after the write
    events.release.set()
    await asyncio.wait_for(running, 5.0)
    assert store.written and store.renewals > renewed  # the lease found gone, after the write
    assert warned == []
