"""Graceful stops on the real broker: a draining batcher hands back what it holds, the API's
admitter commits and publishes every submit it took before it stops."""

from __future__ import annotations

import asyncio
import time
from datetime import timedelta

from batchserve.api.group_commit import Admitter
from batchserve.batching.batcher import ModelBatcher
from batchserve.core.broker import Delivery, RabbitRequestQueue
from batchserve.core.domain import BatchMessage, Lane, QueueMessage, SubmitCommand, utcnow
from batchserve.core.ids import uuid7
from batchserve.core.settings import Settings
from batchserve.core.store import Admission
from batchserve.core.wiring import Adapters

ECHO = "echo-100ms"


class NoDispatch:
    async def dispatch(self, message: BatchMessage, time_limit_s: float | None) -> None:
        raise AssertionError("no worker slot: nothing may be dispatched")


def command(text: str) -> SubmitCommand:
    now = utcnow()
    return SubmitCommand(
        id=uuid7(),
        tenant="t1",
        model=ECHO,
        lane=Lane.INTERACTIVE,
        input=text,
        messages=None,
        params={"max_tokens": 16},
        created_at=now,
        deadline=now + timedelta(seconds=600),
        prompt_tokens=1,
        max_tokens=16,
    )


async def until(check: object, timeout_s: float = 20.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < give_up, "not in time"
        await asyncio.sleep(0.05)


async def test_a_draining_batcher_hands_its_pending_requests_back_to_the_queue(
    adapters: Adapters, settings: Settings
) -> None:
    outcomes = await adapters.store.submit([command(f"held {i}") for i in range(5)])
    messages = [o.message for o in outcomes if isinstance(o, Admission) and o.message]
    await adapters.queue.publish(messages)
    spec = adapters.registry.get(ECHO)
    assert spec is not None
    # No worker announces a slot: the batcher holds the requests and forms no batch.
    batcher = ModelBatcher(
        spec,
        store=adapters.store,
        queue=adapters.queue,
        dispatcher=NoDispatch(),
        slots=adapters.slots,
        events=adapters.events,
    )
    running = asyncio.create_task(batcher.run())
    await until(lambda: len(batcher.pending) == 5)

    await batcher.drain()
    await asyncio.wait_for(running, timeout=10)  # the loop ends by itself: no cancellation
    assert batcher.pending == {}

    # The next batcher (the standby) gets them at once, marked as delivered before.
    received: list[tuple[QueueMessage, Delivery]] = []

    async def collect(message: QueueMessage, delivery: Delivery) -> None:
        received.append((message, delivery))

    standby = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
    try:
        await standby.consume(ECHO, Lane.INTERACTIVE, collect, prefetch=100)
        await until(lambda: len(received) == 5)
        assert {m.id for m, _ in received} == {m.id for m in messages}
        assert all(d.redelivered for _, d in received)
        for _, delivery in received:
            await delivery.ack()
    finally:
        await standby.close()
    # Postgres was never touched: they are still queued, in no batch.
    counts = await adapters.store.count_by_state()
    assert counts == {"queued": 5}


async def test_the_admitter_commits_and_publishes_everything_it_took_before_stopping(
    adapters: Adapters, settings: Settings
) -> None:
    admitter = Admitter(adapters.store, adapters.queue)
    admitter.start()
    submits = [asyncio.create_task(admitter.submit(command(f"last {i}"))) for i in range(50)]
    await asyncio.sleep(0)  # every submit is waiting in the admitter now
    await admitter.stop()
    admitted = await asyncio.gather(*submits)
    assert len({a.record.id for a in admitted}) == 50
    # Published (so maintenance has nothing to republish) and on the broker, each once.
    assert await adapters.store.unpublished(time.time() + 60) == []
    received: list[str] = []

    async def collect(message: QueueMessage, delivery: Delivery) -> None:
        received.append(message.id)
        await delivery.ack()

    consumer = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
    try:
        await consumer.consume(ECHO, Lane.INTERACTIVE, collect, prefetch=100)
        await until(lambda: len(received) >= 50)
        await asyncio.sleep(0.3)
    finally:
        await consumer.close()
    assert sorted(received) == sorted(str(a.record.id) for a in admitted)


async def test_the_admitter_marks_a_request_left_queued_within_its_interval(
    adapters: Adapters,
) -> None:
    """A request nobody claims is marked published while the admitter runs, well before
    maintenance would publish it again: the mark covers queued requests, every interval."""
    admitter = Admitter(adapters.store, adapters.queue, mark_every_s=0.2)
    admitter.start()
    try:
        admitted = await admitter.submit(command("left queued"))
        request_id = str(admitted.record.id)
        started = time.monotonic()
        while request_id in {u.id for u in await adapters.store.unpublished(time.time() + 60)}:
            assert time.monotonic() - started < 5.0, "not marked published"
            await asyncio.sleep(0.02)
        assert time.monotonic() - started >= 0.1  # not before the interval gathered it
    finally:
        await admitter.stop()


class StuckQueue:
    """A broker whose publish never completes (a channel that never reopens, confirms that
    never come): what the admitter must not make its callers wait on."""

    def __init__(self) -> None:
        self.published = asyncio.Event()

    async def publish(self, messages: object) -> None:
        self.published.set()
        await asyncio.Event().wait()


async def test_a_committed_submit_is_answered_while_its_publish_hangs(adapters: Adapters) -> None:
    queue = StuckQueue()
    admitter = Admitter(adapters.store, queue)  # type: ignore[arg-type]
    admitter.start()
    admitted = await asyncio.wait_for(admitter.submit(command("stuck broker")), timeout=10)
    await asyncio.wait_for(queue.published.wait(), timeout=10)
    # Committed and answered, not marked published: maintenance publishes it.
    assert (await adapters.store.get(admitted.record.id, "t1")) is not None
    unpublished = await adapters.store.unpublished(time.time() + 60)
    assert str(admitted.record.id) in {u.id for u in unpublished}
    # Stopping does not wait for the hung publish longer than its bound.
    started = time.monotonic()
    await admitter.stop(timeout_s=0.5)
    assert time.monotonic() - started < 5
