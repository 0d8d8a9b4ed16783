"""Handing batches to workers: through Celery, or in-process for the embedded mode."""

from __future__ import annotations

import asyncio
import contextlib
import time
from concurrent.futures import ThreadPoolExecutor

from celery import Celery
from kombu.exceptions import KombuError

from batchserve.core.domain import BatchMessage
from batchserve.core.errors import Unavailable
from batchserve.core.logs import get_logger
from batchserve.core.settings import Settings
from batchserve.workers.celery_app import RUN_BATCH_TASK, batches_queue
from batchserve.workers.engine_runner import EngineRunner
from batchserve.workers.runner import BatchRunner

log = get_logger("batchserve.dispatch")


class CeleryDispatcher:
    """Sends the batch task with a publisher confirm; kombu blocks, so a thread does it."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self._app = app
        self._settings = settings
        # One thread: kombu's producer pool is used serially, and batches go in order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dispatch")

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._send, message, time_limit_s)
        except (KombuError, OSError, ConnectionError) as error:
            message_text = f"could not hand the batch to a worker: {error}"
            raise Unavailable(message_text, component="broker") from error

    def _send(self, message: BatchMessage, time_limit_s: float | None) -> None:
        self._app.send_task(
            RUN_BATCH_TASK,
            args=[message.as_dict()],
            queue=batches_queue(self._settings, message.model),
            time_limit=time_limit_s,
            task_id=message.batch_id,
        )

    def close(self) -> None:
        self._executor.shutdown(wait=False)


class _SlotGate:
    """At most ``slots`` models of one model name run at once; counts who waits. Entering
    tells how early the batch came, as the worker's ``SlotGate`` does: seconds it waited
    (positive), or minus the seconds since a slot was last given back (late)."""

    def __init__(self, slots: int) -> None:
        self._free = asyncio.Semaphore(slots)
        self.waiting = 0
        self._released_at: float | None = None

    async def __aenter__(self) -> float | None:
        asked = time.monotonic()
        waited = self._free.locked()
        self.waiting += 1
        try:
            await self._free.acquire()
        finally:
            self.waiting -= 1
        now = time.monotonic()
        if waited:
            return now - asked
        return None if self._released_at is None else min(0.0, self._released_at - now)

    async def __aexit__(self, *_: object) -> None:
        self._released_at = time.monotonic()
        self._free.release()


class InProcessDispatcher:
    """The embedded mode's worker pool: each batch runs as a task of this event loop, or goes
    into the model's engine."""

    def __init__(
        self,
        runners: dict[str, BatchRunner],
        engines: dict[str, EngineRunner] | None = None,
        slots: dict[str, int] | None = None,
    ) -> None:
        self._runners = runners
        self._engines = engines or {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._busy: dict[str, set[int]] = {model: set() for model in runners}
        # The batcher sends a slot its next batch just before the running one ends; as a
        # worker's standby process does, it takes its lease then and waits here for the model.
        self._gates = {model: _SlotGate((slots or {}).get(model, 1)) for model in runners}

    @property
    def runners(self) -> dict[str, BatchRunner]:
        return self._runners

    @property
    def in_flight(self) -> int:
        """Batches handed over and not yet through (run and stored)."""
        return len(self._tasks)

    @property
    def waiting_for_slot(self) -> int:
        """Batches leased and waiting for their slot's running model to finish."""
        return sum(gate.waiting for gate in self._gates.values())

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        engine = self._engines.get(message.model)
        if engine is not None:
            await engine.accept(message)
            return
        # Each running batch has a slot number of its own, so that every worker id (model and
        # slot) runs one batch at a time, as a Celery pool process does.
        busy = self._busy[message.model]
        slot = next(n for n in range(len(busy) + 1) if n not in busy)
        busy.add(slot)
        task = asyncio.create_task(self._run(message, slot))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _run(self, message: BatchMessage, slot: int) -> None:
        try:
            runner = self._runners[message.model]
            await runner.run(message, slot=slot, gate=self._gates[message.model])
        except Exception:
            log.exception("batch_failed", batch_id=message.batch_id)
        finally:
            self._busy[message.model].discard(slot)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
