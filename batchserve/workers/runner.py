"""Running one batch: take its lease, run the model, write every result fenced by the attempt.

The same coroutine runs inside a Celery worker process and inside the embedded server.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
import uuid
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

from batchserve.core.broker import RequestQueue
from batchserve.core.clock import deployment_time
from batchserve.core.domain import (
    BatchClosed,
    BatchItem,
    BatchMessage,
    BatchOutcome,
    Event,
    ItemResult,
    RequestState,
    StateChange,
    Timings,
)
from batchserve.core.errors import Unavailable
from batchserve.core.events import CANCELS, EventBus, Subscription
from batchserve.core.joins import JoinBox
from batchserve.core.logs import annotate, bind, get_logger
from batchserve.core.metrics import metrics
from batchserve.core.republish import republish
from batchserve.core.store import BatchStart, ItemOutcome, JobStore, Reaped
from batchserve.core.tokenlog import LogEntry, TokenLog
from batchserve.models.base import Backend, OnResult

log = get_logger("batchserve.worker")

T = TypeVar("T")

# A batch's late joiners are claimed this long after its model starts (at most this share of
# the batch's estimated time): the claim only has to commit before the batch's results are
# written, and as the model starts, the slot's batch before it is writing its results and
# its callers are being answered, on the same cores (docs/frontdoor.md: "The late joiners'
# claim waits out the answers of the batch before").
JOIN_CLAIM_DELAY_S = 0.01
JOIN_CLAIM_DELAY_SHARE = 0.25


@dataclass(frozen=True, slots=True)
class RunOutput:
    results: list[ItemResult]
    failed_alone: list[tuple[str, str]]  # request id, error
    num_runs: int


def run_isolating(
    backend: Backend, items: Sequence[BatchItem], on_result: OnResult | None = None
) -> RunOutput:
    """Run ``items``; if the batch raises, halve it until each culprit is alone.

    With one culprit among ``n`` items this costs at most ``2*log2(n)`` extra runs, and every
    other item still gets its answer.
    """
    try:
        return RunOutput(list(backend.run(items, on_result)), [], 1)
    except Exception as error:  # the model's failure, whatever it is, is isolated not spread
        if len(items) == 1:
            message = f"{type(error).__name__}: {error}"
            log.warning("item_failed_alone", request_id=items[0].request_id, error=message)
            return RunOutput([], [(items[0].request_id, message)], 1)
        half = len(items) // 2
        left = run_isolating(backend, items[:half], on_result)
        right = run_isolating(backend, items[half:], on_result)
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
        clock: Callable[[], float] = deployment_time,
        tokens: TokenLog | None = None,
        joins: JoinBox | None = None,
    ) -> None:
        self.store = store
        self.joins = joins
        self._tokens = tokens
        self._events = events
        self._queue = queue
        self.backend = backend
        self.worker_id = worker_id
        self._lease_s = lease_s
        self._write_patience_s = write_patience_s
        self.clock = clock
        self._cancelled: dict[str, float] = {}  # request id -> when we heard
        self._subscription: Subscription | None = None

    def _watch_cancellations(self) -> None:
        """Let the model stop generating for a request cancelled while its batch runs."""
        if self._subscription is None:
            self._subscription = self._events.subscribe(self._on_event, topics=(CANCELS,))
            self.backend.should_stop = self._cancelled.__contains__

    async def close(self) -> None:
        """Stop hearing cancellations."""
        if self._subscription is not None:
            await self._subscription.close()
            self._subscription = None

    def _on_event(self, event: Event) -> None:
        if isinstance(event, StateChange) and event.state is RequestState.CANCELLED:
            now = self.clock()
            for request_id in event.request_ids:
                self._cancelled[request_id] = now
            if len(self._cancelled) > 10_000:  # forget the old ones: their batches are long done
                horizon = now - 600.0
                self._cancelled = {r: t for r, t in self._cancelled.items() if t > horizon}
                self.backend.should_stop = self._cancelled.__contains__

    async def run(
        self,
        message: BatchMessage,
        model_done: Callable[[], None] | None = None,
        *,
        slot: int | None = None,
        gate: contextlib.AbstractAsyncContextManager[float | None] | None = None,
    ) -> None:
        """Run one batch and store its results (everything on this event loop). ``slot``: which
        of this runner's concurrent slots runs it, where it has several (the embedded mode);
        ``gate``: held while the model runs, so that a batch sent ahead of its slot's end takes
        its lease at once but starts its model only when the slot's running one is through."""
        with bind(batch_id=message.batch_id, model=message.model):
            batch = await self.open(message, slot=slot)
            early_s = None
            try:
                async with gate if gate is not None else contextlib.nullcontext() as early_s:
                    await batch.take_joiners()
                    output = await asyncio.to_thread(batch.run_model) if batch.ours else None
            finally:
                if model_done is not None:
                    model_done()
            await batch.conclude(output, early_s=early_s)

    async def open(self, message: BatchMessage, *, slot: int | None = None) -> OpenBatch:
        """Take the batch's lease. The model must not start before: a worker that dies running
        it is then known to have started it, and the batch is halved rather than resent whole.
        Then run the model in any thread (:meth:`OpenBatch.run_model`) and let
        :meth:`OpenBatch.conclude` store what it made, on this loop."""
        self._watch_cancellations()
        worker = self.worker_id if slot is None else f"{self.worker_id}#{slot}"
        batch = OpenBatch(self, message, worker)
        await batch.started()
        return batch

    async def claim_lease(self, batch_id: uuid.UUID, worker: str) -> BatchStart | Reaped | None:
        async def attempt() -> BatchStart | Reaped | None:
            return await self.store.start_batch(batch_id, worker, self.clock(), self._lease_s)

        return await self._with_patience(batch_id, attempt)

    async def hold_lease(
        self, batch_id: uuid.UUID, worker: str, starting: asyncio.Task[BatchStart | Reaped | None]
    ) -> None:
        """Once the lease is ours, renew it until the batch's results are stored."""
        start = await starting
        if isinstance(start, BatchStart):
            await self._keep_lease(batch_id, worker, start.attempt)

    async def store_results(
        self,
        message: BatchMessage,
        start: BatchStart,
        output: RunOutput,
        model_started: float,
        finished: float,
        written_early: Collection[str] = (),
        streamed: Collection[str] = (),
    ) -> None:
        batch_id = uuid.UUID(message.batch_id)
        items = [i for i in message.items if i.request_id in start.live_ids]
        model_ms = (finished - model_started) * 1000.0
        by_id = {i.request_id: i for i in items}
        outcomes = [
            ItemOutcome(r, item_timings(by_id[r.request_id], message, model_ms, finished, finished))
            for r in output.results
            if r.request_id in by_id
        ]
        results = [o.result for o in outcomes]
        self.stream_outputs(message.batch_id, [r for r in results if r.request_id not in streamed])
        write = functools.partial(
            self.store.complete_batch,
            batch_id,
            attempt=start.attempt,
            outcomes=outcomes,
            failed_alone=[f for f in output.failed_alone if f[0] in by_id],
            now=finished,
            model_ms=model_ms,
            prompt_tokens=sum(r.prompt_tokens for r in results),
            max_new_tokens=max((int(i.params.get("max_tokens", 0)) for i in items), default=0),
            generated_tokens=sum(r.completion_tokens for r in results),
        )
        reaped = await self._with_patience(batch_id, write)
        if reaped is None:
            log.warning(
                "batch_result_discarded", batch_id=batch_id, note="lease lost: stale attempt"
            )
            metrics().batches_finished.labels(message.model, "stale").inc()
            return
        found = metrics()
        found.batches_finished.labels(message.model, "succeeded").inc()
        found.model_time.labels(message.model).observe(model_ms / 1000.0)
        found.results_store.labels(message.model).observe(max(0.0, self.clock() - finished))
        observe_latency(
            message.model, [o for o in outcomes if o.result.request_id not in written_early]
        )
        log.info(
            "batch_done",
            batch_id=batch_id,
            model=message.model,
            attempt=start.attempt,
            size=len(items),
            model_ms=round(model_ms, 1),
            runs=output.num_runs,
            failed_alone=len(output.failed_alone),
        )
        await self.republish(message, reaped)

    def stream_outputs(self, batch_id: str, results: Sequence[ItemResult]) -> None:
        """A batch model makes each answer at once: its stream gets it as one delta, just
        before the result is stored (a stale attempt's is superseded by the next run's). Only
        to a log its start made: without one, the stream's end brings the stored answer."""
        if self._tokens is None:
            return
        self._tokens.append(
            [(r.request_id, LogEntry.delta(batch_id, r.output)) for r in results if r.output],
            create=False,
        )

    async def _with_patience(self, batch_id: uuid.UUID, write: Callable[[], Awaitable[T]]) -> T:
        return await with_patience(batch_id, write, self._write_patience_s)

    async def republish(self, message: BatchMessage, reaped: Reaped) -> None:
        """Put requests a reap or a retry sent back to the queue on the broker."""
        await republish(self._queue, self.store, reaped.requeued, batch_id=message.batch_id)

    async def announce(
        self,
        message: BatchMessage,
        outcome: BatchOutcome,
        worker: str,
        early_s: float | None = None,
    ) -> None:
        """Tell the batcher the slot is free (it may already have sent the next batch), and
        how early this batch came to it."""
        await self._events.publish(
            BatchClosed(
                model=message.model,
                batch_id=message.batch_id,
                outcome=outcome.value,
                worker=worker,
                early_s=early_s,
            )
        )

    async def _keep_lease(self, batch_id: uuid.UUID, worker: str, attempt: int) -> None:
        period_s = self._lease_s / 3.0
        while True:
            await asyncio.sleep(period_s)
            try:
                held = await self.store.renew_lease(
                    batch_id, worker, attempt, self.clock() + self._lease_s
                )
            except Unavailable:
                continue
            if not held:
                # The results' write may have ended the batch as this renewal ran.
                with contextlib.suppress(Unavailable):
                    if await self.store.ended_by(batch_id, attempt):
                        return
                log.warning("lease_lost", batch_id=batch_id, note="results will be discarded")
                return


