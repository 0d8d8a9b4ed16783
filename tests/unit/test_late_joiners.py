"""Late joiners, stepped with a fake clock: the batcher and a worker's runner on one store.

A batch sent behind a running one with room takes the requests that arrive before its model
starts; the worker takes them as its model starts, runs them with the rest and claims them
a moment later (``JOIN_CLAIM_DELAY_S``). An offer
after that is refused and the request waits for the next batch; an offer the worker never
took (its batch reaped first) comes back to the batcher. Every request ends once, each
broker delivery is acked once, and only when its request is no longer queued.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select

from batchserve.api.group_commit import Admitter
from batchserve.api.joiners import JoinOffers
from batchserve.batching.batcher import BatcherConfig, ModelBatcher
from batchserve.core.broker import Delivery, MemoryRequestQueue
from batchserve.core.domain import (
    BatchClosed,
    BatchItem,
    BatchJoinable,
    BatchMessage,
    BatchOutcome,
    ItemResult,
    Lane,
    QueueMessage,
    RequestState,
    SubmitCommand,
)
from batchserve.core.errors import Unavailable
from batchserve.core.events import MemoryEventBus
from batchserve.core.joins import MemoryJoinBox
from batchserve.core.loadboard import MemoryLoadBoard
from batchserve.core.slots import MemorySlotDirectory
from batchserve.core.store import Admission, ClaimedRequest, JobStore
from batchserve.core.tables import batches_table as batches_t
from batchserve.models.base import Backend, OnResult
from batchserve.models.registry import ModelSpec
from batchserve.workers.runner import JOIN_CLAIM_DELAY_S, BatchRunner, RunOutput
from tests.support.stepped import Clock, command, sqlite_store, store_seconds, submit

ECHO = ModelSpec(name="echo", backend="fixed", batch_time_ms=100, max_batch_size=4)


class _Echo(Backend):
    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def run(self, items: object, on_result: OnResult | None = None) -> list[ItemResult]:
        ids = [i.request_id for i in items]  # type: ignore[attr-defined]
        self.batches.append(ids)
        return [ItemResult(r, output=f"echo {r}", finish_reason="stop") for r in ids]


class _Delivery(Delivery):
    redelivered = False

    def __init__(self, request_id: str, acks: dict[str, int]) -> None:
        self.request_id, self._acks = request_id, acks

    async def ack(self) -> None:
        self._acks[self.request_id] = self._acks.get(self.request_id, 0) + 1

    async def release(self) -> None:
        return None


class Rig:
    def __init__(self, tmp_path: Path) -> None:
        self.clock = Clock(now=time.time())
        self.events = MemoryEventBus()
        self.store: JobStore = sqlite_store(tmp_path, on_change=self.events.publish)
        self.joins = MemoryJoinBox()
        self.slots = MemorySlotDirectory()
        self.slots.register(ECHO.name, "w1", 1, float("inf"))
        self.sent: list[BatchMessage] = []
        self.acks: dict[str, int] = {}
        self.batcher = ModelBatcher(
            ECHO,
            store=self.store,
            queue=MemoryRequestQueue(),
            dispatcher=self,
            slots=self.slots,
            events=self.events,
            config=BatcherConfig(),
            loadboard=MemoryLoadBoard(),
            clock=self.clock,
            joins=self.joins,
        )
        self.backend = _Echo()
        self.runner = BatchRunner(
            store=self.store,
            events=self.events,
            queue=MemoryRequestQueue(),
            backend=self.backend,
            worker_id="w1",
            lease_s=2.0,
            clock=self.clock,
            joins=self.joins,
        )

        self.api = JoinOffers(self.joins, self.events, self.clock)
        self.api.start()

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        self.sent.append(message)

    async def admit(self, count: int) -> list[QueueMessage]:
        """Requests admitted by the API as its group commit does: offered to an open box as
        they commit (here the offer first), their messages (naming the batch they joined)
        delivered to the batcher."""
        commands = [command(f"a{n}", model=ECHO.name, now=self.clock()) for n in range(count)]
        joined = await self.api.offer(commands)
        outcomes = await self.store.submit(commands)
        messages = [
            replace(o.message, joined=joined.get(o.message.id))
            for o in outcomes
            if isinstance(o, Admission) and o.message is not None
        ]
        for message in messages:
            await self.batcher.on_message(message, _Delivery(message.id, self.acks))
        return messages

    async def arrive(self, count: int) -> list[str]:
        ids = await submit(
            self.store, [f"r{n}" for n in range(count)], model=ECHO.name, now=self.clock()
        )
        for request_id in ids:
            message = QueueMessage(
                id=request_id,
                model=ECHO.name,
                lane=Lane.INTERACTIVE,
                tenant="t1",
                created_at=self.clock(),
                deadline=self.clock() + 600.0,
                prompt_tokens=3,
                max_tokens=4,
            )
            await self.batcher.on_message(message, _Delivery(request_id, self.acks))
        return ids

    async def decide(self) -> None:
        """Step until the batcher has nothing more to do now, its offers made."""
        for _ in range(100):
            due = await self.batcher.step(self.clock())
            await self.batcher.offered()
            if due is None or due > self.clock():
                return
        raise AssertionError("the batcher never settled")

    async def send_behind(self) -> tuple[BatchMessage, BatchMessage]:
        """One batch to the idle slot, then one of one request sent behind it."""
        await self.arrive(1)
        await self.decide()
        running = self.sent[-1]
        await self.arrive(1)
        free_at = self.batcher.slots.next_free_at(self.clock())
        assert free_at is not None
        self.clock.now = free_at
        await self.decide()
        behind = self.sent[-1]
        assert behind is not running and len(behind.items) == 1
        return running, behind

    def closed(self, message: BatchMessage, outcome: str = "succeeded") -> None:
        self.batcher.on_event(
            BatchClosed(model=ECHO.name, batch_id=message.batch_id, outcome=outcome)
        )

    async def both_ended(
        self, running: BatchMessage, behind: BatchMessage, joiners: list[str]
    ) -> None:
        """Both batches end: the one behind's members, its joiners with them, succeeded, each
        joiner's delivery acked once."""
        self.closed(running)
        self.closed(behind)
        await self.decide()
        states = await self.states([behind.items[0].request_id, *joiners])
        assert set(states.values()) == {RequestState.SUCCEEDED}
        assert all(self.acks[r] == 1 for r in joiners)

    async def states(self, ids: list[str]) -> dict[str, RequestState]:
        return await self.store.states_of(ids)


