"""The batcher's background jobs: what it learns and publishes between decisions.

Each runs every so often (:meth:`run_due` runs those due at ``now``, so a test steps them with a
fake clock): read the workers' capacity (slots, or engines' sequences and KV tokens with their
measured speed), reconcile what is out with Postgres, re-read tenants' weights and queue depths,
learn the batch (engine models: sequence) time from what finished, and publish the load the API
admits by.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from batchserve.batching.estimate import (
    BatchObservation,
    BatchShape,
    BatchTimeEstimator,
    FixedBatchTime,
    LearnedBatchTime,
    ProfiledSequenceTime,
    SequenceCost,
)
from batchserve.batching.ledger import Credit, EngineLedger
from batchserve.batching.policy import PolicyConfig
from batchserve.batching.rate import RateMeter
from batchserve.batching.timeline import SlotTimeline
from batchserve.core.broker import RequestQueue
from batchserve.core.domain import Lane
from batchserve.core.errors import Unavailable
from batchserve.core.loadboard import LOAD_KEEPALIVE_S, LoadBoard, LoadSnapshot, load_shape
from batchserve.core.logs import get_logger
from batchserve.core.slots import SlotDirectory
from batchserve.core.store import JobStore
from batchserve.core.store.batches import FinishedBatch, FinishedSequence
from batchserve.models.registry import ModelSpec

log = get_logger("batchserve.batcher")

# How far before the newest finish it learned the learner reads again: a row whose write
# committed after a later-finished one is still read, within this long of it.
LEARN_OVERLAP_S = 60.0


def quiet(shape: LoadSnapshot) -> bool:
    """A load with nothing held, queued or running (``load_shape``'s view)."""
    engine_busy = shape.kind == "engine" and shape.free_seqs < shape.slots
    waiting = shape.pending_interactive + shape.pending_bulk
    waiting += shape.queued_interactive + shape.queued_bulk
    return not (waiting or shape.slot_free_at or engine_busy)


@dataclass(slots=True)
class Job:
    """A background job of the batcher, due every ``period_s``."""

    period_s: float
    run: Callable[[], Awaitable[None]]
    due_at: float = 0.0


class BatcherJobs:
    """The background half of :class:`~batching.batcher.ModelBatcher` (its attributes)."""

    spec: ModelSpec
    policy: PolicyConfig
    engine: bool
    estimator: BatchTimeEstimator
    slots: SlotTimeline
    ledger: EngineLedger
    rate: RateMeter
    weights: dict[str, float]
    pending: dict[str, Any]
    _store: JobStore
    _queue: RequestQueue
    _slots: SlotDirectory
    _loadboard: LoadBoard | None
    _clock: Callable[[], float]
    _jobs: list[Job]
    _jobs_wake: asyncio.Event
    _load_job: Job | None
    _wake: asyncio.Event
    _queued: dict[Lane, int]
    _recently_closed: dict[uuid.UUID, float]
    _claiming: set[uuid.UUID]
    _learned_until: float | None
    _learned_ids: dict[uuid.UUID, float]  # learned rows of the last LEARN_OVERLAP_S, by id
    _published_shape: LoadSnapshot | None  # the load last published, and when
    _published_at: float

    def _typical_batch_s(self) -> float:
        raise NotImplementedError

    async def run_due(self, now: float) -> float:
        """Run every background job due at ``now``; returns when the next one is due."""
        for job in self._jobs:
            if job.due_at > now:
                continue
            job.due_at = now + job.period_s
            try:
                await job.run()
            except Unavailable as error:
                log.debug("background_unavailable", error=error)
            except Exception:
                log.exception("batcher_background_failed", model=self.spec.name)
        return min(job.due_at for job in self._jobs)

    async def _background(self) -> None:
        while True:
            self._jobs_wake.clear()  # before the jobs run: a job brought forward meanwhile runs
            due = await self.run_due(self._clock())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._jobs_wake.wait(), max(0.0, due - self._clock()))

    async def _refresh_slots(self) -> None:
        found = await self._slots.capacity(self.spec.name, self._clock())
        if found is None:
            return
        if self.engine:
            self._refresh_engines(found.units, found.tokens, found.profile)
            return
        if found.units != self.slots.capacity:
            log.info("slots_changed", model=self.spec.name, total=found.units)
            grew = found.units > self.slots.capacity
            self.slots.resize(found.units)
            if grew:
                self._wake.set()

    def _refresh_engines(self, seqs: int, tokens: int, profile: dict[str, float] | None) -> None:
        capacity = Credit(seqs, tokens)
        if capacity != self.ledger.capacity:
            log.info("capacity_changed", model=self.spec.name, seqs=seqs, tokens=tokens)
            grew = seqs > self.ledger.capacity.seqs or tokens > self.ledger.capacity.tokens
            self.ledger.resize(capacity)
            if grew:
                self._wake.set()
        prior = self._sequence_prior()
        if profile and prior is not None:
            alone = profile.get("decode_step_s_alone")
            prior.set_profile(
                float(profile["prefill_tokens_per_s"]),
                float(profile["decode_step_s"]),
                None if alone is None else float(alone),
            )

    def _sequence_prior(self) -> ProfiledSequenceTime | None:
        estimator = self.estimator
        if isinstance(estimator, LearnedBatchTime):
            estimator = estimator.prior
        return estimator if isinstance(estimator, ProfiledSequenceTime) else None

    async def _reconcile(self) -> None:
        """Make the slot timeline (or the engine ledger) match Postgres: free what a missed
        event would have freed (Redis down, batch reaped) and count what another batcher
        dispatched (after a standby takes over)."""
        if self._holds_nothing():
            # No worker and no batch of ours: nothing to free, nowhere another batcher could
            # have sent work. Most models of a large registry are like this most of the time;
            # once a worker announces itself (slot refresh, every 0.25 s) this runs again.
            return
        if self.engine:
            await self._reconcile_engine()
            return
        started = self._clock()
        known = self.slots.batches()
        open_now = {batch_id for batch_id, _ in await self._store.open_batches(self.spec.name)}
        # Batches dispatched while the query ran are not in its answer yet: leave them be.
        freed = [b for b in known if b not in open_now]
        for batch_id in freed:
            self.slots.release(batch_id, self._clock())
        unknown = open_now - self.slots.batches() - self._recently_closed.keys() - self._claiming
        for batch_id in unknown:
            self.slots.assign(batch_id, started, self._typical_batch_s())
        self._forget_closed(started)
        if freed:
            self._wake.set()

    def _holds_nothing(self) -> bool:
        if self.engine:
            return self.ledger.capacity.seqs == 0 and not self.ledger.batches()
        return self.slots.capacity == 0 and not self.slots.batches()

    async def _reconcile_engine(self) -> None:
        started = self._clock()
        before = self.ledger.batches()
        running: dict[uuid.UUID, dict[str, int]] = {}
        for batch_id, request_id, prompt, max_tokens in await self._store.running_members(
            self.spec.name
        ):
            running.setdefault(batch_id, {})[request_id] = self.ledger.cost(prompt, max_tokens)
        # Dispatched while the query ran, or closed since: the events are newer than it.
        keep = (self.ledger.batches() - before) | self._claiming | self._recently_closed.keys()
        if self.ledger.sync(running, keep):
            self._wake.set()
        self._forget_closed(started)

    def _forget_closed(self, now: float) -> None:
        horizon = now - 60.0
        self._recently_closed = {b: t for b, t in self._recently_closed.items() if t > horizon}

    async def _refresh_weights(self) -> None:
        self.weights = await self._store.tenant_weights()

    async def _refresh_queue_depth(self) -> None:
        for lane in Lane:
            depth = await self._queue.depth(self.spec.name, lane)
            if depth is not None:
                self._queued[lane] = depth

    async def _publish_load(self) -> None:
        assert self._loadboard is not None
        now = self._clock()
        by_lane = {Lane.INTERACTIVE: 0, Lane.BULK: 0}
        for entry in self.pending.values():
            by_lane[entry.pending.lane] += 1
        if self.engine:
            capacity, free = self.ledger.capacity, self.ledger.free()
            slots = capacity.seqs
            slot_free_at: tuple[float, ...] = ()
        else:
            busy = sorted(self.slots.busy_until(now))
            idle = max(0, self.slots.capacity - len(busy))
            slots = self.slots.capacity
            slot_free_at = tuple([now] * idle + busy[: self.slots.capacity])
            free = Credit(0, 0)
        snapshot = LoadSnapshot(
            model=self.spec.name,
            at=now,
            slots=slots,
            slot_free_at=slot_free_at,
            pending_interactive=by_lane[Lane.INTERACTIVE],
            pending_bulk=by_lane[Lane.BULK],
            queued_interactive=self._queued[Lane.INTERACTIVE],
            queued_bulk=self._queued[Lane.BULK],
            batch_s=self._typical_batch_s(),
            max_batch_size=self.policy.max_batch_size,
            max_batch_delay_s=min(self.policy.max_batch_delay_s, self._typical_batch_s()),
            arrival_rate=self.rate.rate(now),
            kind="engine" if self.engine else "batch",
            free_seqs=free.seqs,
            free_tokens=free.tokens,
            capacity_tokens=self.ledger.capacity.tokens if self.engine else 0,
            estimate=self.estimate(),
        )
        # Unchanged load is sent again only every LOAD_KEEPALIVE_S, so that readers never
        # find it stale: an idle batcher no longer writes Redis ten times a second.
        shape = load_shape(snapshot)
        if shape != self._published_shape or now - self._published_at >= LOAD_KEEPALIVE_S:
            await self._loadboard.publish(snapshot)
            self._published_shape, self._published_at = shape, now
        if self._load_job is not None and quiet(shape):
            # Nothing held, queued or running: no check until the keep-alive is due, or an
            # arrival brings it forward (_load_changes). An idle batcher no longer wakes ten
            # times a second to find its load unchanged.
            self._load_job.due_at = self._published_at + LOAD_KEEPALIVE_S

    def _load_changes(self, now: float) -> None:
        """A request arrived: the load check is due at once if a quiet spell deferred it."""
        job = self._load_job
        if job is not None and job.due_at > now + job.period_s:
            job.due_at = now
            self._jobs_wake.set()

    def estimate(self) -> dict[str, object]:
        """What the batcher currently believes a batch (engine models: a sequence) takes,
        and where that belief comes from; shown by ``GET /v1/models`` and ``status``."""
        estimator = self.estimator
        learned = isinstance(estimator, LearnedBatchTime) and estimator.learned
        if learned:
            source = "learned"
        elif self.engine:
            prior = self._sequence_prior()
            source = "engine-profile" if prior is not None and prior.measured else "none"
        else:
            source = "fixed" if isinstance(estimator, FixedBatchTime) else "prior"
        found: dict[str, object] = {
            "unit": "sequence" if self.engine else "batch",
            "source": source,
            "observations": (
                estimator.num_observations if isinstance(estimator, LearnedBatchTime) else 0
            ),
            "typical_s": round(self._typical_batch_s(), 4),
        }
        cost = SequenceCost.of(estimator) if self.engine else None
        if cost is not None:
            found.update(
                fixed_s=cost.fixed_s,
                per_prompt_token_s=cost.per_prompt_token_s,
                per_token_s=cost.per_token_s,
                floor_s=cost.floor_s,
            )
        return found

    async def _learn(self) -> None:
        """Feed what workers finished since last time to the learned time: engine models
        learn each sequence's time, batch models each batch's.

        Rows become visible in the order their writes commit, not in the order they finished
        (a worker stamps the finish, then writes; several workers write at once), so each read
        looks back ``LEARN_OVERLAP_S`` before the newest finish already learned and skips the
        rows it has seen by id: a late commit is learned, and nothing twice."""
        assert isinstance(self.estimator, LearnedBatchTime)
        if self._holds_nothing():
            return  # nothing ran here since: what finished before is read once a worker is back
        after = None if self._learned_until is None else self._learned_until - LEARN_OVERLAP_S
        rows: Sequence[FinishedSequence | FinishedBatch]
        if self.engine:
            rows = await self._store.finished_sequences(self.spec.name, after=after)
        else:
            rows = await self._store.finished_batches(self.spec.name, after=after)
        for row in rows:
            if row.id in self._learned_ids:
                continue
            self._learned_ids[row.id] = row.finished_at
            if isinstance(row, FinishedSequence):
                shape = BatchShape(1, row.prompt_tokens, row.generated_tokens)
            else:
                shape = BatchShape(row.size, row.prompt_tokens, row.max_new_tokens)
            self.estimator.observe(BatchObservation(shape, row.seconds))
            self._learned_until = max(self._learned_until or row.finished_at, row.finished_at)
        if self._learned_until is not None:
            horizon = self._learned_until - LEARN_OVERLAP_S
            self._learned_ids = {k: at for k, at in self._learned_ids.items() if at > horizon}
