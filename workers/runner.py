"""Running one batch: take its lease, run the model, write every result fenced by the attempt.

The same coroutine runs inside a Celery worker process and inside the embedded server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass

from core.broker import RequestQueue
from core.domain import BatchClosed, BatchItem, BatchMessage, BatchOutcome, ItemResult, Timings
from core.errors import Unavailable
from core.events import EventBus
from core.store import BatchStart, ItemOutcome, JobStore, Reaped
from models.base import Backend

log = logging.getLogger("batchserve.worker")


@dataclass(frozen=True, slots=True)
class RunOutput:
    results: list[ItemResult]
    failed_alone: list[tuple[str, str]]  # request id, error
    num_runs: int


def run_isolating(backend: Backend, items: Sequence[BatchItem]) -> RunOutput:
    """Run ``items``; if the batch raises, halve it until each culprit is alone.

    With one culprit among ``n`` items this costs at most ``2*log2(n)`` extra runs, and every
    other item still gets its answer.
    """
    try:
        return RunOutput(list(backend.run(items)), [], 1)
    except Exception as error:  # the model's failure, whatever it is, is isolated not spread
        if len(items) == 1:
            message = f"{type(error).__name__}: {error}"
            log.warning("item_failed_alone request_id=%s error=%s", items[0].request_id, message)
            return RunOutput([], [(items[0].request_id, message)], 1)
        half = len(items) // 2
        left = run_isolating(backend, items[:half])
        right = run_isolating(backend, items[half:])
        return RunOutput(
            left.results + right.results,
            left.failed_alone + right.failed_alone,
            1 + left.num_runs + right.num_runs,
        )


class BatchRunner:
    def __init__(
        self,
        *,
        store: JobStore,
        events: EventBus,
        queue: RequestQueue,
        backend: Backend,
        worker_id: str,
        lease_s: float,
        write_patience_s: float = 30.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._events = events
        self._queue = queue
        self._backend = backend
        self.worker_id = worker_id
        self._lease_s = lease_s
        self._write_patience_s = write_patience_s
        self._clock = clock

    async def run(self, message: BatchMessage) -> None:
        batch_id = uuid.UUID(message.batch_id)
        start = await self._store.start_batch(
            batch_id, self.worker_id, self._clock(), self._lease_s
        )
        if start is None:
            log.info("batch_skipped batch_id=%s (finished, reaped or running elsewhere)", batch_id)
            return
        if isinstance(start, Reaped):
            log.warning(
                "batch_crashed_before batch_id=%s requeued=%d", batch_id, len(start.requeued)
            )
            await self._finish(message, BatchOutcome.CRASHED, start)
            return
        await self._run_started(message, start)

    async def _run_started(self, message: BatchMessage, start: BatchStart) -> None:
        batch_id = uuid.UUID(message.batch_id)
        items = [i for i in message.items if i.request_id in start.live_ids]
        async with self._lease_kept(batch_id, start.attempt):
            model_started = self._clock()
            if items:
                output = await asyncio.to_thread(run_isolating, self._backend, items)
            else:
                output = RunOutput([], [], 0)
            finished = self._clock()
            model_ms = (finished - model_started) * 1000.0
            by_id = {i.request_id: i for i in items}
            outcomes = [
                ItemOutcome(r, _timings(by_id[r.request_id], message, model_ms, finished))
                for r in output.results
            ]
            write = functools.partial(
                self._store.complete_batch,
                batch_id,
                attempt=start.attempt,
                outcomes=outcomes,
                failed_alone=output.failed_alone,
                now=finished,
                model_ms=model_ms,
                prompt_tokens=sum(r.prompt_tokens for r in output.results),
                max_new_tokens=max((int(i.params.get("max_tokens", 0)) for i in items), default=0),
                generated_tokens=sum(r.completion_tokens for r in output.results),
            )
            reaped = await self._write_results(batch_id, write)
        if reaped is None:
            log.warning("batch_result_discarded batch_id=%s (lease lost: stale attempt)", batch_id)
            return
        log.info(
            "batch_done batch_id=%s model=%s size=%d model_ms=%.1f runs=%d failed_alone=%d",
            batch_id,
            message.model,
            len(items),
            model_ms,
            output.num_runs,
            len(output.failed_alone),
        )
        await self._finish(message, BatchOutcome.SUCCEEDED, reaped)

    async def _write_results(
        self, batch_id: uuid.UUID, write: Callable[[], Awaitable[Reaped | None]]
    ) -> Reaped | None:
        """Write the results, retrying while the database is away (a restart takes seconds):
        the model already ran, and its answers are worth the wait. The lease stays renewed
        meanwhile; if it is lost anyway, the write is fenced out and the batch runs again."""
        give_up = time.monotonic() + self._write_patience_s
        delay_s = 0.1
        while True:
            try:
                return await write()
            except Unavailable as error:
                if time.monotonic() > give_up:
                    raise
                log.warning("result_write_retry batch_id=%s error=%s", batch_id, error)
                await asyncio.sleep(delay_s)
                delay_s = min(delay_s * 2, 2.0)

    async def _finish(self, message: BatchMessage, outcome: BatchOutcome, reaped: Reaped) -> None:
        if reaped.requeued:
            try:
                await self._queue.publish(reaped.requeued)
                await self._store.mark_published([m.id for m in reaped.requeued])
            except Unavailable as error:  # maintenance republishes what stays unpublished
                log.warning("requeue_publish_failed batch_id=%s error=%s", message.batch_id, error)
        await self._events.publish(
            BatchClosed(
                model=message.model,
                batch_id=message.batch_id,
                outcome=outcome.value,
                worker=self.worker_id,
            )
        )

    @contextlib.asynccontextmanager
    async def _lease_kept(self, batch_id: uuid.UUID, attempt: int) -> AsyncIterator[None]:
        """Renew the batch's lease while the model runs and its results are written."""
        heartbeat = asyncio.create_task(self._keep_lease(batch_id, attempt))
        try:
            yield
        finally:
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat

    async def _keep_lease(self, batch_id: uuid.UUID, attempt: int) -> None:
        period_s = self._lease_s / 3.0
        while True:
            await asyncio.sleep(period_s)
            try:
                held = await self._store.renew_lease(
                    batch_id, self.worker_id, attempt, self._clock() + self._lease_s
                )
            except Unavailable:
                continue
            if not held:
                log.warning("lease_lost batch_id=%s: results will be discarded", batch_id)
                return


def _timings(item: BatchItem, message: BatchMessage, model_ms: float, finished: float) -> Timings:
    return Timings(
        queued_ms=max(0.0, (item.received_at - item.created_at) * 1000.0),
        batch_wait_ms=max(0.0, (message.dispatched_at - item.received_at) * 1000.0),
        model_ms=model_ms,
        total_ms=max(0.0, (finished - item.created_at) * 1000.0),
    )