async def run_in_a_thread(runner: BatchRunner, message: BatchMessage) -> None:
    """As a Celery pool process runs a batch (``WorkerRuntime.run``): the lease on the loop,
    the seal and the model in another thread, the results back on the loop."""
    batch = await runner.open(message)

    def model_thread() -> RunOutput | None:
        if not batch.ours:
            return None
        batch.take_joiners_blocking()
        return batch.run_model()

    output = await asyncio.to_thread(model_thread)
    await batch.conclude(output)


@pytest.mark.parametrize("sealed_from", ["loop", "model thread"])
async def test_requests_that_arrive_before_a_sent_batch_starts_ride_in_it(
    tmp_path: Path, sealed_from: str
) -> None:
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    assert not running.joinable and behind.joinable  # only a batch sent behind, with room

    joiners = await rig.arrive(2)
    await rig.decide()
    assert len(rig.sent) == 2 and not rig.batcher.pending  # offered, not a batch of their own
    assert all(rig.acks.get(r, 0) == 0 for r in joiners)  # held until settled

    # The slot frees: the worker seals the box and claims what was offered, then runs them.
    if sealed_from == "loop":
        await rig.runner.run(behind)
    else:
        await run_in_a_thread(rig.runner, behind)
    assert rig.backend.batches == [[behind.items[0].request_id, *joiners]]
    late = await rig.arrive(1)  # the box is sealed: this one waits for the next batch
    await rig.decide()
    assert list(rig.batcher.pending) == late

    await rig.both_ended(running, behind, joiners)
    rig.clock.advance(0.2)
    await rig.decide()
    assert [i.request_id for i in rig.sent[-1].items] == late  # the latecomer's own batch
    query = select(batches_t.c.size).where(batches_t.c.id == uuid.UUID(behind.batch_id))
    async with rig.store.engine.connect() as conn:
        assert (await conn.execute(query)).scalar_one() == 3  # the batch's row counts them