async def with_patience(
    batch_id: uuid.UUID, write: Callable[[], Awaitable[T]], patience_s: float
) -> T:
    """Retry while the database is away (a restart takes seconds): the model ran, and its
    answers are worth the wait. The lease stays renewed meanwhile; if it is lost anyway, the
    write is fenced out and the batch runs again."""
    give_up = time.monotonic() + patience_s
    delay_s = 0.1
    while True:
        try:
            return await write()
        except Unavailable as error:
            if time.monotonic() > give_up:
                raise
            log.warning("result_write_retry", batch_id=batch_id, error=error)
            await asyncio.sleep(delay_s)
            delay_s = min(delay_s * 2, 2.0)


def observe_latency(model: str, outcomes: Sequence[ItemOutcome]) -> None:
    """End-to-end latency of each request whose result this write stored, and (answers only)
    its time to first token."""
    found = metrics()
    latency, ttft = found.latency.labels(model), found.ttft.labels(model)
    for outcome in outcomes:
        latency.observe(outcome.timings.total_ms / 1000.0)
        if outcome.result.ok and outcome.timings.ttft_ms is not None:
            ttft.observe(outcome.timings.ttft_ms / 1000.0)


def item_timings(
    item: BatchItem,
    message: BatchMessage,
    model_ms: float,
    finished: float,
    first_token_at: float | None = None,
) -> Timings:
    ttft_ms = None
    if first_token_at is not None:
        ttft_ms = max(0.0, (first_token_at - item.created_at) * 1000.0)
    return Timings(
        queued_ms=max(0.0, (item.received_at - item.created_at) * 1000.0),
        batch_wait_ms=max(0.0, (message.dispatched_at - item.received_at) * 1000.0),
        model_ms=model_ms,
        total_ms=max(0.0, (finished - item.created_at) * 1000.0),
        ttft_ms=ttft_ms,
    )


