"""The live batcher stepped with a fake clock on the embedded adapters: no sleeps, no servers.

``step(now)`` is one decision and ``run_due(now)`` the background jobs due then (slot and
capacity refresh, reconcile, learning, load publishing), exactly what the running loop calls.
A job that exists but is never scheduled fails here: that is how the learned batch time once
went unwired.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from batchserve.api.deadlines import RecentAdmissions, refuse_if_hopeless
from batchserve.batching.batcher import BatcherConfig, ModelBatcher
from batchserve.batching.estimate import BatchShape, FixedBatchTime, LearnedBatchTime
from batchserve.core.broker import Delivery, MemoryRequestQueue
from batchserve.core.domain import (
    BatchClosed,
    BatchItem,
    BatchMessage,
    BatchOutcome,
    ItemResult,
    Lane,
    QueueMessage,
    RequestState,
    SequencesFreed,
    Timings,
)
from batchserve.core.errors import DeadlineUnmeetable, Unavailable
from batchserve.core.events import MemoryEventBus
from batchserve.core.loadboard import LOAD_KEEPALIVE_S, LoadSnapshot, MemoryLoadBoard
from batchserve.core.slots import MemorySlotDirectory
from batchserve.core.store import ItemOutcome, JobStore
from batchserve.models.registry import ModelSpec
from batchserve.workers.maintenance import Maintenance, MaintenanceConfig, TickReport
from tests.support.stepped import Clock, sqlite_store, submit
from tests.support.stepped import command as stepped_command

ENGINE = ModelSpec(name="engine", backend="transformers", max_batch_size=8)
ECHO = ModelSpec(name="echo", backend="fixed", batch_time_ms=100, max_batch_size=4)
PROFILE = {"prefill_tokens_per_s": 1000.0, "decode_step_s": 0.05, "decode_step_s_alone": 0.02}


class Sent:
    """A dispatcher that keeps what it is handed."""

    def __init__(self) -> None:
        self.messages: list[BatchMessage] = []
        self.limits: list[float | None] = []
        self.refuse = False  # as a worker broker that is down

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        if self.refuse:
            raise Unavailable("the worker broker is down", component="broker")
        self.messages.append(message)
        self.limits.append(time_limit_s)

    @property
    def ids(self) -> list[str]:
        return [i.request_id for m in self.messages for i in m.items]


class Rig:
    made: list[Rig] = []  # closed after each test by close_rigs

    def __init__(self, tmp_path: Path, spec: ModelSpec, **batcher: object) -> None:
        Rig.made.append(self)
        self.clock = Clock(now=time.time())
        self.events = MemoryEventBus()
        self.store: JobStore = sqlite_store(tmp_path, on_change=self.events.publish)
        self.slots = MemorySlotDirectory()
        self.queue = MemoryRequestQueue()
        self.board = MemoryLoadBoard()
        self.sent = Sent()
        self.spec = spec
        self.batcher = ModelBatcher(
            spec,
            store=self.store,
            queue=self.queue,
            dispatcher=self.sent,
            slots=self.slots,
            events=self.events,
            config=BatcherConfig(),
            loadboard=self.board,
            clock=self.clock,
            **batcher,  # type: ignore[arg-type]
        )

    def engines(self, seqs: int, tokens: int = 100_000) -> None:
        self.slots.register(
            self.spec.name, "w1", seqs, float("inf"), tokens=tokens, profile=PROFILE
        )

    async def start(self) -> None:
        await self.batcher.start(background=False)

    async def close(self) -> None:
        await self.batcher.stop()
        await self.queue.close()  # its consumers' tasks, or the next test's loop finds them
        await self.store.engine.dispose()

    async def arrive(
        self, count: int, *, max_tokens: int = 16, timeout_s: float = 600.0
    ) -> list[str]:
        """Requests committed and handed to the batcher, as the API and the broker would."""
        texts = [f"request number {n}" for n in range(count)]
        ids = await submit(
            self.store,
            texts,
            model=self.spec.name,
            now=self.clock(),
            max_tokens=max_tokens,
            timeout_s=timeout_s,
        )
        for request_id in ids:
            message = QueueMessage(
                id=request_id,
                model=self.spec.name,
                lane=Lane.INTERACTIVE,
                tenant="t1",
                created_at=self.clock(),
                deadline=self.clock() + timeout_s,
                prompt_tokens=3,
                max_tokens=max_tokens,
            )
            await self.batcher.on_message(message, _Delivery())
        return ids

    async def decide(self) -> None:
        """Step until the batcher has nothing more to do at this moment."""
        for _ in range(100):
            due = await self.batcher.step(self.clock())
            if due is None or due > self.clock():
                return
        raise AssertionError("the batcher never settled")


@pytest.fixture(autouse=True)
async def close_rigs() -> AsyncIterator[None]:
    yield
    made, Rig.made = Rig.made, []
    for rig in made:
        await rig.close()


class _Delivery(Delivery):
    redelivered = False

    async def ack(self) -> None:
        return None

    async def release(self) -> None:
        return None


async def test_an_engine_model_is_sent_only_what_its_engines_hold(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ENGINE)
    rig.engines(seqs=5)
    await rig.start()
    ids = await rig.arrive(12)

    await rig.decide()
    assert len(rig.sent.ids) == 5  # no more than the engine's five sequences
    assert all(len(m.items) <= ENGINE.max_batch_size for m in rig.sent.messages)

    # Two sequences leave their engine: two more go at once, the rest keep waiting.
    first = rig.sent.messages[0]
    gone = tuple(i.request_id for i in first.items[:2])
    rig.batcher.on_event(SequencesFreed(ENGINE.name, first.batch_id, gone))
    await rig.decide()
    assert len(rig.sent.ids) == 7 and set(rig.sent.ids) <= set(ids)
    assert len(rig.batcher.pending) == 5


async def test_an_engine_batch_carries_deadlines_and_time_limits(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ENGINE)
    rig.engines(seqs=4)
    await rig.start()
    await rig.batcher.run_due(rig.clock() + 1)  # reads the engine's measured speed
    await rig.arrive(2, max_tokens=200, timeout_s=300.0)

    await rig.decide()

    [message] = rig.sent.messages
    assert rig.sent.limits == [None]  # no kill limit on the hand-over task
    for item in message.items:
        assert item.deadline is not None and abs(item.deadline - (rig.clock() + 300.0)) < 1.0
        # 200 decode steps of 50 ms: 10 s of generation, so 10 s and a minute more.
        assert item.time_limit_s is not None and abs(item.time_limit_s - 70.0) < 0.1


async def test_deadlines_are_held_to_the_speed_alone_and_time_limits_to_a_full_engine(
    tmp_path: Path,
) -> None:
    # The engine measured 20 ms a step alone and 50 ms with every row busy. 1,000 tokens due in
    # 30 s: 20 s alone, so it can be met "if run now" and admission and expiry both keep it
    # (the crowded 50 s once refused such requests on an idle engine); stuck only past 4 x 50 s.
    rig = Rig(tmp_path, ENGINE)
    rig.engines(seqs=4)
    await rig.start()
    await rig.batcher.run_due(rig.clock() + 1)  # reads the speed and publishes the load
    snapshot = await rig.board.fresh(ENGINE.name, rig.clock())
    assert snapshot is not None
    command = stepped_command(
        "x", model=ENGINE.name, now=rig.clock(), max_tokens=1000, timeout_s=30.0
    )
    recent = RecentAdmissions()
    await refuse_if_hopeless(rig.board, command, rig.clock(), recent)  # admitted
    with pytest.raises(DeadlineUnmeetable):
        await refuse_if_hopeless(
            rig.board, dataclasses.replace(command, max_tokens=2000), rig.clock(), recent
        )

    await rig.arrive(1, max_tokens=1000, timeout_s=30.0)
    await rig.decide()

    [message] = rig.sent.messages
    [item] = message.items
    assert item.time_limit_s is not None and abs(item.time_limit_s - 200.0) < 0.1


async def test_the_capacity_of_a_reaped_batch_comes_back_by_reconciling(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ENGINE)
    rig.engines(seqs=2)
    await rig.start()
    await rig.arrive(4)
    await rig.decide()
    assert len(rig.sent.ids) == 2
    # The worker died: maintenance reaped the batch, and its BatchClosed event was lost.
    batch_id = uuid.UUID(rig.sent.messages[0].batch_id)
    await rig.store.reap_batch(batch_id, now=rig.clock(), outcome=BatchOutcome.ABANDONED)

    await rig.batcher.run_due(rig.clock() + BatcherConfig().reconcile_s)
    await rig.decide()

    assert len(rig.sent.ids) == 4  # the other two went once Postgres showed the room free


async def test_the_learned_sequence_time_is_fed_by_the_running_batcher(tmp_path: Path) -> None:
    rig = Rig(tmp_path, ENGINE)
    rig.engines(seqs=4)
    await rig.start()  # reads what the engines announced, their measured speed included
    assert rig.batcher.estimate()["source"] == "engine-profile"
    # Four requests finish in the engine: 1 s fixed and 20 ms a generated token.
    await rig.arrive(4, max_tokens=50)
    await rig.decide()
    for message in rig.sent.messages:
        batch_id = uuid.UUID(message.batch_id)
        start = await rig.store.start_batch(batch_id, "w1/1", rig.clock(), 2.0)
        assert start is not None and not hasattr(start, "requeued")
        outcomes = [
            ItemOutcome(
                _result(i.request_id, tokens=10 + 4 * n),
                _timings(1.0 + 0.02 * (10 + 4 * n)),
                finished_at=rig.clock(),
            )
            for n, i in enumerate(message.items)
        ]
        written = await rig.store.complete_items(
            batch_id, attempt=1, outcomes=outcomes, now=rig.clock()
        )
        assert written is not None and len(written) == len(message.items)
    assert rig.batcher.estimate()["observations"] == 0

    # Only the batcher's own schedule (run_due at its learning period) feeds the estimator.
    await rig.batcher.run_due(rig.clock() + BatcherConfig().learn_s + 1)

    assert int(str(rig.batcher.estimate()["observations"])) >= 4


async def test_a_result_committed_after_a_later_finish_is_still_learned(
    tmp_path: Path,
) -> None:
    # Two workers: one stamps its finish first but commits its write after the other's, which
    # finished later. The learner read the later one already; the earlier must not be lost.
    rig = Rig(tmp_path, ENGINE)
    rig.engines(seqs=4)
    await rig.start()
    await rig.arrive(4, max_tokens=50)
    await rig.decide()
    (message,) = rig.sent.messages
    batch_id = uuid.UUID(message.batch_id)
    start = await rig.store.start_batch(batch_id, "w1/1", rig.clock(), 2.0)
    assert start is not None and not hasattr(start, "requeued")
    early, late = message.items[:2], message.items[2:]
    stamped_early = rig.clock()

    def outcomes(items: Sequence[BatchItem], at: float) -> list[ItemOutcome]:
        return [
            ItemOutcome(_result(i.request_id, 10), _timings(1.2), finished_at=at) for i in items
        ]

    later = stamped_early + 1.0
    await rig.store.complete_items(batch_id, attempt=1, outcomes=outcomes(late, later), now=later)
    await rig.batcher.run_due(rig.clock() + BatcherConfig().learn_s + 1)
    assert rig.batcher.estimate()["observations"] == 2
    written = await rig.store.complete_items(
        batch_id, attempt=1, outcomes=outcomes(early, stamped_early), now=later
    )
    assert written is not None and len(written) == 2

    await rig.batcher.run_due(rig.clock() + 2 * BatcherConfig().learn_s + 2)
    assert rig.batcher.estimate()["observations"] == 4
    await rig.batcher.run_due(rig.clock() + 3 * BatcherConfig().learn_s + 3)
    assert rig.batcher.estimate()["observations"] == 4  # nothing learned twice


async def test_a_learned_batch_time_is_scheduled_for_batch_models(tmp_path: Path) -> None:
    learned = LearnedBatchTime(FixedBatchTime(0.1), min_observations=2)
    rig = Rig(tmp_path, ECHO, estimator=learned)
    rig.slots.register(ECHO.name, "w1", 1, float("inf"))
    await rig.start()
    for _ in range(3):
        await rig.arrive(4)
        await rig.decide()
        message = rig.sent.messages[-1]
        batch_id = uuid.UUID(message.batch_id)
        start = await rig.store.start_batch(batch_id, "w1", rig.clock(), 2.0)
        assert start is not None and not hasattr(start, "requeued")
        outcomes = [ItemOutcome(_result(i.request_id), _timings(0.5)) for i in message.items]
        rig.clock.advance(0.5)
        await rig.store.complete_batch(
            batch_id, attempt=1, outcomes=outcomes, now=rig.clock(), model_ms=500.0
        )
        rig.batcher.on_event(_closed(ECHO.name, message.batch_id))
    assert learned.num_observations == 0

    await rig.batcher.run_due(rig.clock() + BatcherConfig().learn_s + 1)

    assert learned.num_observations == 3
    assert rig.batcher.estimate()["source"] == "learned"
    assert abs(learned.batch_s(_shape(4)) - 0.5) < 0.01


async def test_the_pipeline_lead_is_learned_from_how_early_batches_come(tmp_path: Path) -> None:
    """Each batch sent behind a running one says how early it came to its slot; the batcher
    sends the next one that much later (or earlier, when they come late), and a batch sent to
    an idle slot, where coming 'late' means nothing, tunes nothing."""
    rig = Rig(tmp_path, ECHO)
    rig.slots.register(ECHO.name, "w1", 1, float("inf"))
    await rig.start()
    assert rig.batcher.slots.lead_s == BatcherConfig().pipeline_lead_s == 0.03

    async def next_batch() -> tuple[str, float]:
        """Requests wait; the next batch leaves exactly ``lead`` before the running one's
        expected end, not a millisecond sooner; returns it and the lead it left with."""
        await rig.arrive(4)
        free_at = rig.batcher.slots.next_free_at(rig.clock())
        assert free_at is not None
        sent = len(rig.sent.messages)
        rig.clock.now = free_at - 0.0005
        await rig.decide()
        assert len(rig.sent.messages) == sent
        rig.clock.now = free_at
        await rig.decide()
        assert len(rig.sent.messages) == sent + 1
        return rig.sent.messages[-1].batch_id, rig.batcher.slots.lead_s

    await rig.arrive(4)
    await rig.decide()  # to the idle slot
    running = rig.sent.messages[-1].batch_id
    behind, lead = await next_batch()
    # The first batch's slot stood idle for long before it came: that is no lateness.
    rig.batcher.on_event(_closed(ECHO.name, running, early_s=-5.0))
    assert rig.batcher.slots.lead_s == lead == 0.03
    leads = []
    for _ in range(200):  # each batch sent behind another came 15 ms early
        following, lead = await next_batch()
        leads.append(lead)
        rig.clock.advance(0.005)
        rig.batcher.on_event(_closed(ECHO.name, behind, early_s=0.015))
        behind = following
    assert leads == sorted(leads, reverse=True) and leads[-1] < 0.03 - 0.01
    # Late ones push it back up, faster than early ones bring it down.
    before = rig.batcher.slots.lead_s
    rig.batcher.on_event(_closed(ECHO.name, behind, early_s=-0.004))
    assert rig.batcher.slots.lead_s > before + 0.0015
    assert rig.batcher.lead.late == 1 and rig.batcher.lead.early == 200


async def test_a_batch_that_could_not_be_handed_over_is_requeued_and_published_once(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, ECHO)
    rig.slots.register(ECHO.name, "w1", 1, float("inf"))
    await rig.start()
    ids = await rig.arrive(4)
    await rig.store.mark_published(ids, now=rig.clock())  # as the API does once they are sent
    rig.sent.refuse = True
    published: list[str] = []
    publish = rig.queue.publish

    async def counted(messages: Sequence[QueueMessage]) -> None:
        published.extend(m.id for m in messages)
        await publish(messages)

    rig.queue.publish = counted  # type: ignore[method-assign]

    await rig.decide()  # claimed, not handed over: the batcher requeues and publishes them

    assert rig.sent.messages == []
    records = [await rig.store.get(uuid.UUID(i)) for i in ids]
    assert {r.state for r in records if r is not None} == {RequestState.QUEUED}
    assert sorted(published) == sorted(ids)
    # Marked published as well: maintenance's republish pass, well after its delay, leaves
    # them be (it published all four again ~5 s later when the batcher did not mark them).
    config = MaintenanceConfig()
    maintenance = Maintenance(
        store=rig.store, queue=rig.queue, events=rig.events, config=config, clock=rig.clock
    )
    report = TickReport()
    await maintenance.republish(rig.clock() + config.republish_after_s + 60.0, report)
    assert report.republished == 0
    assert sorted(published) == sorted(ids)


def _result(request_id: str, tokens: int = 4) -> ItemResult:
    return ItemResult(
        request_id, output="x", finish_reason="length", prompt_tokens=3, completion_tokens=tokens
    )


def _timings(model_s: float) -> Timings:
    return Timings(1.0, 1.0, model_s * 1000.0, model_s * 1000.0 + 2.0)


def _closed(model: str, batch_id: str, *, early_s: float | None = None) -> BatchClosed:
    return BatchClosed(model=model, batch_id=batch_id, outcome="succeeded", early_s=early_s)


def _shape(size: int) -> BatchShape:
    return BatchShape(size, 3 * size, 16)


class CountingBoard(MemoryLoadBoard):
    def __init__(self) -> None:
        super().__init__()
        self.published: list[float] = []

    async def publish(self, snapshot: LoadSnapshot) -> None:
        self.published.append(snapshot.at)
        await super().publish(snapshot)


async def test_load_is_published_when_it_changes_and_kept_fresh_while_it_does_not(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, ECHO)
    rig.board = board = CountingBoard()
    rig.batcher._loadboard = board
    rig.slots.register(ECHO.name, "w1", 1, float("inf"))
    job = rig.batcher._load_job
    assert job is not None
    checks: list[float] = []
    check = job.run

    async def counted() -> None:
        checks.append(rig.clock())
        await check()

    job.run = counted
    await rig.start()
    start = rig.clock()

    async def tick(seconds: float) -> None:
        """The background jobs for ``seconds``, every publish_load_s, as the loop runs them."""
        for _ in range(round(seconds / BatcherConfig().publish_load_s)):
            rig.clock.advance(BatcherConfig().publish_load_s)
            await rig.batcher.run_due(rig.clock())

    await tick(2.0)  # idle: the same load, kept fresh for readers
    gaps = [b - a for a, b in zip([start, *board.published], board.published, strict=False)]
    assert 3 <= len(board.published) <= 5 and max(gaps) <= LOAD_KEEPALIVE_S + 0.11, gaps
    fresh = await board.fresh(ECHO.name, rig.clock())
    assert fresh is not None and fresh.pending_interactive == 0
    # Quiet, the load is looked at only when its keep-alive is due, not every publish_load_s.
    assert len(checks) == len(board.published), checks

    before = len(board.published)
    await rig.arrive(2)  # a change: checked and published at once, not a keep-alive later
    await rig.batcher.run_due(rig.clock())
    assert len(board.published) == before + 1
    snapshot = await board.read(ECHO.name)
    assert snapshot is not None and snapshot.pending_interactive == 2
    checked = len(checks)
    await tick(0.5)  # no longer quiet: checked every publish_load_s
    assert len(checks) == checked + 5

    # Once its requests have run, the batcher is quiet again, though the arrival rate it
    # publishes decays for seconds: no reader acts on that rate, so it is no change.
    await rig.decide()
    [batch] = rig.sent.messages
    rig.batcher.on_event(_closed(ECHO.name, batch.batch_id))
    await tick(0.1)
    assert rig.batcher.rate.rate(rig.clock()) > 0.5
    before, checked = len(board.published), len(checks)
    await tick(3.0)
    assert len(board.published) - before <= 6 and len(checks) - checked <= 6


@pytest.mark.parametrize("spec", [ECHO, ENGINE], ids=["batch", "engine"])
async def test_a_model_with_no_worker_and_no_batch_costs_no_reconciling_or_learning_query(
    tmp_path: Path, spec: ModelSpec, monkeypatch: pytest.MonkeyPatch
) -> None:
    learned = LearnedBatchTime(FixedBatchTime(0.1), min_observations=2)
    rig = Rig(tmp_path, spec, **({"estimator": learned} if spec.backend == "fixed" else {}))
    assert isinstance(rig.batcher.estimator, LearnedBatchTime)  # its learning job is scheduled
    await rig.start()
    queries: list[str] = []
    for verb in ("open_batches", "running_members", "finished_batches", "finished_sequences"):
        real = getattr(rig.store, verb)

        async def counted(
            *args: object, _real: Any = real, _verb: str = verb, **kwargs: object
        ) -> Any:
            queries.append(_verb)
            return await _real(*args, **kwargs)

        monkeypatch.setattr(rig.store, verb, counted)
    for _ in range(30):  # 3 s of background jobs, no worker anywhere
        rig.clock.advance(0.1)
        await rig.batcher.run_due(rig.clock())
    assert queries == []

    if spec.backend == "fixed":  # a worker arrives: reconciled again within its period
        rig.slots.register(spec.name, "w1", 1, float("inf"))
    else:
        rig.engines(4)
    for _ in range(25):
        rig.clock.advance(0.1)
        await rig.batcher.run_due(rig.clock())
    assert "open_batches" in queries or "running_members" in queries  # reconciled again
    assert "finished_batches" in queries or "finished_sequences" in queries  # and learning
