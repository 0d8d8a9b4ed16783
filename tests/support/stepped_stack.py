"""The whole service in-process on a fake clock: the product's own embedded composition
(``EmbeddedStack``: API, batchers, batch runners, maintenance on the embedded adapters), with
nothing running by itself. A test submits through the real HTTP app (in-process transport),
then moves time: each :meth:`SteppedStack.advance` sets the clock, runs the batchers' due
jobs and decisions and maintenance's tick, and lets every handed-over batch run. The fixed
model takes its batch time on that clock, so timings are exact and nothing sleeps.

What the live tiers check against real processes and real time, this checks deterministically,
and what a role only does on its own schedule (learning, expiry, republishing) shows here or
fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import httpx

from batchserve.api.main import create_app
from batchserve.cli.embedded import EmbeddedStack
from batchserve.core.domain import BatchItem, ItemResult, Lane
from batchserve.core.migrate import upgrade
from batchserve.core.settings import Settings
from batchserve.models.base import OnResult
from batchserve.models.fixed import FixedBackend
from batchserve.workers.dispatch import InProcessDispatcher


class ThreadClock:
    """A fake clock the test moves; a model thread can wait on it."""

    def __init__(self, now: float | None = None) -> None:
        self.now = time.time() if now is None else now
        self.released = False
        self._moved = threading.Condition()

    def __call__(self) -> float:
        return self.now

    def set(self, now: float) -> None:
        with self._moved:
            self.now = max(self.now, now)
            self._moved.notify_all()

    def wait_until(self, at: float) -> None:
        with self._moved:
            while self.now < at and not self.released:
                self._moved.wait(timeout=5.0)

    def release(self) -> None:
        """Let every waiting model thread go (the stack is stopping)."""
        with self._moved:
            self.released = True
            self._moved.notify_all()


class ClockedFixed(FixedBackend):
    """The fixed model, its batch time spent on the fake clock: the model thread waits until
    the test has moved the clock past the batch's end."""

    def __init__(self, clock: ThreadClock, batch_time_s: float) -> None:
        self.batch_time_s = batch_time_s
        self.clock = clock
        self.waiting = 0
        self.ends: list[float] = []  # when each running batch's model ends
        self._lock = threading.Lock()

    def run(
        self, items: Sequence[BatchItem], on_result: OnResult | None = None
    ) -> list[ItemResult]:
        results = [self.answer(item) for item in items]
        end = self.clock() + self.batch_time_s
        with self._lock:
            self.waiting += 1
            self.ends.append(end)
        try:
            self.clock.wait_until(end)
        finally:
            with self._lock:
                self.waiting -= 1
                self.ends.remove(end)
        return results


class SteppedStack:
    """Made by :meth:`create` (the database is migrated first); the API needs no key."""

    @classmethod
    async def create(
        cls,
        home: Path,
        registry: Path,
        *,
        batch_time_s: dict[str, float] | None = None,
        **settings: Any,
    ) -> SteppedStack:
        """``settings``: further :class:`Settings` fields."""
        chosen = Settings(
            home=home,
            database_url=None,
            broker_url=None,
            redis_url=None,
            models=registry,
            auth="disabled",
            **settings,
        )
        await asyncio.to_thread(upgrade, chosen.effective_database_url)
        return cls(chosen, batch_time_s or {})

    def __init__(self, settings: Settings, batch_time_s: dict[str, float]) -> None:
        self.clock = ThreadClock()
        self.settings = settings
        self.stack = EmbeddedStack(self.settings, clock=self.clock)
        self.models: dict[str, ClockedFixed] = {}
        dispatcher = self.stack.dispatcher
        for name, runner in dispatcher.runners.items():
            spec = self.stack.adapters.registry.get(name)
            assert spec is not None and isinstance(runner.backend, FixedBackend)
            seconds = batch_time_s.get(name, spec.batch_time_ms / 1000.0)
            runner.backend = self.models[name] = ClockedFixed(self.clock, seconds)
        self.app = create_app(self.settings, services=self.stack.api)

    @property
    def now(self) -> float:
        return self.clock.now

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[httpx.AsyncClient]:
        await self.stack.start(background=False)
        transport = httpx.ASGITransport(app=self.app)
        try:
            # The in-process transport sends no lifespan events: run the app's own.
            async with (
                self.app.router.lifespan_context(self.app),
                httpx.AsyncClient(transport=transport, base_url="http://stepped") as client,
            ):
                yield client
        finally:
            self.clock.release()
            await self.stack.stop()

    async def submit(self, client: httpx.AsyncClient, text: str, **body: Any) -> str:
        made = await client.post("/v1/requests", json={"input": text, **body})
        assert made.status_code == 202, made.text
        await self.settle()  # through the queue to its batcher
        return str(made.json()["id"])

    async def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds``, stopping at every moment a role has something due
        (a batcher's decision or job, a model's end, maintenance's tick), and run it."""
        until = self.now + seconds
        while True:
            due = await self._step()
            upcoming = [t for t in (due, *self._model_ends()) if t is not None and t > self.now]
            next_at = min([*upcoming, until])
            if next_at > until or self.now >= until:
                break
            self.clock.set(next_at)
            await self.settle()
            if next_at >= until:
                await self._step()
                break

    async def _step(self) -> float | None:
        now = self.now
        due: list[float] = []
        for batcher in self.stack.batchers:
            due.append(await batcher.run_due(now))
            while True:
                when = await batcher.step(now)
                await self.settle()
                if when is None or when > now:
                    break
            if when is not None:
                due.append(when)
        await self.stack.maintenance.tick(now)
        await self.settle()
        return min(due) if due else None

    def _model_ends(self) -> list[float]:
        return [end for model in self.models.values() for end in model.ends]

    async def settle(self, timeout_s: float = 10.0) -> None:
        """Until nothing moves without the clock: the queues delivered, every batch either
        through or in its model waiting for the clock."""
        dispatcher = self.stack.dispatcher
        assert isinstance(dispatcher, InProcessDispatcher)
        queue = self.stack.adapters.queue
        give_up = time.monotonic() + timeout_s
        quiet = 0
        while quiet < 3:
            waiting = sum(m.waiting for m in self.models.values())
            depths = [
                await queue.depth(name, lane)
                for name in self.stack.adapters.registry.names()
                for lane in Lane
            ]
            held = waiting + dispatcher.waiting_for_slot
            # A batch whose end the clock has passed is not waiting for the clock: its model
            # thread has yet to wake (on a busy machine settle could end before it did, and the
            # next batch then left a step late).
            ended = any(end <= self.now for end in self._model_ends())
            busy = dispatcher.in_flight > held or any(depths) or ended
            quiet = 0 if busy else quiet + 1
            assert time.monotonic() < give_up, "the stepped stack did not settle"
            await asyncio.sleep(0.002 if busy else 0)