class OpenBatch:
    """A batch whose model may run while its lease is being taken, on this worker."""

    def __init__(self, runner: BatchRunner, message: BatchMessage, worker: str) -> None:
        self.runner = runner
        self.message = message
        self.batch_id = uuid.UUID(message.batch_id)
        self.worker = worker
        self.starting = asyncio.create_task(runner.claim_lease(self.batch_id, worker))
        self._holding = asyncio.create_task(runner.hold_lease(self.batch_id, worker, self.starting))
        self.model_started = runner.clock()
        self.model_ended: float | None = None
        self.early = _EarlyResults(runner, message, self.starting, self.model_started, self)
        self.ours = False
        self.isolating = False
        self.joined: frozenset[str] = frozenset()  # late joiners claimed into it here
        self._claiming: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()

    async def started(self) -> None:
        start = await self.starting
        self.ours = isinstance(start, BatchStart)
        self.isolating = isinstance(start, BatchStart) and start.isolating

    def _may_take_joiners(self) -> bool:
        return (
            self.runner.joins is not None
            and self.message.joinable
            and self.ours
            and not self.isolating
        )

    async def take_joiners(self) -> None:
        """As the model is about to start: seal the batch's join box and take what the
        batcher offered it meanwhile (``batchserve/core/joins.py``), to run with the rest at
        once, while they are claimed into the batch; only the answers of those claimed are
        kept (:meth:`conclude` waits for the claim). What is not claimed stays queued, and the
        batcher batches it again."""
        if not self._may_take_joiners():
            return
        start = await self.starting
        assert isinstance(start, BatchStart) and self.runner.joins is not None
        try:
            offered = await self.runner.joins.take(self.batch_id)
        except Exception as error:  # never sealed: whatever comes is left to the batcher
            log.warning("joiners_not_taken", batch_id=self.batch_id, error=error)
            return
        if offered:
            items = tuple(offered)
            self._let_in(items)
            self._start_claim(start.attempt, items)

    def take_joiners_blocking(self) -> None:
        """:meth:`take_joiners` from the thread that runs the model (a Celery pool process's),
        once :meth:`started`: the slot stands idle until the model starts, and a hop to this
        process's event loop and back cost more than the seal itself. The claim runs on the
        loop, started before anything the loop is handed after this returns (the early
        results, :meth:`conclude`)."""
        if not self._may_take_joiners():
            return
        start = self.starting.result()  # done: ``started`` awaited it
        assert isinstance(start, BatchStart) and self.runner.joins is not None
        try:
            offered = self.runner.joins.take_blocking(self.batch_id)
        except Exception as error:  # never sealed: whatever comes is left to the batcher
            log.warning("joiners_not_taken", batch_id=self.batch_id, error=error)
            return
        if offered:
            items = tuple(offered)
            self._let_in(items)
            self._loop.call_soon_threadsafe(self._start_claim, start.attempt, items)

    def _let_in(self, items: tuple[BatchItem, ...]) -> None:
        """The offered joiners run with the batch (their answers kept once claimed)."""
        self.message = replace(self.message, items=self.message.items + items)
        self.early.join(self.message, items)

    def _start_claim(self, attempt: int, items: tuple[BatchItem, ...]) -> None:
        self._claiming = asyncio.create_task(self._claim_joiners(attempt, items))

    def claim_delay_s(self) -> float:
        """How long after the seal the joiners' claim begins (:data:`JOIN_CLAIM_DELAY_S`)."""
        return min(JOIN_CLAIM_DELAY_S, self.message.estimated_s * JOIN_CLAIM_DELAY_SHARE)

    async def _claim_joiners(self, attempt: int, items: tuple[BatchItem, ...]) -> None:
        runner, ids = self.runner, [i.request_id for i in items]
        await asyncio.sleep(self.claim_delay_s())
        try:
            claimed = await runner.store.join_batch(
                self.batch_id, attempt=attempt, model=self.message.model, request_ids=ids
            )
        except Exception as error:
            # The claim may have committed: keep what runs under the batch now, or nothing
            # written would ever close those (a failure here leaves the lease to run out).
            log.warning("join_unsure", batch_id=self.batch_id, error=error)
            claimed = await runner._with_patience(
                self.batch_id, functools.partial(runner.store.joined_members, self.batch_id, ids)
            )
        self.joined = frozenset(c.id for c in claimed)
        metrics().batch_joiners.labels(self.message.model).inc(len(self.joined))
        log.info("batch_joined", batch_id=self.batch_id, offered=len(ids), joined=len(claimed))

    async def joiners_claimed(self) -> frozenset[str]:
        """The late joiners claimed into the batch (after the claim, if one is under way)."""
        if self._claiming is not None:
            await self._claiming
        return self.joined

    def run_model(self) -> RunOutput:
        """Blocking: run the model over the batch (results of early finishers go out first)."""
        self.model_started = self.runner.clock()
        try:
            return run_isolating(
                self.runner.backend, list(self.message.items), self.early.hand_over
            )
        finally:
            self.model_ended = self.runner.clock()

    async def conclude(self, output: RunOutput | None, *, early_s: float | None = None) -> None:
        """Announce the free slot and store the results (``None``: the model did not run);
        ``early_s``: how early the batch came to its slot (``SlotGate.Turn``)."""
        runner, message = self.runner, self.message
        # The model's end, not this coroutine's start: a pool process hands it to its loop.
        finished = self.model_ended if self.model_ended is not None else runner.clock()
        try:
            start = await self.starting
            await self.early.close()
            if start is None:
                log.info(
                    "batch_skipped", batch_id=self.batch_id, note="finished, reaped or elsewhere"
                )
                return
            if isinstance(start, Reaped):
                log.warning(
                    "batch_crashed_before", batch_id=self.batch_id, requeued=len(start.requeued)
                )
                metrics().batches_finished.labels(message.model, "crashed").inc()
                await runner.announce(message, BatchOutcome.CRASHED, self.worker)
                await runner.republish(message, start)
                return
            assert output is not None
            annotate(attempt=start.attempt)
            if joined := await self.joiners_claimed():
                start = replace(start, live_ids=start.live_ids | joined)
            # The callers' answers first: the announcement sets the batcher to work (its
            # next claim, the joiners it settles) on the same cores as this write, while a
            # batch sent ahead to this slot starts without it.
            try:
                await runner.store_results(
                    message,
                    start,
                    output,
                    self.model_started,
                    finished,
                    self.early.written,
                    self.early.streamed,
                )
            finally:
                await runner.announce(message, BatchOutcome.SUCCEEDED, self.worker, early_s)
        finally:
            self._holding.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # start's own error
                await self._holding  # surfaced above, through ``starting``
            if not self.starting.done():
                self.starting.cancel()


