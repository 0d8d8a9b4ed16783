"""Running batches on an engine: each request its own sequence, leased and fenced by its batch.

The batcher sends an engine worker batches, as it sends any worker, but only as many requests
as the engine has room for. Here every request of a batch becomes a sequence of the running
engine; it joins at the next step boundary and leaves the moment it finishes, and its result is
written then, fenced by its batch and attempt like every result. The batch is closed (its row
gets its outcome and model time) when its last sequence has left.

Durability is the batch world's: the lease of every open batch is renewed while the engine
makes progress, so a worker that dies or hangs loses its leases and maintenance requeues
whatever had not finished (in halves, each half its own isolation group). A batch of such
suspects runs alone in the engine, with nothing else admitted until it is done, so that if it
crashes the engine again the blame falls on it alone and not on innocent neighbours.

Also here: a cancelled request's sequence is stopped at the engine's next step, a running
request whose deadline passes is stopped and ended ``expired``, and one that runs past its
time limit (from the learned cost model and its own ``max_tokens``, set by the batcher) is
stopped and failed. Each time sequences leave, the batcher hears of it (``SequencesFreed``) and
may fill their room at once.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from batchserve.core.broker import RequestQueue
from batchserve.core.clock import deployment_time
from batchserve.core.domain import (
    BatchClosed,
    BatchItem,
    BatchMessage,
    BatchOutcome,
    ErrorCode,
    Event,
    ItemResult,
    RequestState,
    SequencesFreed,
    StateChange,
)
from batchserve.core.events import CANCELS, EventBus, Subscription
from batchserve.core.logs import get_logger
from batchserve.core.metrics import metrics
from batchserve.core.republish import republish
from batchserve.core.store import BatchStart, ItemOutcome, JobStore, Reaped
from batchserve.core.tokenlog import LogEntry, TokenLog
from batchserve.models.engine import Engine, SequenceRequest, SequenceUpdate
from batchserve.workers.runner import item_timings, observe_latency, with_patience

log = get_logger("batchserve.worker")


@dataclass(frozen=True, slots=True)
class EngineRunnerConfig:
    lease_s: float = 2.0
    # No engine step for this long while sequences run: the engine is hung. Its leases are no
    # longer renewed and ``on_stalled`` is called (the worker process exits, and restarts).
    stall_s: float = 60.0
    tick_s: float = 0.1  # how often deadlines and time limits are checked
    # Past its time limit a sequence is stopped once it has made no token for this long; one
    # still making tokens (a busy machine runs every sequence slower than the learned speed)
    # is left to finish until ``slow_factor`` times its limit.
    progress_grace_s: float = 30.0
    slow_factor: float = 3.0
    write_patience_s: float = 30.0


@dataclass(eq=False)
class _Batch:
    message: BatchMessage
    batch_id: uuid.UUID
    worker: str
    attempt: int
    isolating: bool
    items: list[BatchItem]
    live: set[str] = field(default_factory=set)  # in the engine (or about to be)
    unwritten: list[ItemOutcome] = field(default_factory=list)
    started_at: float = 0.0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    launched: bool = False
    closing: bool = False


@dataclass(eq=False)
class _Sequence:
    item: BatchItem
    batch: _Batch
    added_at: float
    pieces: list[str] = field(default_factory=list)
    first_token_at: float | None = None
    last_piece_at: float | None = None
    tokens: int = 0  # completion tokens so far
    last_token_at: float | None = None
    ended: bool = False  # cancelled, expired or failed here: the engine's last word is moot


class EngineRunner:
    """Feeds an engine the requests of the batches it is sent, and stores what it makes."""

    def __init__(
        self,
        *,
        store: JobStore,
        events: EventBus,
        queue: RequestQueue,
        engine: Engine,
        model: str,
        max_new_tokens: int,
        worker_id: str,
        config: EngineRunnerConfig | None = None,
        clock: Callable[[], float] = deployment_time,
        monotonic: Callable[[], float] = time.monotonic,
        on_stalled: Callable[[], None] | None = None,
        tokens: TokenLog | None = None,
    ) -> None:
        self._store = store
        self._tokens = tokens
        self._events = events
        self._queue = queue
        self.engine = engine
        self.model = model
        self._max_new_tokens = max_new_tokens
        self.worker_id = worker_id
        self.config = config or EngineRunnerConfig()
        self._clock = clock
        self._monotonic = monotonic
        self._on_stalled = on_stalled
        self._serial = itertools.count(1)
        self._batches: dict[uuid.UUID, _Batch] = {}
        self._held: collections.deque[_Batch] = collections.deque()  # leased, not yet running
        self._running: dict[str, _Sequence] = {}
        self._freed: dict[uuid.UUID, list[str]] = {}
        self._to_expire: dict[uuid.UUID, list[str]] = {}
        self._dirty = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._next_lease_at = 0.0
        self.stalled = False
        self._subscription: Subscription | None = None
        self._tasks: list[asyncio.Task[None]] = []

    # -- life --------------------------------------------------------------------------------

    async def start(self, *, background: bool = True) -> None:
        """Start the engine; with ``background`` also the tasks that write results and keep
        leases (a test steps them itself with :meth:`tick` and :meth:`flush`)."""
        self._subscription = self._events.subscribe(self._on_event, topics=(CANCELS,))
        await self.engine.start(self._on_updates)
        if background:
            self._tasks = [
                asyncio.create_task(self._write_forever()),
                asyncio.create_task(self._tick_forever()),
            ]

    async def drain(self, timeout_s: float) -> bool:
        """Wait until every batch accepted so far has finished; False if time ran out."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        return self._idle.is_set()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._subscription is not None:
            await self._subscription.close()
        await self.engine.close()

    @property
    def open_batches(self) -> int:
        return len(self._batches)

    # -- batches in --------------------------------------------------------------------------

    async def accept(self, message: BatchMessage) -> None:
        """Take the batch's lease and put its requests into the engine (or hold them while
        suspects of a crash run alone). Returns once the batch is ours or known not to be."""
        batch_id = uuid.UUID(message.batch_id)
        # Each batch its own worker name: the reaper's "this worker started a later batch, so
        # its earlier one had finished" holds for one batch at a time, not for an engine.
        worker = f"{self.worker_id}/{next(self._serial)}"
        now = self._clock()

        async def take() -> BatchStart | Reaped | None:
            return await self._store.start_batch(batch_id, worker, now, self.config.lease_s)

        start = await with_patience(batch_id, take, self.config.write_patience_s)
        if start is None:
            log.info("batch_skipped", batch_id=batch_id, note="finished, reaped or elsewhere")
            return
        if isinstance(start, Reaped):
            log.warning("batch_crashed_before", batch_id=batch_id, requeued=len(start.requeued))
            metrics().batches_finished.labels(message.model, "crashed").inc()
            await self._announce(message, BatchOutcome.CRASHED, worker)
            await self._republish(start)
            return
        items = [i for i in message.items if i.request_id in start.live_ids]
        batch = _Batch(message, batch_id, worker, start.attempt, start.isolating, items)
        batch.started_at = now
        self._batches[batch_id] = batch
        self._idle.clear()
        self._held.append(batch)
        self._launch_held()
        if not batch.items:
            self._dirty.set()  # nothing to run: close it at once

    def _launch_held(self) -> None:
        """Start held batches in order: a suspect batch only into an empty engine, and nothing
        after it until it is done."""
        while self._held:
            batch = self._held[0]
            exclusive = any(b.isolating for b in self._batches.values() if b.launched)
            if exclusive or (batch.isolating and self._running):
                return
            self._held.popleft()
            self._launch(batch)

    def _launch(self, batch: _Batch) -> None:
        batch.launched = True
        added_at = self._clock()
        for item in batch.items:
            if item.request_id in self._running:
                continue  # the same request twice (a duplicate delivery): it runs once
            batch.live.add(item.request_id)
            self._running[item.request_id] = _Sequence(item, batch, added_at)
            self.engine.add(SequenceRequest.of(item, self._max_new_tokens))
        log.info(
            "batch_started",
            batch_id=batch.batch_id,
            model=self.model,
            attempt=batch.attempt,
            size=len(batch.live),
            isolating=batch.isolating,
            running=len(self._running),
        )

    # -- what the engine makes ---------------------------------------------------------------

    def _on_updates(self, updates: Sequence[SequenceUpdate]) -> None:
        now = self._clock()
        deltas: list[tuple[str, LogEntry]] = []
        inter_token = metrics().inter_token.labels(self.model)
        for update in updates:
            sequence = self._running.get(update.request_id)
            if sequence is None:
                continue
            if update.text:
                sequence.pieces.append(update.text)
                if not sequence.ended:
                    deltas.append(
                        (
                            update.request_id,
                            LogEntry.delta(sequence.batch.message.batch_id, update.text),
                        )
                    )
                if sequence.last_piece_at is not None:
                    inter_token.observe(now - sequence.last_piece_at)
                sequence.last_piece_at = now
            if update.completion_tokens > sequence.tokens:
                sequence.tokens = update.completion_tokens
                sequence.last_token_at = now
                if sequence.first_token_at is None:
                    sequence.first_token_at = now
            if update.finished:
                self._finished(sequence, update, now)
        if deltas and self._tokens is not None:
            # Queued for one pipelined write by the log's own task: the step goes on at once.
            self._tokens.append(deltas)
        self._dirty.set()

    def _finished(self, sequence: _Sequence, update: SequenceUpdate, now: float) -> None:
        batch = sequence.batch
        request_id = sequence.item.request_id
        del self._running[request_id]
        batch.live.discard(request_id)
        self._freed.setdefault(batch.batch_id, []).append(request_id)
        batch.prompt_tokens += update.prompt_tokens
        batch.generated_tokens += update.completion_tokens
        if sequence.ended or update.finish_reason == "cancelled":
            return  # ended here already, or cancelled by its caller: nothing to write
        first = sequence.first_token_at
        if update.error_code is None and first is not None and update.completion_tokens > 1:
            per_token_s = (now - first) / (update.completion_tokens - 1)
            metrics().time_per_token.labels(self.model).observe(per_token_s)
        result = ItemResult(
            request_id=request_id,
            output=None if update.error_code else "".join(sequence.pieces),
            finish_reason=update.finish_reason,
            prompt_tokens=update.prompt_tokens,
            completion_tokens=update.completion_tokens,
            error_code=update.error_code,
            error_message=update.error_message,
        )
        self._store_later(sequence, result, now)

    def _store_later(self, sequence: _Sequence, result: ItemResult, now: float) -> None:
        model_ms = (now - sequence.added_at) * 1000.0
        timings = item_timings(
            sequence.item, sequence.batch.message, model_ms, now, sequence.first_token_at
        )
        sequence.batch.unwritten.append(ItemOutcome(result, timings, finished_at=now))

    def _on_event(self, event: Event) -> None:
        if not isinstance(event, StateChange) or event.state is not RequestState.CANCELLED:
            return
        for request_id in event.request_ids:
            sequence = self._running.get(request_id)
            if sequence is not None and not sequence.ended:
                sequence.ended = True
                self.engine.abort(request_id)

    # -- writing -----------------------------------------------------------------------------

    async def flush(self) -> None:
        """Announce freed room, write finished results and expiries, close finished batches."""
        freed, self._freed = self._freed, {}
        for batch_id, ids in freed.items():
            await self._events.publish(SequencesFreed(self.model, str(batch_id), tuple(ids)))
        expiring, self._to_expire = self._to_expire, {}
        for batch_id, ids in expiring.items():
            batch = self._batches.get(batch_id)
            if batch is not None:
                await self._expire(batch, ids)
        for batch in list(self._batches.values()):
            if batch.closing or not batch.launched:
                continue
            if not batch.live:
                await self._close(batch)
            elif batch.unwritten:
                await self._write(batch)
        self._launch_held()
        if not self._batches:
            self._idle.set()

    async def _write(self, batch: _Batch) -> None:
        outcomes, batch.unwritten = batch.unwritten, []
        now = self._clock()

        async def write() -> list[str] | None:
            return await self._store.complete_items(
                batch.batch_id, attempt=batch.attempt, outcomes=outcomes, now=now
            )

        written = await with_patience(batch.batch_id, write, self.config.write_patience_s)
        if written is None:
            self._lost(batch)
            return
        observe_latency(self.model, [o for o in outcomes if o.result.request_id in written])

    async def _close(self, batch: _Batch) -> None:
        """The last sequence has left: write what is left and give the batch its outcome."""
        batch.closing = True
        outcomes, batch.unwritten = batch.unwritten, []
        now = self._clock()
        model_ms = (now - batch.started_at) * 1000.0

        async def write() -> Reaped | None:
            return await self._store.complete_batch(
                batch.batch_id,
                attempt=batch.attempt,
                outcomes=outcomes,
                now=now,
                model_ms=model_ms,
                prompt_tokens=batch.prompt_tokens,
                max_new_tokens=max(
                    (int(i.params.get("max_tokens") or 0) for i in batch.items), default=0
                ),
                generated_tokens=batch.generated_tokens,
            )

        try:
            reaped = await with_patience(batch.batch_id, write, self.config.write_patience_s)
        finally:
            self._batches.pop(batch.batch_id, None)
        if reaped is None:
            log.warning("batch_result_discarded", batch_id=batch.batch_id, note="lease lost")
            metrics().batches_finished.labels(self.model, "stale").inc()
        else:
            found = metrics()
            found.batches_finished.labels(self.model, "succeeded").inc()
            found.model_time.labels(self.model).observe(model_ms / 1000.0)
            found.results_store.labels(self.model).observe(max(0.0, self._clock() - now))
            observe_latency(self.model, outcomes)
            await self._republish(reaped)
        log.info(
            "batch_done",
            batch_id=batch.batch_id,
            model=self.model,
            attempt=batch.attempt,
            size=len(batch.items),
            model_ms=round(model_ms, 1),
        )
        await self._announce(batch.message, BatchOutcome.SUCCEEDED, batch.worker)

    async def _expire(self, batch: _Batch, ids: list[str]) -> None:
        now = self._clock()

        async def write() -> list[str] | None:
            return await self._store.expire_running(
                batch.batch_id, attempt=batch.attempt, request_ids=ids, now=now
            )

        if await with_patience(batch.batch_id, write, self.config.write_patience_s) is None:
            self._lost(batch)

    def _lost(self, batch: _Batch) -> None:
        """Our attempt at this batch is over (reaped): stop its sequences, keep nothing."""
        log.warning("lease_lost", batch_id=batch.batch_id, note="its sequences are stopped")
        for request_id in list(batch.live):
            sequence = self._running.get(request_id)
            if sequence is not None and not sequence.ended:
                sequence.ended = True
                self.engine.abort(request_id)
        batch.unwritten = []
        batch.closing = True
        self._batches.pop(batch.batch_id, None)
        with contextlib.suppress(ValueError):
            self._held.remove(batch)

    async def _announce(self, message: BatchMessage, outcome: BatchOutcome, worker: str) -> None:
        await self._events.publish(
            BatchClosed(
                model=message.model, batch_id=message.batch_id, outcome=outcome.value, worker=worker
            )
        )

    async def _republish(self, reaped: Reaped) -> None:
        await republish(self._queue, self._store, reaped.requeued, errors=(Exception,))

    # -- time --------------------------------------------------------------------------------

    async def tick(self, now: float) -> None:
        """Stop what ran past its deadline or time limit; renew leases when due."""
        for sequence in list(self._running.values()):
            if sequence.ended:
                continue
            item = sequence.item
            if item.deadline is not None and now >= item.deadline:
                sequence.ended = True
                self.engine.abort(item.request_id)
                self._to_expire.setdefault(sequence.batch.batch_id, []).append(item.request_id)
            elif self._past_time_limit(sequence, now):
                sequence.ended = True
                self.engine.abort(item.request_id)
                assert sequence.first_token_at is not None and item.time_limit_s is not None
                generating_s = now - sequence.first_token_at
                log.warning(
                    "sequence_time_limit",
                    request_id=item.request_id,
                    limit_s=round(item.time_limit_s, 1),
                    generating_s=round(generating_s, 1),
                )
                message = (
                    f"stopped after generating for {generating_s:.1f} s, past its time limit "
                    f"of {item.time_limit_s:.1f} s (its max_tokens at the learned time a token "
                    f"of this model), with {sequence.tokens} tokens made"
                )
                error = ItemResult(
                    item.request_id, error_code=ErrorCode.MODEL_ERROR.value, error_message=message
                )
                self._store_later(sequence, error, now)
        if self._to_expire:
            self._dirty.set()
        if now >= self._next_lease_at:
            self._next_lease_at = now + self.config.lease_s / 3.0
            await self._renew(now)

    async def _renew(self, now: float) -> None:
        health = self.engine.health()
        stuck_s = self._monotonic() - health.last_step_at
        if health.running and stuck_s > self.config.stall_s:
            if not self.stalled:
                self.stalled = True
                log.error(
                    "engine_stalled",
                    model=self.model,
                    running=health.running,
                    seconds_since_step=round(stuck_s, 1),
                    note="leases are left to run out",
                )
                if self._on_stalled is not None:
                    self._on_stalled()
            return
        held = [(b.batch_id, b.worker) for b in self._batches.values() if not b.closing]
        try:
            kept = await self._store.renew_leases(held, now + self.config.lease_s)
        except Exception as error:  # the database is away: try again at the next renewal
            log.warning("lease_renew_failed", error=error)
            return
        for batch_id, _ in held:
            batch = self._batches.get(batch_id)
            if batch_id not in kept and batch is not None and not batch.closing:
                self._lost(batch)

    async def _tick_forever(self) -> None:
        while True:
            try:
                await self.tick(self._clock())
            except Exception:
                log.exception("engine_tick_failed", model=self.model)
            await asyncio.sleep(self.config.tick_s)

    async def _write_forever(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            try:
                await self.flush()
            except Exception:  # a write that keeps failing: the lease runs out, it runs again
                log.exception("engine_write_failed", model=self.model)
                await asyncio.sleep(0.5)
                self._dirty.set()

    def _past_time_limit(self, sequence: _Sequence, now: float) -> bool:
        """Stuck: past its limit and no token for a while, or far past it however it goes.

        The limit counts from the first token (before it, a sequence waits on the prompts of
        those around it). A sequence still making tokens past it is slow, not stuck: the
        machine is busier than when the speed was learned, and its ``max_tokens`` ends it
        anyway. Only ``slow_factor`` times over is it stopped while making tokens."""
        limit = sequence.item.time_limit_s
        started = sequence.first_token_at
        if limit is None or started is None or now - started <= limit:
            return False
        if now - started > limit * self.config.slow_factor:
            return True
        assert sequence.last_token_at is not None  # set with the first token
        return now - sequence.last_token_at > self.config.progress_grace_s