async def test_a_batch_never_leaves_before_its_members_arrived(tmp_path: Path) -> None:
    """A request that arrives while the batcher settles a batch's joiners (a Postgres read)
    is decided on with the clock after that read: the batch it leaves in is dispatched after
    the batcher held it, so a member is never taken for a late joiner."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    await rig.arrive(2)
    await rig.decide()
    await rig.runner.run(behind)
    await rig.arrive(1)
    rig.closed(running)
    rig.closed(behind)
    rig.clock.advance(0.2)
    placements_of = rig.store.placements_of

    async def arriving_meanwhile(request_ids: list[str]) -> object:
        rig.clock.advance(0.01)
        await rig.arrive(1)
        return await placements_of(request_ids)

    rig.store.placements_of = arriving_meanwhile  # type: ignore[method-assign,assignment]
    await rig.decide()
    last = rig.sent[-1]
    assert len(last.items) == 2  # the waiting one and the one that came during the read
    assert all(item.received_at <= last.dispatched_at for item in last.items)


async def test_an_offer_the_worker_never_took_comes_back_to_the_batcher(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    joiners = await rig.arrive(2)
    await rig.decide()
    assert not rig.batcher.pending

    # The batch is reaped before its worker ever started it: the offer is moot.
    await rig.store.reap_batch(
        uuid.UUID(behind.batch_id), now=rig.clock(), outcome=BatchOutcome.ABANDONED
    )
    rig.closed(running)
    rig.closed(behind, "abandoned")
    await rig.decide()
    assert all(rig.acks.get(r, 0) == 0 for r in joiners)
    assert set(await rig.states(joiners)) == set(joiners)
    assert set((await rig.states(joiners)).values()) == {RequestState.QUEUED}
    # ...and the batcher batches them again (with the reaped batch's member).
    rig.clock.advance(0.2)
    await rig.decide()
    dispatched = [i.request_id for i in rig.sent[-1].items]
    assert set(joiners) <= set(dispatched)


async def test_a_joiner_cancelled_before_the_worker_claims_it_keeps_no_answer(
    tmp_path: Path,
) -> None:
    """The model starts on what was offered while the worker claims it: the claim of a
    request cancelled meanwhile fails, and its answer is dropped, not written."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    joiners = await rig.arrive(2)
    await rig.decide()
    await rig.store.cancel(uuid.UUID(joiners[0]), tenant="t1", now=rig.clock())
    await rig.runner.run(behind)
    assert rig.backend.batches == [[behind.items[0].request_id, *joiners]]
    cancelled = await rig.store.get(uuid.UUID(joiners[0]))
    assert cancelled is not None and cancelled.output is None
    rig.closed(running)
    rig.closed(behind)
    await rig.decide()
    states = await rig.states(joiners)
    assert states == {joiners[0]: RequestState.CANCELLED, joiners[1]: RequestState.SUCCEEDED}
    assert rig.acks[joiners[0]] == rig.acks[joiners[1]] == 1


