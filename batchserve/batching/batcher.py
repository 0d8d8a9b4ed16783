"""The batcher: a thin loop that feeds the pure policy and carries out its decisions.

One :class:`ModelBatcher` per model. It consumes ``requests.<model>`` (as the single active
consumer; another batcher waits as hot standby), keeps pending requests in memory, learns free
worker slots from worker registrations and batch-closed events, and dispatches a batch only when
a slot is free. Messages are acked only after their batch is claimed in Postgres and handed to a
worker, so a batcher that dies loses nothing: its messages are redelivered to the standby.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Protocol

from batchserve.batching.batcher_jobs import BatcherJobs, Job
from batchserve.batching.estimate import (
    BatchShape,
    BatchTimeEstimator,
    FixedBatchTime,
    LearnedBatchTime,
    ProfiledSequenceTime,
    SequenceCost,
    sequence_time_limit_s,
)
from batchserve.batching.ledger import EngineLedger
from batchserve.batching.policy import (
    Decision,
    Load,
    Pending,
    PolicyConfig,
    decide,
    decide_engine,
    estimate_batch_s,
    length_class,
    serving_order,
)
from batchserve.batching.rate import RateMeter
from batchserve.batching.timeline import LeadTuner, SlotTimeline
from batchserve.core.broker import Delivery, RequestQueue
from batchserve.core.clock import deployment_time
from batchserve.core.domain import (
    BatchClosed,
    BatchJoinable,
    BatchMessage,
    BatchOutcome,
    Event,
    Lane,
    QueueMessage,
    SequencesFreed,
)
from batchserve.core.errors import Unavailable
from batchserve.core.events import SLOTS, EventBus, Subscription
from batchserve.core.ids import uuid7
from batchserve.core.joins import JoinBox
from batchserve.core.loadboard import LoadBoard, LoadSnapshot
from batchserve.core.logs import get_logger
from batchserve.core.metrics import metrics
from batchserve.core.republish import republish
from batchserve.core.slots import SlotDirectory
from batchserve.core.store import ClaimedRequest, JobStore
from batchserve.core.store.base import S
from batchserve.models.plugins import plugin_for
from batchserve.models.registry import ModelSpec

log = get_logger("batchserve.batcher")


class Dispatcher(Protocol):
    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        """Hand a claimed batch to a worker; raises :class:`Unavailable` if it cannot."""
        ...


@dataclass(slots=True)
class _Entry:
    pending: Pending
    received_at: float
    deliveries: list[Delivery] = field(default_factory=list)
    created_at: float = 0.0


@dataclass(slots=True)
class _Joinable:
    """A batch sent behind a running one with room: requests that arrive before its model
    starts are offered to it (``batchserve/core/joins.py``)."""

    size: int  # as dispatched
    capacity: int  # how many may join it, whoever offers them (its box refuses more)
    room: int  # of that capacity, what this batcher may still offer (as far as it knows)
    tokens: int
    length_class: int
    ends_by: float  # its expected end: a joiner's deadline must allow it
    open: bool = True  # False once an offer was refused or its model started
    offered: dict[str, _Entry] = field(default_factory=dict)  # held until settled
    offering: int = 0  # offers under way


# Past this many pending requests batches are full anyway: no late joiners are looked for.
_JOIN_SCAN_MAX = 1024


@dataclass(frozen=True, slots=True)
class BatcherConfig:
    dispatch_grace_s: float = 5.0
    interactive_prefetch: int = 1024
    bulk_prefetch: int = 256
    slot_refresh_s: float = 0.25
    reconcile_s: float = 1.0
    publish_load_s: float = 0.1
    queue_depth_s: float = 1.0
    rate_tau_s: float = 1.0
    learn_s: float = 2.0
    weights_s: float = 5.0  # tenants' fair-share weights are re-read this often
    # Requeued members of a crashed batch are gathered this long before any decision.
    group_settle_s: float = 0.05
    # Send a slot its next batch this long before its running one is expected to end: long
    # enough for the claim, the Celery publish and delivery and, on a worker with standby
    # processes, the lease, so that the next model starts the moment the slot frees. The
    # start: 20 ms left ~1 batch in 10 waiting for its lease (saturation drain 0.95-0.97 of
    # the ideal against 0.99 at 30 ms). From then on it is learned from how early the
    # batches sent behind running ones come to their slots (``LeadTuner``), within these
    # bounds, at most ``pipeline_late_share`` of them late. With late joiners a longer lead
    # no longer makes the requests that arrive within it wait a batch more, so few come late
    # (3 in 100: the worst path's p99 gap at 30 and 100/s lower than at 1 in 10 in every
    # alternating run, docs/frontdoor.md).
    pipeline_lead_s: float = 0.03
    pipeline_lead_min_s: float = 0.005
    pipeline_lead_max_s: float = 0.1
    pipeline_late_share: float = 0.03
    # From dispatch to a batch's end, beyond its model time: hand-over to the worker, taking
    # the lease, writing the results.
    dispatch_overhead_s: float = 0.025


def policy_config(spec: ModelSpec) -> PolicyConfig:
    return PolicyConfig(
        kind=spec.policy,
        max_batch_size=spec.max_batch_size,
        max_batch_delay_s=spec.batch_delay_ms / 1000.0,
        max_batch_tokens=spec.max_batch_tokens,
        length_edges=spec.length_edges,
    )


def estimator_for(spec: ModelSpec) -> BatchTimeEstimator:
    """The seeds' weightless backends take their configured time. Real models learn theirs
    from what workers report: an engine model the time of each sequence, starting from the
    speed its engines measured at start-up; a batch model the time of each batch, starting
    from ``batch_time_ms``."""
    plugin = plugin_for(spec)
    fixed = FixedBatchTime(spec.batch_time_ms / 1000.0)
    if plugin.kind == "engine":
        return LearnedBatchTime(ProfiledSequenceTime(fallback=fixed))
    return LearnedBatchTime(fixed) if plugin.holds_weights else fixed


def _earliest(a: float, b: float | None) -> float:
    return a if b is None else min(a, b)


def time_limit_s(estimated_s: float) -> float:
    """Past this a batch counts as stalled and its worker process is killed."""
    return max(10.0 * estimated_s, estimated_s + 10.0)


class ModelBatcher(BatcherJobs):
    """One model's batcher. Each role can be stepped: :meth:`step` decides once at ``now``,
    :meth:`run_due` runs the background jobs due at ``now``; :meth:`run` loops both."""

    def __init__(
        self,
        spec: ModelSpec,
        *,
        store: JobStore,
        queue: RequestQueue,
        dispatcher: Dispatcher,
        slots: SlotDirectory,
        events: EventBus,
        config: BatcherConfig | None = None,
        estimator: BatchTimeEstimator | None = None,
        loadboard: LoadBoard | None = None,
        clock: Callable[[], float] = deployment_time,
        joins: JoinBox | None = None,
    ) -> None:
        self.spec = spec
        self.policy = policy_config(spec)
        self.engine = plugin_for(spec).kind == "engine"
        self.estimator = estimator or estimator_for(spec)
        self.config = config or BatcherConfig()
        self._store = store
        self._queue = queue
        self._dispatcher = dispatcher
        self._slots = slots
        self._events = events
        self._loadboard = loadboard
        self._clock = clock
        self.pending: dict[str, _Entry] = {}
        # Batch models: which worker slots are busy until when. Engine models: what is out.
        self.lead = LeadTuner(
            self.config.pipeline_lead_s,
            min_s=self.config.pipeline_lead_min_s,
            max_s=self.config.pipeline_lead_max_s,
            late_share=self.config.pipeline_late_share,
        )
        self.slots = SlotTimeline(lead_s=self.lead.lead_s)
        # Batches sent behind a running one on their slot: how early they come tunes the lead.
        self._sent_behind: set[uuid.UUID] = set()
        # Batch models with a join box: batches sent behind with room, and what was offered.
        self._joins = None if self.engine else joins
        self.joinable: dict[uuid.UUID, _Joinable] = {}
        self._offers: set[asyncio.Task[None]] = set()
        self.ledger = EngineLedger()
        # A batch queued behind another at its worker starts this soon after that one ends.
        self._pickup_s = 0.005
        self.rate = RateMeter(self.config.rate_tau_s)
        self.last_dispatch_at = float("-inf")
        self._queued = {Lane.INTERACTIVE: 0, Lane.BULK: 0}
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._subscription: Subscription | None = None
        self._stopping = False
        self._recently_closed: dict[uuid.UUID, float] = {}
        self._claiming: set[uuid.UUID] = set()  # claimed, not yet on the timeline
        self._learned_until: float | None = None
        self._learned_ids: dict[uuid.UUID, float] = {}
        self._published_shape: LoadSnapshot | None = None
        self._published_at = float("-inf")
        self.weights: dict[str, float] = {}  # tenant -> fair-share weight, from the store
        self._hold_until = float("-inf")
        self._next_due = 0.0
        cfg = self.config
        self._jobs = [
            Job(cfg.slot_refresh_s, self._refresh_slots),
            Job(cfg.reconcile_s, self._reconcile),
            Job(cfg.queue_depth_s, self._refresh_queue_depth),
            Job(cfg.weights_s, self._refresh_weights),
        ]
        if isinstance(self.estimator, LearnedBatchTime):
            self._jobs.append(Job(cfg.learn_s, self._learn))
        self._jobs_wake = asyncio.Event()  # a job brought forward (an arrival at a quiet batcher)
        self._load_job = Job(cfg.publish_load_s, self._publish_load) if loadboard else None
        if self._load_job is not None:
            self._jobs.append(self._load_job)

    # -- inputs ----------------------------------------------------------------------------

    async def on_message(self, message: QueueMessage, delivery: Delivery) -> None:
        entry = self.pending.get(message.id)
        if entry is None:
            received_at = self._clock()
            # The batching delay counts from when the batcher first holds a request; one that
            # was held before (a batcher died, a retry) has waited long enough already.
            fresh = not delivery.redelivered and message.group is None
            pending = Pending(
                id=message.id,
                arrived_at=received_at if fresh else message.created_at,
                deadline=message.deadline,
                lane=message.lane,
                prompt_tokens=message.prompt_tokens,
                max_tokens=message.max_tokens,
                group=message.group,
                tenant=message.tenant,
            )
            entry = _Entry(pending, received_at, created_at=message.created_at)
            joined = self._joined_by_the_api(message, entry)
            if joined is None:
                self.pending[message.id] = entry
            else:
                entry = joined
            if fresh:
                self.rate.observe(received_at)
            self._load_changes(received_at)
            if message.group is not None:
                # The members of a crashed batch come back one message at a time and are
                # overdue: let them all arrive, so they are halved as two batches, not
                # scattered over many small ones.
                self._hold_until = max(self._hold_until, received_at + self.config.group_settle_s)
        elif message.group is not None and entry.pending.group is None:
            # Requeued by a reap while held here (a late joiner of a batch that crashed): it
            # is a suspect now, batched only within its group.
            entry.pending = replace(
                entry.pending, group=message.group, arrived_at=message.created_at
            )
            self._hold_until = max(self._hold_until, self._clock() + self.config.group_settle_s)
        entry.deliveries.append(delivery)  # a duplicate (republished) joins its twin
        self._wake.set()

    def on_event(self, event: Event) -> None:
        if isinstance(event, SequencesFreed) and event.model == self.spec.name:
            if self.ledger.release(uuid.UUID(event.batch_id), event.request_ids):
                self._wake.set()
            return
        if not isinstance(event, BatchClosed) or event.model != self.spec.name:
            return
        batch_id = uuid.UUID(event.batch_id)
        now = self._clock()
        self._recently_closed[batch_id] = now
        if batch_id in self._sent_behind:
            self._sent_behind.discard(batch_id)
            if event.early_s is not None:
                self.slots.lead_s = self.lead.observe(event.early_s)
                metrics().pipeline_lead.labels(self.spec.name).set(self.slots.lead_s)
        if self.engine:
            freed = self.ledger.close(batch_id)
        else:
            freed = self.slots.release(batch_id, now, self._typical_batch_s() + self._pickup_s)
        if freed:
            self._wake.set()

    # -- the loop --------------------------------------------------------------------------

    async def start(self, *, background: bool = True) -> None:
        """Start consuming; with ``background`` also the task that runs :meth:`run_due` (a
        test steps it itself)."""
        now = self._clock()
        if not self.engine:
            for batch_id, _lease in await self._store.open_batches(self.spec.name):
                # A previous batcher's batches still hold their slots.
                self.slots.assign(batch_id, now, self._typical_batch_s())
        self._subscription = self._events.subscribe(
            self.on_event, on_reconnect=self._wake.set, topics=(SLOTS,)
        )
        await self._refresh_slots()
        if self.engine:
            await self._reconcile()
        with contextlib.suppress(Unavailable):
            await self._refresh_weights()
        cfg = self.config
        await self._queue.consume(
            self.spec.name, Lane.INTERACTIVE, self.on_message, cfg.interactive_prefetch
        )
        await self._queue.consume(self.spec.name, Lane.BULK, self.on_message, cfg.bulk_prefetch)
        for job in self._jobs:
            job.due_at = now + job.period_s
        if background:
            self._tasks = [asyncio.create_task(self._background())]
        log.info(
            "batcher_started",
            model=self.spec.name,
            kind="engine" if self.engine else "batch",
            policy=self.policy.kind,
            max_batch_size=self.policy.max_batch_size,
            inflight=len(self.slots),
        )

    async def run(self) -> None:
        await self.start()
        try:
            await self.loop()
        finally:
            await self.stop()

    async def loop(self) -> None:
        while not self._stopping:
            self._wake.clear()  # before deciding: a wake-up during the decision is not lost
            now = self._clock()
            try:
                due = await self.step(now)
            except Unavailable as error:
                log.warning("batcher_backoff", model=self.spec.name, error=error)
                await asyncio.sleep(0.5)
                continue
            now = self._clock()  # the step awaited: how long to sleep counts from its end
            if due is not None and due <= now:
                continue  # state changed: decide again before sleeping
            timeout = None if due is None else due - now
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=timeout)

    async def step(self, now: float) -> float | None:
        """Decide once at ``now`` and carry it out. Returns when to decide again if nothing
        arrives first (``now``: at once; ``None``: only an arrival or a freed slot can change
        the answer)."""
        if now < self._hold_until:
            return self._hold_until
        if self.engine:
            return await self._step_engine(now)
        if self.joinable:
            await self._settle_joiners()
            await self._offer_joiners()
            # Requests arrived while these awaited: a batch formed of them leaves now, not
            # before they were held (a batch's dispatch time is never before its members').
            now = max(now, self._clock())
        free_slots = self.slots.free_slots(now)
        if free_slots == 0 and now < self._next_due:
            # Nothing can leave without a slot; arrivals only wait. Expiry is due at
            # next_due, a slot at the timeline's next free time.
            return _finite(_earliest(self._next_due, self.slots.next_free_at(now)))
        decision = decide(
            [e.pending for e in self.pending.values()],
            now,
            free_slots,
            self.policy,
            self.estimator,
            self.load(now),
        )
        await self._apply(decision, now)
        if decision.batches:
            return now
        self._next_due = float("inf") if decision.wake_at is None else decision.wake_at
        return _finite(
            _earliest(self._next_due, self.slots.next_free_at(now) if free_slots == 0 else None)
        )

    async def _step_engine(self, now: float) -> float | None:
        free = self.ledger.free()
        if free.seqs == 0 and now < self._next_due:
            return _finite(self._next_due)  # nothing fits until room frees or expiry is due
        decision = decide_engine(
            [e.pending for e in self.pending.values()],
            now,
            free,
            self.policy,
            self.estimator,
            self.load(now),
            cost=lambda p: self.ledger.cost(p.prompt_tokens, p.max_tokens),
        )
        await self._apply(decision, now)
        if decision.batches:
            return now
        self._next_due = float("inf") if decision.wake_at is None else decision.wake_at
        return _finite(self._next_due)

    def load(self, now: float) -> Load:
        return Load(
            arrival_rate=self.rate.rate(now),
            busy_until=self.slots.busy_until(now),
            last_dispatch_at=self.last_dispatch_at,
            weights=self.weights,
        )

    def _typical_batch_s(self) -> float:
        """The estimate for a full batch (an engine model: one sequence) of requests shaped
        like those waiting now."""
        waiting = [e.pending for e in self.pending.values()] or [
            Pending(id="", arrived_at=0.0, deadline=0.0, prompt_tokens=100, max_tokens=256)
        ]
        size = 1 if self.engine else self.policy.max_batch_size
        prompt = sum(p.prompt_tokens for p in waiting) / len(waiting)
        longest = max(p.max_tokens for p in waiting)
        return self.estimator.batch_s(BatchShape(size, round(prompt * size), longest))

    async def drain(self) -> None:
        """Begin a graceful stop: take no more messages, and let the loop end once the batch
        it is dispatching has left; :meth:`stop` then returns what is still pending."""
        await self._queue.stop_consuming(self.spec.name)
        self._stopping = True
        self._wake.set()

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in [*self._tasks, *self._offers]:
            task.cancel()
        for task in [*self._tasks, *self._offers]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._subscription is not None:
            await self._subscription.close()
        await self._release_pending()

    async def _release_pending(self) -> None:
        """Hand requests not yet in a batch back to the queue, for the standby or the next
        batcher (they stay ``queued`` in Postgres: nothing to undo there)."""
        entries, self.pending = list(self.pending.values()), {}
        for joinable in self.joinable.values():
            # Offered to a batch: its worker may have claimed it (the next batcher then finds
            # it running and lets it go) or not (queued: batched again).
            entries.extend(joinable.offered.values())
            joinable.offered = {}
        for entry in entries:
            for delivery in entry.deliveries:
                await delivery.release()
        if entries:
            log.info("pending_released", model=self.spec.name, count=len(entries))

    # -- outputs ---------------------------------------------------------------------------

    async def _apply(self, decision: Decision, now: float) -> None:
        if decision.expire:
            ids = [p.id for p in decision.expire]
            await self._store.expire(ids, now, "the deadline cannot be met even if run now")
            await self._settle(ids)
            log.info("expired", model=self.spec.name, count=len(ids))
        for batch in decision.batches:
            await self._dispatch(batch, now)

    async def _dispatch(self, batch: tuple[Pending, ...], now: float) -> None:
        batch_id = uuid7()
        estimated_s = estimate_batch_s(batch, self.estimator)
        # The claim commits the batch before it is on the timeline (no await in between
        # after it): reconciling meanwhile must not take it for another batcher's batch and
        # put it on a slot a second time.
        self._claiming.add(batch_id)
        try:
            claimed = await self._store.claim_batch(
                batch_id=batch_id,
                model=self.spec.name,
                request_ids=[p.id for p in batch],
                now=now,
                estimated_s=estimated_s,
                lease_until=now + estimated_s + self.config.dispatch_grace_s,
                isolation_group=batch[0].group,
            )
            ids = [p.id for p in batch]
            if not claimed:  # all cancelled, expired or already running (a duplicate message)
                await self._settle(ids)
                return
            message = self._message(batch_id, now, estimated_s, claimed)
            if self.engine:
                self.ledger.take(
                    batch_id,
                    {
                        c.id: self.ledger.cost(p.prompt_tokens, p.max_tokens)
                        for c in claimed
                        if (p := self.pending[c.id].pending)
                    },
                )
            else:
                ends_at = self.slots.assign(
                    batch_id, now, estimated_s + self.config.dispatch_overhead_s
                )
                if self.slots.queued_behind(batch_id):
                    if len(self._sent_behind) > 10_000:  # closings missed (a worker died)
                        self._sent_behind.clear()
                    self._sent_behind.add(batch_id)
                    if self._may_join(batch, len(claimed)):
                        self.joinable[batch_id] = self._joinable(batch, claimed, ends_at)
                        message = replace(message, joinable=True)
        finally:
            self._claiming.discard(batch_id)
        self.last_dispatch_at = now
        if message.joinable:
            # Told as soon as it is claimed, not once the broker confirms the hand-over (most
            # of the hand-over's time): what the API admits meanwhile goes to its box at once
            # instead of through this batcher, late for it more often.
            self._announce_joinable(batch_id, estimated_s)
        try:
            await self._dispatcher.dispatch(message, self._time_limit_s(estimated_s))
        except Unavailable as error:
            # Claimed but not handed over: put the members back ourselves rather than wait
            # for the dispatch lease to run out.
            log.warning("dispatch_failed", batch_id=batch_id, error=error)
            # This batcher offered nothing yet (offers wait for a step); what the API put in
            # its box and told us of meanwhile is batched again (nothing will seal the box).
            if (joinable := self.joinable.pop(batch_id, None)) is not None:
                self._take_back(joinable, dict(joinable.offered))
            if self.engine:
                self.ledger.close(batch_id)
            else:
                self.slots.release(batch_id, self._clock())
            reaped = await self._store.reap_batch(
                batch_id, now=self._clock(), outcome=BatchOutcome.ABANDONED
            )
            # Marked published too, or maintenance would publish them again.
            await republish(
                self._queue, self._store, reaped.requeued, now=self._clock(), batch_id=batch_id
            )
        else:
            self._observe_dispatch(message)
        free_after = (
            self.ledger.free().seqs if self.engine else self.slots.free_slots(self._clock())
        )
        log.info(
            "batch_dispatched",
            model=self.spec.name,
            batch_id=batch_id,
            size=len(claimed),
            free_after=free_after,
        )
        await self._settle(ids)

    # -- late joiners (``batchserve/core/joins.py``) ------------------------------------------

    def _may_join(self, batch: tuple[Pending, ...], size: int) -> bool:
        """Whether a batch just sent behind a running one takes late joiners."""
        return (
            self._joins is not None
            and batch[0].group is None  # a retry group runs alone
            and size < self.policy.max_batch_size
        )

    def _joinable(
        self, batch: tuple[Pending, ...], claimed: list[ClaimedRequest], ends_at: float
    ) -> _Joinable:
        taken = {c.id for c in claimed}
        room = self.policy.max_batch_size - len(claimed)
        return _Joinable(
            size=len(claimed),
            capacity=room,
            room=room,
            tokens=sum(p.cost_tokens for p in batch if p.id in taken),
            length_class=length_class(batch[0].max_tokens, self.policy.length_edges),
            ends_by=ends_at,
        )

    def _announce_joinable(self, batch_id: uuid.UUID, estimated_s: float) -> None:
        """Tell the API processes that ``batch_id`` takes joiners, in the background: what
        they admit from now on goes to its box at once (``BatchJoinable``)."""
        joinable = self.joinable[batch_id]
        edges, index = self.policy.length_edges, joinable.length_class
        event = BatchJoinable(
            model=self.spec.name,
            batch_id=str(batch_id),
            room=joinable.capacity,
            starts_by=joinable.ends_by - estimated_s - self.config.dispatch_overhead_s,
            ends_by=joinable.ends_by,
            above=edges[index - 1] if index > 0 else 0,
            upto=edges[index] if index < len(edges) else None,
            budgeted=self.policy.max_batch_tokens is not None,
        )
        task = asyncio.create_task(self._events.publish(event))
        self._offers.add(task)
        task.add_done_callback(self._offers.discard)

    def _joined_by_the_api(self, message: QueueMessage, entry: _Entry) -> _Entry | None:
        """Settle a request the API offered to a batch (``message.joined``) with that batch,
        as if this batcher had offered it: the entry it is held under there (a duplicate
        delivery joins the first). ``None`` when that batch is not on the timeline here (it
        left, or another batcher sent it): then it is batched as any other, and its claim
        finds it where the worker put it."""
        batch_id = uuid.UUID(message.joined) if message.joined else None
        joinable = self.joinable.get(batch_id) if batch_id is not None else None
        if batch_id is None or joinable is None or batch_id not in self.slots:
            return None
        if (held := joinable.offered.get(message.id)) is not None:
            return held
        joinable.offered[message.id] = entry
        joinable.room -= 1
        joinable.tokens += entry.pending.cost_tokens
        return entry

    async def _offer_joiners(self) -> None:
        """Offer pending requests to the batches sent ahead that have room and have not
        started. An offered request leaves ``pending`` (until :meth:`_settle_joiners`, or at
        once if refused); the offer itself goes on in the background, so that deciding and
        dispatching never wait for it."""
        for batch_id, joinable in self.joinable.items():
            if not self.pending or len(self.pending) > _JOIN_SCAN_MAX:
                return
            if not joinable.open:
                continue
            if not self.slots.queued_behind(batch_id):  # its slot has freed: it is starting
                joinable.open = False
                continue
            chosen = self._joiners_for(joinable)
            if not chosen:
                continue
            entries = {p.id: self.pending.pop(p.id) for p in chosen}
            joinable.offered.update(entries)
            joinable.room -= len(chosen)
            joinable.tokens += sum(p.cost_tokens for p in chosen)
            joinable.offering += 1
            task = asyncio.create_task(self._offer(batch_id, joinable, entries))
            self._offers.add(task)
            task.add_done_callback(self._offers.discard)

    async def _offer(
        self, batch_id: uuid.UUID, joinable: _Joinable, entries: dict[str, _Entry]
    ) -> None:
        """Read what the worker will run of them and put it in the batch's box."""
        assert self._joins is not None
        try:
            try:
                found = await self._store.queued_inputs(list(entries))
            except Exception as error:  # nothing offered: back to pending
                log.warning("join_offer_failed", batch_id=batch_id, error=error)
                joinable.open = False
                self._take_back(joinable, entries)
                return
            joiners = [c.item(entries[c.id].received_at) for c in found]
            try:
                accepted = await self._joins.offer(batch_id, joiners, joinable.capacity)
            except Exception as error:  # maybe offered: settling reads what became of them
                log.warning("join_offer_failed", batch_id=batch_id, error=error)
                joinable.open, accepted = False, True
            if not accepted:  # sealed (its model has started) or full (the API offered too)
                joinable.open = False
                metrics().batch_joins_refused.labels(self.spec.name).inc(len(joiners))
                self._take_back(joinable, entries)
            else:
                metrics().batch_joins_offered.labels(self.spec.name, "batcher").inc(len(joiners))
            # Accepted, or no longer queued (cancelled, expired): settled with the batch.
        finally:
            joinable.offering -= 1
            self._wake.set()

    async def offered(self) -> None:
        """Wait until the offers under way are made (a stepped test steps with this)."""
        while self._offers:
            await asyncio.gather(*list(self._offers), return_exceptions=True)

    def _take_back(self, joinable: _Joinable, entries: dict[str, _Entry]) -> None:
        for request_id, entry in entries.items():
            if joinable.offered.pop(request_id, None) is None:
                continue  # released meanwhile (a graceful stop)
            twin = self.pending.get(request_id)
            if twin is None:
                self.pending[request_id] = entry
            else:
                twin.deliveries.extend(entry.deliveries)

    def _joiners_for(self, joinable: _Joinable) -> list[Pending]:
        """Who may join: outside any retry group, of the batch's length class, with a
        deadline its end still meets; in serving order, within its room and token budget."""
        edges, budget = self.policy.length_edges, self.policy.max_batch_tokens
        candidates = [
            e.pending
            for e in self.pending.values()
            if e.pending.group is None
            and e.pending.deadline >= joinable.ends_by
            and length_class(e.pending.max_tokens, edges) == joinable.length_class
        ]
        chosen: list[Pending] = []
        tokens = joinable.tokens
        for p in serving_order(candidates, self.weights):
            if len(chosen) >= joinable.room:
                break
            if budget is not None and tokens + p.cost_tokens > budget:
                continue
            chosen.append(p)
            tokens += p.cost_tokens
        return chosen

    async def _settle_joiners(self) -> None:
        """Once a batch that took offers has left the timeline (it ran, or was reaped), its
        worker's claim is over: an offered request still queued comes back to ``pending``;
        any other (claimed into the batch, or cancelled) is acked."""
        done = [
            b
            for b, j in self.joinable.items()
            if b not in self.slots and b not in self._claiming and not j.offering
        ]
        for batch_id in done:
            joinable = self.joinable[batch_id]
            if joinable.offered:
                try:
                    placed = await self._store.placements_of(list(joinable.offered))
                except Unavailable as error:
                    log.warning("joiners_unsettled", batch_id=batch_id, error=error)
                    return  # at the next step
                offered = dict(joinable.offered)
                back = {r: e for r, e in offered.items() if placed.get(r, (None,))[0] is S.QUEUED}
                joined = [
                    e
                    for r, e in offered.items()
                    if placed.get(r, (None, None))[1] == batch_id and r not in back
                ]
                self._take_back(joinable, back)  # a twin: republished meanwhile (reaped)
                for request_id, entry in offered.items():
                    if request_id not in back:
                        for delivery in entry.deliveries:
                            await delivery.ack()
                log.info(
                    "joiners_settled",
                    model=self.spec.name,
                    batch_id=batch_id,
                    offered=len(offered),
                    returned=len(back),
                )
                if back:
                    self._wake.set()
            else:
                joined = []
            self._observe_size(joinable.size + len(joined))
            self._observe_waits(
                [(e.pending.lane, e.created_at, e.received_at, e.received_at) for e in joined]
            )
            del self.joinable[batch_id]

    def _message(
        self, batch_id: uuid.UUID, now: float, estimated_s: float, claimed: list[ClaimedRequest]
    ) -> BatchMessage:
        items = []
        for c in claimed:
            entry = self.pending[c.id]
            time_limit = None
            if self.engine:  # each sequence's own limit: its max_tokens at the learned speed
                time_limit = sequence_time_limit_s(self._generation_s(entry.pending))
            deadline = entry.pending.deadline if self.engine else None
            items.append(c.item(entry.received_at, deadline=deadline, time_limit_s=time_limit))
        return BatchMessage(
            batch_id=str(batch_id),
            model=self.spec.name,
            dispatched_at=now,
            estimated_s=estimated_s,
            items=tuple(items),
        )

    def _generation_s(self, pending: Pending) -> float:
        """How long a sequence takes to generate its ``max_tokens`` once it has begun, at the
        learned speed or a full engine's (an upper bound: this sets its time limit)."""
        cost = SequenceCost.of(self.estimator, crowded=True)
        if cost is not None:
            return cost.per_token_s * pending.max_tokens
        return estimate_batch_s((pending,), self.estimator)

    def _time_limit_s(self, estimated_s: float) -> float | None:
        """The worker-side kill limit of a batch task. An engine task only hands its batch to
        the engine (each sequence has its own limit), so it has none."""
        if self.engine:
            return None
        return self.spec.time_limit_s or time_limit_s(estimated_s)

    def _observe_dispatch(self, message: BatchMessage) -> None:
        """Batch size and fill (a joinable batch's once its late joiners are known), and each
        member's waits (the same spans as its timings)."""
        metrics().batches_dispatched.labels(self.spec.name).inc()
        if not message.joinable:
            self._observe_size(len(message.items))
        waits = []
        for item in message.items:
            entry = self.pending.get(item.request_id)
            lane = entry.pending.lane if entry is not None else Lane.INTERACTIVE
            waits.append((lane, item.created_at, item.received_at, message.dispatched_at))
        self._observe_waits(waits)

    def _observe_size(self, size: int) -> None:
        found = metrics()
        found.batch_size.labels(self.spec.name).observe(size)
        found.batch_fill_ratio.labels(self.spec.name).observe(size / self.policy.max_batch_size)

    def _observe_waits(self, waits: list[tuple[Lane, float, float, float]]) -> None:
        """(lane, created, received, its batch left) of each member: its queue and batch waits
        (a late joiner's batch left before it was received: no batch wait)."""
        found, model = metrics(), self.spec.name
        for lane, created_at, received_at, left_at in waits:
            found.queue_wait.labels(model, lane.value).observe(max(0.0, received_at - created_at))
            found.batch_wait.labels(model, lane.value).observe(max(0.0, left_at - received_at))

    async def _settle(self, ids: list[str]) -> None:
        for request_id in ids:
            entry = self.pending.pop(request_id, None)
            if entry is not None:
                for delivery in entry.deliveries:
                    await delivery.ack()


def _finite(due: float) -> float | None:
    return None if math.isinf(due) else due
