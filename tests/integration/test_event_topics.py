"""Event topics over Redis: each subscriber hears only the channels of the topics it names, so
the batcher decodes no request's change and a worker only cancellations."""

from __future__ import annotations

import asyncio

from batchserve.core.domain import BatchClosed, Event, RequestState, SequencesFreed, StateChange
from batchserve.core.events import CANCELS, REQUESTS, SLOTS, RedisEventBus
from batchserve.core.settings import Settings


async def test_subscribers_hear_only_their_topics_over_redis(settings: Settings) -> None:
    assert settings.redis_url
    bus = RedisEventBus(settings.redis_url, settings.name("events"))
    heard: dict[str, list[Event]] = {REQUESTS: [], SLOTS: [], CANCELS: []}
    subscriptions = [
        bus.subscribe(heard[topic].append, topics=(topic,)) for topic in (REQUESTS, SLOTS, CANCELS)
    ]
    try:
        for _ in range(100):
            if all(s.healthy for s in subscriptions):
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # the SUBSCRIBE commands are through
        state = StateChange(("r1",), RequestState.SUCCEEDED)
        cancelled = StateChange(("r2",), RequestState.CANCELLED)
        closed = BatchClosed(model="m", batch_id="b1", outcome="succeeded")
        freed = SequencesFreed("m", "b1", ("r3",))
        for event in (state, cancelled, closed, freed):
            await bus.publish(event)
        for _ in range(100):
            if sum(len(events) for events in heard.values()) >= 5:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # nothing more arrives
        assert heard[REQUESTS] == [state, cancelled]
        assert heard[SLOTS] == [closed, freed]
        assert heard[CANCELS] == [cancelled]
    finally:
        for subscription in subscriptions:
            await subscription.close()
        await bus.close()