async def test_the_joiners_claim_waits_out_the_answers_of_the_batch_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The joiners run from the seal, and their claim begins JOIN_CLAIM_DELAY_S later (at
    most a quarter of the batch's estimated time), clear of the results and answers of the
    batch that just left the slot; the model, done sooner, waits for it, and the joiners'
    answers are kept."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    joiners = await rig.arrive(2)
    await rig.decide()
    sealed: list[float] = []
    claimed: list[float] = []
    take_blocking, join_batch = rig.joins.take_blocking, rig.store.join_batch

    def timed_take(batch_id: uuid.UUID) -> list[BatchItem]:
        offered = take_blocking(batch_id)
        sealed.append(time.monotonic())
        return offered

    async def timed_join(*args: Any, **kwargs: Any) -> list[ClaimedRequest]:
        claimed.append(time.monotonic())
        return await join_batch(*args, **kwargs)

    monkeypatch.setattr(rig.joins, "take_blocking", timed_take)
    monkeypatch.setattr(rig.store, "join_batch", timed_join)
    batch = await rig.runner.open(behind)
    assert batch.claim_delay_s() == min(JOIN_CLAIM_DELAY_S, behind.estimated_s / 4) > 0
    await asyncio.to_thread(batch.take_joiners_blocking)
    output = await asyncio.to_thread(batch.run_model)
    await batch.conclude(output)
    assert len(sealed) == len(claimed) == 1
    assert claimed[0] - sealed[0] >= batch.claim_delay_s() * 0.9
    assert rig.backend.batches == [[behind.items[0].request_id, *joiners]]
    await rig.both_ended(running, behind, joiners)


async def test_the_model_time_stored_ends_with_the_model_not_with_the_hand_over(
    tmp_path: Path,
) -> None:
    """A pool process hands the finished batch to its event loop: the batch's ``model_ms`` and
    its requests' ``finished_at`` are the model's end, not the moment the loop got to it; the
    time to store its results counts from the model's end too."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    await rig.arrive(1)
    await rig.decide()
    message = rig.sent[-1]
    run = rig.backend.run

    def hundred_ms(items: object, on_result: OnResult | None = None) -> list[ItemResult]:
        rig.clock.advance(0.1)
        return run(items, on_result)

    rig.backend.run = hundred_ms  # type: ignore[method-assign]
    batch = await rig.runner.open(message)
    output = await asyncio.to_thread(batch.run_model)
    ended = rig.clock()
    rig.clock.advance(0.05)  # the loop busy elsewhere before it concludes
    stored = store_seconds(message.model)
    await batch.conclude(output)
    assert store_seconds(message.model) == pytest.approx((stored[0] + 1, stored[1] + 0.05))
    query = select(batches_t.c.model_ms, batches_t.c.finished_at).where(
        batches_t.c.id == uuid.UUID(message.batch_id)
    )
    async with rig.store.engine.connect() as conn:
        model_ms, finished_at = (await conn.execute(query)).one()
    assert model_ms == pytest.approx(100.0)
    assert finished_at.timestamp() == pytest.approx(ended, abs=1e-3)


async def test_a_seal_that_fails_in_the_model_thread_leaves_the_offer_to_the_batcher(
    tmp_path: Path,
) -> None:
    """Redis gone as the model starts: the batch runs its own members, and what was offered
    stays queued for the batcher to batch again, each request answered once."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    joiners = await rig.arrive(2)
    await rig.decide()

    def unreachable(batch_id: uuid.UUID) -> list[BatchItem]:
        raise ConnectionError("redis is gone")

    rig.joins.take_blocking = unreachable  # type: ignore[method-assign]
    await run_in_a_thread(rig.runner, behind)
    assert rig.backend.batches == [[behind.items[0].request_id]]
    assert set((await rig.states(joiners)).values()) == {RequestState.QUEUED}
    rig.closed(running)
    rig.closed(behind)
    await rig.decide()
    rig.clock.advance(0.2)
    await rig.decide()
    assert {i.request_id for i in rig.sent[-1].items} == set(joiners)
    await rig.runner.run(rig.sent[-1])
    states = await rig.states([behind.items[0].request_id, *joiners])
    assert set(states.values()) == {RequestState.SUCCEEDED}
    assert rig.backend.batches[-1] == joiners


async def test_a_stale_attempt_claims_no_joiner(tmp_path: Path) -> None:
    """A worker whose lease was lost (its batch reaped) claims nothing into the batch."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    _, behind = await rig.send_behind()
    joiners = await rig.arrive(1)
    await rig.decide()
    batch_id = uuid.UUID(behind.batch_id)
    start = await rig.store.start_batch(batch_id, "w1", rig.clock(), 2.0)
    assert start is not None
    await rig.store.reap_batch(batch_id, now=rig.clock(), outcome=BatchOutcome.CRASHED)
    claimed = await rig.store.join_batch(batch_id, attempt=1, model=ECHO.name, request_ids=joiners)
    assert claimed == []
    assert (await rig.states(joiners))[joiners[0]] is RequestState.QUEUED


async def test_what_the_api_admits_while_a_batch_is_joinable_rides_in_it_offered_by_the_api(
    tmp_path: Path,
) -> None:
    """The batcher announces the batch it sends behind the running one; the API offers what
    it then admits to that batch's box itself, and the batcher, told so by the message,
    neither batches nor offers it: it settles it with the batch, acked once claimed."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    read = rig.store.queued_inputs
    reads: list[list[str]] = []

    async def counted(request_ids: list[str]) -> object:
        reads.append(list(request_ids))
        return await read(request_ids)

    rig.store.queued_inputs = counted  # type: ignore[method-assign,assignment]
    messages = await rig.admit(2)
    assert {m.joined for m in messages} == {behind.batch_id}
    await rig.decide()
    assert not rig.batcher.pending and reads == []  # the batcher offered nothing itself
    joiners = [m.id for m in messages]

    await run_in_a_thread(rig.runner, behind)
    assert rig.backend.batches == [[behind.items[0].request_id, *joiners]]
    assert all(rig.acks.get(r, 0) == 0 for r in joiners)  # held until the batch settles
    await rig.both_ended(running, behind, joiners)
    rig.clock.advance(0.2)
    await rig.decide()
    assert len(rig.sent) == 2  # nothing batched again


class _HandOver:
    """A hand-over the test lets finish (``release``), in the broker's place: held until
    then, as a publish waits for the broker's confirm; ``fails``: it ends in ``Unavailable``."""

    def __init__(self, rig: Rig, *, fails: bool = False) -> None:
        self.rig, self.fails = rig, fails
        self.started: list[BatchMessage] = []
        self.release = asyncio.Event()

    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        self.started.append(message)
        await self.release.wait()
        if self.fails:
            raise Unavailable("the broker is gone", component="broker")
        self.rig.sent.append(message)

    async def behind(self) -> tuple[BatchMessage, asyncio.Task[None]]:
        """One batch to the idle slot, then one sent behind it whose hand-over is under way
        (the batcher's step still waiting for it)."""
        await self.rig.arrive(1)
        await self.rig.decide()
        running = self.rig.sent[-1]
        await self.rig.arrive(1)
        free_at = self.rig.batcher.slots.next_free_at(self.rig.clock())
        assert free_at is not None
        self.rig.clock.now = free_at
        self.rig.dispatch = self.dispatch  # type: ignore[method-assign]
        deciding = asyncio.create_task(self.rig.decide())
        while not self.started:
            await asyncio.sleep(0)
        for _ in range(10):  # the announcement goes out in the background
            await asyncio.sleep(0)
        return running, deciding


async def test_the_api_offers_to_a_batch_as_soon_as_it_is_claimed_not_once_handed_over(
    tmp_path: Path,
) -> None:
    """The batch sent behind is announced once claimed: what the API admits while the broker
    has yet to confirm the hand-over goes to its box, and rides in it."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    hand_over = _HandOver(rig)
    running, deciding = await hand_over.behind()
    messages = await rig.admit(2)
    assert {m.joined for m in messages} == {hand_over.started[0].batch_id}
    hand_over.release.set()
    await deciding
    behind = rig.sent[-1]
    assert behind.batch_id == hand_over.started[0].batch_id and behind.joinable

    await run_in_a_thread(rig.runner, behind)
    joiners = [m.id for m in messages]
    assert rig.backend.batches[-1] == [behind.items[0].request_id, *joiners]
    await rig.both_ended(running, behind, joiners)


async def test_what_the_api_put_in_a_batch_never_handed_over_is_batched_again(
    tmp_path: Path,
) -> None:
    """The hand-over of a batch announced as joinable fails after the API put requests in
    its box: nothing will seal that box, so the batcher batches them again (its member it
    publishes again, as before), and each ends once, acked once."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    hand_over = _HandOver(rig, fails=True)
    running, deciding = await hand_over.behind()
    failed = hand_over.started[0]
    messages = await rig.admit(2)
    joiners = [m.id for m in messages]
    assert {m.joined for m in messages} == {failed.batch_id}
    hand_over.release.set()
    await deciding
    assert set(joiners) <= set(rig.batcher.pending)
    assert all(rig.acks.get(r, 0) == 0 for r in joiners)

    del rig.dispatch  # the broker is back
    rig.closed(running)
    rig.clock.advance(0.2)
    await rig.decide()
    again = rig.sent[-1]
    assert again.batch_id != failed.batch_id
    assert set(joiners) <= {i.request_id for i in again.items}
    await rig.runner.run(again)
    rig.closed(again)
    await rig.decide()
    assert set((await rig.states(joiners)).values()) == {RequestState.SUCCEEDED}
    assert all(rig.acks[r] == 1 for r in joiners)


async def test_the_api_offers_no_more_than_the_box_holds_and_nothing_once_it_is_sealed(
    tmp_path: Path,
) -> None:
    """A batch of up to 4 sent with one member takes 3 joiners, whoever offers them: the
    API's fourth goes through the batcher, which finds the box full; once the model has
    started the API offers nothing, and every request still ends once, acked once."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    first = await rig.admit(4)
    assert [m.joined for m in first] == [behind.batch_id] * 3 + [None]
    await rig.decide()
    assert list(rig.batcher.pending) == [first[3].id]  # refused as full: waits for a batch
    await rig.runner.run(behind)
    assert rig.backend.batches == [[behind.items[0].request_id, *(m.id for m in first[:3])]]
    running_ids = await rig.admit(1)
    sealed = await rig.admit(1)
    assert running_ids[0].joined is None and sealed[0].joined is None

    rig.closed(running)
    rig.closed(behind)
    await rig.decide()
    rig.clock.advance(0.2)
    await rig.decide()
    rest = [first[3].id, running_ids[0].id, sealed[0].id]
    assert sorted(i.request_id for i in rig.sent[-1].items) == sorted(rest)
    await rig.runner.run(rig.sent[-1])
    every = [behind.items[0].request_id, *(m.id for m in first), *rest[1:]]
    assert set((await rig.states(every)).values()) == {RequestState.SUCCEEDED}
    rig.closed(rig.sent[-1])
    await rig.decide()
    assert all(rig.acks[r] == 1 for r in [m.id for m in first] + rest[1:])


async def test_an_api_offer_redis_may_have_lost_is_batched_again_if_still_queued(
    tmp_path: Path,
) -> None:
    """The API's offer fails (Redis gone): its message still names the batch, and the batcher
    reads once the batch has left where the request went: still queued, it batches it."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()

    async def unreachable(*args: object) -> bool:
        raise ConnectionError("redis is gone")

    offer = rig.joins.offer
    rig.joins.offer = unreachable  # type: ignore[method-assign,assignment]
    lost = await rig.admit(1)
    rig.joins.offer = offer  # type: ignore[method-assign]
    assert lost[0].joined == behind.batch_id
    await rig.decide()
    await rig.runner.run(behind)
    assert rig.backend.batches == [[behind.items[0].request_id]]
    rig.closed(running)
    rig.closed(behind)
    await rig.decide()
    assert list(rig.batcher.pending) == [lost[0].id] and rig.acks.get(lost[0].id, 0) == 0
    rig.clock.advance(0.2)
    await rig.decide()
    await rig.runner.run(rig.sent[-1])
    assert (await rig.states([lost[0].id]))[lost[0].id] is RequestState.SUCCEEDED


async def test_a_joined_message_late_for_its_batch_is_answered_once(tmp_path: Path) -> None:
    """The message of a request the API put in a box reaches the batcher after that batch
    has left its timeline: batched as any other, its claim finds it already answered."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    commands = [command("late", model=ECHO.name, now=rig.clock())]
    joined = await rig.api.offer(commands)
    outcomes = await rig.store.submit(commands)
    assert isinstance(outcomes[0], Admission) and outcomes[0].message is not None
    message = replace(outcomes[0].message, joined=joined[outcomes[0].message.id])
    assert message.joined == behind.batch_id
    await rig.runner.run(behind)
    rig.closed(running)
    rig.closed(behind)
    await rig.decide()
    await rig.batcher.on_message(message, _Delivery(message.id, rig.acks))  # only now
    rig.clock.advance(0.2)
    await rig.decide()
    assert rig.backend.batches == [[behind.items[0].request_id, message.id]]
    assert rig.acks[message.id] == 1
    assert (await rig.states([message.id]))[message.id] is RequestState.SUCCEEDED


async def test_the_api_passes_a_sealed_box_for_the_next_one_that_takes_the_request() -> None:
    """Boxes announced for a model are tried soonest-starting first; one that refuses (sealed)
    is offered nothing more, and the request goes in the next one whose class it fits."""
    clock, events, joins = Clock(now=1000.0), MemoryEventBus(), MemoryJoinBox()
    api = JoinOffers(joins, events, clock)
    api.start()
    sealed, short, other = uuid.uuid4(), uuid.uuid4(), uuid.uuid4()
    for batch, starts_by, upto in (
        (sealed, 1000.01, None),
        (short, 1000.02, 2),
        (other, 1000.03, None),
    ):
        await events.publish(
            BatchJoinable(
                model=ECHO.name,
                batch_id=str(batch),
                room=3,
                starts_by=starts_by,
                ends_by=starts_by + 0.1,
                upto=upto,
            )
        )
    await joins.take(sealed)
    first, second = (command(t, model=ECHO.name, now=1000.0, max_tokens=4) for t in "ab")
    # not the sealed box, not the short-answers one
    assert await api.offer([first]) == {str(first.id): str(other)}
    assert await api.offer([second]) == {str(second.id): str(other)}
    assert [i.request_id for i in await joins.take(other)] == [str(first.id), str(second.id)]
    await api.close()


async def test_the_group_commit_publishes_what_joined_a_batch_naming_it(tmp_path: Path) -> None:
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    _, behind = await rig.send_behind()
    queue = MemoryRequestQueue()
    admitter = Admitter(rig.store, queue, joiners=rig.api)
    admitter.start()
    try:
        admission = await admitter.submit(command("x", model=ECHO.name, now=rig.clock()))
        heard = await _heard_on(queue)
        await _until(lambda: bool(heard))
        assert [(m.id, m.joined) for m in heard] == [(str(admission.record.id), behind.batch_id)]
        assert [i.request_id for i in await rig.joins.take(uuid.UUID(behind.batch_id))] == [
            str(admission.record.id)
        ]
    finally:
        await admitter.stop()
        await queue.close()


async def test_the_group_commit_offers_while_it_commits(tmp_path: Path) -> None:
    """The offer does not wait for the commit: the box holds the request while its row is
    still being written; its caller hears once it is committed, and its message names the
    batch."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    _, behind = await rig.send_behind()
    committing, commit = asyncio.Event(), asyncio.Event()
    write = rig.store.submit

    async def slow_commit(commands: list[SubmitCommand]) -> object:
        committing.set()
        await commit.wait()
        return await write(commands)

    rig.store.submit = slow_commit  # type: ignore[method-assign,assignment]
    queue = MemoryRequestQueue()
    heard = await _heard_on(queue)
    admitter = Admitter(rig.store, queue, joiners=rig.api)
    admitter.start()
    try:
        made = command("x", model=ECHO.name, now=rig.clock())
        admitting = asyncio.create_task(admitter.submit(made))
        await asyncio.wait_for(committing.wait(), 5.0)
        await _until(lambda: len(rig.joins) == 1)
        assert not admitting.done() and not heard
        commit.set()
        admission = await asyncio.wait_for(admitting, 5.0)
        await _until(lambda: bool(heard))
        assert [(m.id, m.joined) for m in heard] == [(str(made.id), behind.batch_id)]
        assert admission.record.id == made.id
        assert [i.request_id for i in await rig.joins.take(uuid.UUID(behind.batch_id))] == [
            str(made.id)
        ]
    finally:
        await admitter.stop()
        await queue.close()


async def test_an_offer_whose_commit_failed_runs_in_the_batch_and_is_never_answered(
    tmp_path: Path,
) -> None:
    """The group's transaction fails after its offer went out: the caller hears the failure,
    nothing is published, and the batch runs the offer without keeping an answer for it
    (no row was ever written for it); the batch's own member is answered once."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()

    async def refused(commands: list[SubmitCommand]) -> object:
        raise Unavailable("database unavailable", component="database")

    write = rig.store.submit
    rig.store.submit = refused  # type: ignore[method-assign,assignment]
    queue = MemoryRequestQueue()
    heard = await _heard_on(queue)
    admitter = Admitter(rig.store, queue, joiners=rig.api)
    admitter.start()
    made = command("never", model=ECHO.name, now=rig.clock())
    try:
        with pytest.raises(Unavailable):
            await asyncio.wait_for(admitter.submit(made), 5.0)
    finally:
        await admitter.stop()
        await queue.close()
    rig.store.submit = write  # type: ignore[method-assign]
    assert heard == []
    await run_in_a_thread(rig.runner, behind)
    member = behind.items[0].request_id
    assert rig.backend.batches == [[member, str(made.id)]]  # ran with the batch
    assert await rig.states([member, str(made.id)]) == {member: RequestState.SUCCEEDED}
    rig.closed(running)
    rig.closed(behind)
    rig.clock.advance(0.2)
    await rig.decide()
    assert len(rig.sent) == 2  # nothing batched again


async def test_an_offer_committed_after_the_worker_claimed_its_joiners_runs_in_the_next_batch(
    tmp_path: Path,
) -> None:
    """The offer reached the box, the batch started and claimed its joiners, and only then
    was the request committed: its answer in that batch is not kept; its message, naming the
    batch, finds it still queued once the batch has gone, and the batcher batches it again.
    It is answered once."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    running, behind = await rig.send_behind()
    made = command("slow", model=ECHO.name, now=rig.clock())
    joined = await rig.api.offer([made])
    assert joined == {str(made.id): behind.batch_id}
    await run_in_a_thread(rig.runner, behind)  # claims its joiners: this one has no row yet
    assert rig.backend.batches == [[behind.items[0].request_id, str(made.id)]]
    [outcome] = await rig.store.submit([made])
    assert isinstance(outcome, Admission) and outcome.message is not None
    message = replace(outcome.message, joined=joined[outcome.message.id])
    await rig.batcher.on_message(message, _Delivery(message.id, rig.acks))
    assert await rig.states([message.id]) == {message.id: RequestState.QUEUED}
    rig.closed(running)
    rig.closed(behind)
    await rig.decide()
    rig.clock.advance(0.2)
    await rig.decide()
    assert [i.request_id for i in rig.sent[-1].items] == [message.id]
    await run_in_a_thread(rig.runner, rig.sent[-1])
    rig.closed(rig.sent[-1])
    await rig.decide()
    assert await rig.states([message.id]) == {message.id: RequestState.SUCCEEDED}
    assert rig.acks[message.id] == 1


async def test_a_failing_offer_leaves_no_caller_waiting(tmp_path: Path) -> None:
    """Whatever goes wrong in a group's admission, its callers hear it: none waits for ever."""
    rig = Rig(tmp_path)
    await rig.batcher.start(background=False)
    await rig.send_behind()

    def broken() -> bool:
        raise RuntimeError("a bug in the offer")

    rig.api.any_open = broken  # type: ignore[method-assign]
    queue = MemoryRequestQueue()
    admitter = Admitter(rig.store, queue, joiners=rig.api)
    admitter.start()
    try:
        with pytest.raises(RuntimeError, match="a bug in the offer"):
            await asyncio.wait_for(
                admitter.submit(command("x", model=ECHO.name, now=rig.clock())), 5.0
            )
    finally:
        await admitter.stop()
        await queue.close()


async def _heard_on(queue: MemoryRequestQueue) -> list[QueueMessage]:
    """What the API publishes for the echo model, as the batcher would hear it."""
    heard: list[QueueMessage] = []

    async def handler(message: QueueMessage, delivery: object) -> None:
        heard.append(message)

    await queue.consume(ECHO.name, Lane.INTERACTIVE, handler, prefetch=10)
    return heard


async def _until(done: Callable[[], bool]) -> None:
    for _ in range(200):
        if done():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_the_memory_join_box_refuses_every_offer_once_sealed() -> None:
    box, batch = MemoryJoinBox(), uuid.uuid4()
    assert await box.offer(batch, [joiner("a", 1.0)])
    assert await box.take(batch) == [joiner("a", 1.0)]
    assert not await box.offer(batch, [joiner("b", 2.0)])
    assert await box.take(batch) == []
    assert await box.take(uuid.uuid4()) == []


def joiner(request_id: str, received_at: float) -> BatchItem:
    """A late joiner as a box carries it."""
    return BatchItem(
        request_id, f"input of {request_id}", None, {"max_tokens": 4}, 0.5, received_at
    )
