"""Handing batches to workers: through Celery, or in-process for the embedded mode."""

from __future__ import annotations

import asyncio
import contextlib
import time

import aio_pika
from celery import Celery
from kombu.serialization import dumps

from batchserve.core.broker import RabbitRequestQueue
from batchserve.core.domain import BatchMessage
from batchserve.core.logs import get_logger
from batchserve.core.settings import Settings
from batchserve.workers.celery_app import RUN_BATCH_TASK, batches_queue_name
from batchserve.workers.engine_runner import EngineRunner
from batchserve.workers.runner import BatchRunner

log = get_logger("batchserve.dispatch")


class CeleryDispatcher:
    """Sends the batch task as Celery's ``send_task`` would (Celery builds the message and
    serializes it), but on the batcher's own loop, through the confirmed channel its request
    queue publishes on: no thread to hand each batch to, no kombu connection beside it. A
    failure is :class:`Unavailable` (the batcher puts the batch's members back)."""

    def __init__(self, app: Celery, settings: Settings, broker: RabbitRequestQueue) -> None:
        self._app = app
        self._settings = settings
        self._broker = broker

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        task = self._app.amqp.as_task_v2(
            message.batch_id,
            RUN_BATCH_TASK,
            args=[message.as_dict()],
            time_limit=time_limit_s,
            argsrepr=f"batch of {len(message.items)}",  # not a repr of every member's input
            ignore_result=None,  # as send_task leaves it: the worker's setting decides
        )
        content_type, encoding, body = dumps(task.body, serializer=self._app.conf.task_serializer)
        await self._broker.send(
            batches_queue_name(self._settings, message.model),
            aio_pika.Message(
                body.encode(encoding) if isinstance(body, str) else body,
                headers=task.headers,
                content_type=content_type,
                content_encoding=encoding,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                correlation_id=task.properties["correlation_id"],
            ),
        )


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