class _EarlyResults:
    """Writes the results of members that finish before the rest of their batch.

    The model thread hands each over as it is final; a task on the event loop writes them in
    small groups, fenced like the batch's own write. A member written early is skipped by the
    batch's final write (it is no longer running).
    """

    def __init__(
        self,
        runner: BatchRunner,
        message: BatchMessage,
        starting: asyncio.Task[BatchStart | Reaped | None],
        model_started: float,
        batch: OpenBatch,
    ) -> None:
        self._batch = batch
        self._runner = runner
        self._message = message
        self._starting = starting
        self._model_started = model_started
        self._items = {i.request_id: i for i in message.items}
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[ItemResult | None] = asyncio.Queue()
        self.written: set[str] = set()
        self.streamed: set[str] = set()  # whose answer went to the token log
        self._task = asyncio.create_task(self._write_forever())

    def join(self, message: BatchMessage, items: Sequence[BatchItem]) -> None:
        """Late joiners taken as the model starts (their answers are kept once claimed)."""
        self._message = message
        self._items.update((i.request_id, i) for i in items)

    def hand_over(self, result: ItemResult) -> None:
        """Called from the model's thread."""
        self._loop.call_soon_threadsafe(self._queue.put_nowait, result)

    async def close(self) -> None:
        self._queue.put_nowait(None)
        await self._task

    async def _write_forever(self) -> None:
        done = False
        while not done:
            group: list[ItemResult] = []
            item = await self._queue.get()
            while item is not None:
                group.append(item)
                if self._queue.empty():
                    break
                item = self._queue.get_nowait()
            done = item is None
            if group:
                await self._write(group)

    async def _write(self, group: list[ItemResult]) -> None:
        start = await self._starting
        if not isinstance(start, BatchStart):
            return  # not our batch to write
        joined = await self._batch.joiners_claimed()
        group = [r for r in group if r.request_id in start.live_ids or r.request_id in joined]
        now = self._runner.clock()
        model_ms = (now - self._model_started) * 1000.0
        outcomes = [
            ItemOutcome(
                r, item_timings(self._items[r.request_id], self._message, model_ms, now, now)
            )
            for r in group
            if r.request_id in self._items
        ]
        self._runner.stream_outputs(self._message.batch_id, [o.result for o in outcomes])
        self.streamed.update(o.result.request_id for o in outcomes)
        try:
            written = await self._runner.store.complete_items(
                uuid.UUID(self._message.batch_id),
                attempt=start.attempt,
                outcomes=outcomes,
                now=now,
            )
        except Unavailable as error:  # the batch's final write carries them too
            log.warning("early_results_not_written", batch_id=self._message.batch_id, error=error)
            return
        if written:
            self.written.update(written)
            observe_latency(
                self._message.model, [o for o in outcomes if o.result.request_id in self.written]
            )
