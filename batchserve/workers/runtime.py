"""Per-process worker state: an event loop, the adapters every role connects (store, event bus,
queue, token log: ``batchserve/core/wiring.py``) and the loaded model.

Built once in each worker process (after the fork, so no connection is shared across
processes) and reused by every batch that process runs. The event loop runs in a thread of its
own: a Celery task returns as soon as its model is through, so the pool hands the process its
next batch at once, while the loop goes on writing the results of the last one. With standby
processes (two a slot) the next batch runs in the other process: a task then returns once its
results are written, or ``WRITE_WAIT_S`` passed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import socket
import threading
from typing import Any

from batchserve.core.domain import BatchMessage
from batchserve.core.logs import bind, get_logger
from batchserve.core.loops import new_event_loop
from batchserve.core.settings import Settings
from batchserve.core.wiring import Adapters, connect
from batchserve.models.loader import load_backend
from batchserve.models.registry import ModelSpec
from batchserve.workers.runner import BatchRunner
from batchserve.workers.slot_gate import SlotGate

log = get_logger("batchserve.worker")

# With standby processes, how long a task waits for its batch's results to be written before
# it returns (the write goes on after that; ``drain`` waits for it at exit).
WRITE_WAIT_S = 0.05


def worker_id(model: str) -> str:
    return f"{model}@{socket.gethostname()}:{os.getpid()}"


class WorkerRuntime:
    def __init__(self, settings: Settings, spec: ModelSpec, gate: SlotGate | None = None) -> None:
        assert settings.redis_url and settings.broker_url
        self.gate = gate
        self.loop = new_event_loop()
        self._thread = threading.Thread(
            target=self.loop.run_forever, name="worker-loop", daemon=True
        )
        self._thread.start()
        self._pending: set[concurrent.futures.Future[None]] = set()
        # The same wiring as every other role, built on this process's loop.
        self.adapters: Adapters = asyncio.run_coroutine_threadsafe(
            _connect(settings), self.loop
        ).result()
        self.store, self.events = self.adapters.store, self.adapters.events
        self.queue, self.tokens = self.adapters.queue, self.adapters.tokens
        self.backend = load_backend(spec)
        self.runner = BatchRunner(
            store=self.store,
            events=self.events,
            queue=self.queue,
            backend=self.backend,
            worker_id=worker_id(spec.name),
            lease_s=settings.lease_s,
            tokens=self.tokens,
            joins=self.adapters.joins,
        )
        log.info("worker_process_ready", model=spec.name)

    def run(self, payload: dict[str, Any]) -> None:
        """Take the lease (on the loop), run the model in this, the Celery task's, thread and
        return once it is through: the loop writes the results while the next batch runs
        (with standby processes, in the other process: then once they are written, or
        ``WRITE_WAIT_S`` passed)."""
        message = BatchMessage.from_dict(payload)
        # The coroutines handed to the loop copy this thread's context: their logs carry these.
        with bind(batch_id=message.batch_id, model=message.model):
            opening = asyncio.run_coroutine_threadsafe(self.runner.open(message), self.loop)
            batch = opening.result()
            if batch.isolating:
                # A suspect of crashing this process: let the results of the batches before
                # it land first, so a crash costs no innocent batch its finished work.
                self.drain()
            output, early_s = None, None
            if batch.ours and self.gate is not None:
                # With standby processes the lease was taken while the slot's other process
                # still ran its model: wait here for it to finish.
                with self.gate.turn() as turn:
                    early_s = turn.early_s
                    batch.take_joiners_blocking()
                    output = batch.run_model()
            elif batch.ours:
                batch.take_joiners_blocking()
                output = batch.run_model()
            future = asyncio.run_coroutine_threadsafe(
                batch.conclude(output, early_s=early_s), self.loop
            )
        self._pending.add(future)
        future.add_done_callback(self._finished)
        if self.gate is not None:
            # The slot's next batch runs in the other process: hand the task back once the
            # results are written (or WRITE_WAIT_S passed), so that Celery's handling of its
            # end does not compete with the write and the next model's start for the cores.
            concurrent.futures.wait([future], timeout=WRITE_WAIT_S)

    def _finished(self, future: concurrent.futures.Future[None]) -> None:
        self._pending.discard(future)
        if not future.cancelled() and (error := future.exception()) is not None:
            log.error(
                "batch_write_failed", error=error, note="the lease will run out; it runs again"
            )

    def drain(self, timeout_s: float = 30.0) -> None:
        """Let the results still being written land before the process exits."""
        concurrent.futures.wait(list(self._pending), timeout=timeout_s)
        flushing = asyncio.run_coroutine_threadsafe(self.tokens.flush(), self.loop)
        with contextlib.suppress(Exception):
            flushing.result(timeout=2.0)

    def close(self, timeout_s: float = 10.0) -> None:
        """Drain, close the connections and stop the loop's thread."""
        self.drain()
        closing = asyncio.run_coroutine_threadsafe(self._close(), self.loop)
        with contextlib.suppress(Exception):
            closing.result(timeout=timeout_s)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=timeout_s)
        if not self._thread.is_alive():
            self.loop.close()

    async def _close(self) -> None:
        await self.runner.close()
        await self.adapters.close()


async def _connect(settings: Settings) -> Adapters:
    return connect(settings, pool_size=2)


class RuntimeHolder:
    """Where the worker command leaves its settings for the pool processes it forks."""

    settings: Settings | None = None
    spec: ModelSpec | None = None
    gate: SlotGate | None = None
    runtime: WorkerRuntime | None = None

    @classmethod
    def get(cls) -> WorkerRuntime:
        if cls.runtime is None:
            assert cls.settings is not None and cls.spec is not None, "worker not configured"
            cls.runtime = WorkerRuntime(cls.settings, cls.spec, cls.gate)
        return cls.runtime
