"""Packs on the real broker: many requests a message (bulk lines by the thousand, a group
commit's interactive requests), each delivered once, the message settled when its last request
is, and all of it handed back by a release."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from batchserve.core.broker import (
    BULK_PACK,
    INTERACTIVE_PACK,
    Delivery,
    RabbitRequestQueue,
    pack_prefetch,
)
from batchserve.core.domain import Lane, QueueMessage
from batchserve.core.ids import uuid7
from batchserve.core.settings import Settings
from tests.integration.test_graceful import until

ECHO = "echo-100ms"


def message(lane: Lane, n: int) -> QueueMessage:
    now = time.time()
    return QueueMessage(
        id=str(uuid7()),
        model=ECHO,
        lane=lane,
        tenant="t1",
        created_at=now,
        deadline=now + 600,
        prompt_tokens=n,
        max_tokens=16,
    )


def test_the_bulk_prefetch_is_counted_in_requests() -> None:
    assert pack_prefetch(Lane.INTERACTIVE, 1024) == 1024
    assert pack_prefetch(Lane.BULK, 4 * BULK_PACK) == 4
    assert pack_prefetch(Lane.BULK, 4 * BULK_PACK + 1) == 5
    assert pack_prefetch(Lane.BULK, 1) == 1


async def test_bulk_requests_travel_in_packs_and_settle_with_their_last_member(
    settings: Settings,
) -> None:
    queue = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
    consumer = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
    total = 2 * BULK_PACK + 5
    sent = [message(Lane.BULK, i) for i in range(total)]
    try:
        await queue.publish(sent)
        # Three messages on the queue, counted in requests as if full.
        assert await queue.depth(ECHO, Lane.BULK) == 3 * BULK_PACK
        received: list[tuple[QueueMessage, Delivery]] = []

        async def collect(m: QueueMessage, delivery: Delivery) -> None:
            received.append((m, delivery))

        # Room for one pack at a time: the next comes only once this one is settled.
        await consumer.consume(ECHO, Lane.BULK, collect, prefetch=BULK_PACK)
        await until(lambda: len(received) == BULK_PACK)
        await asyncio.sleep(0.3)
        assert len(received) == BULK_PACK, "a second pack came before the first was settled"
        assert [m for m, _ in received] == sent[:BULK_PACK]  # every field, in order
        for _, delivery in received[:-1]:
            await delivery.ack()
        await asyncio.sleep(0.3)
        assert len(received) == BULK_PACK, "the pack was settled before its last member"
        await received[-1][1].ack()
        await until(lambda: len(received) == 2 * BULK_PACK)

        # A release hands the whole pack back, members already settled included, once.
        second = received[BULK_PACK:]
        await second[0][1].ack()
        await second[1][1].release()
        await second[2][1].release()
        # The rest come one message at a time (the third pack, the second again), in
        # whichever order the queue keeps them.
        expected = BULK_PACK + 5
        await until(lambda: len(received) > 2 * BULK_PACK)
        settled = 2 * BULK_PACK
        while len(received) < 2 * BULK_PACK + expected:
            arrived = len(received)
            for _, delivery in received[settled:arrived]:  # once a member
                await delivery.ack()
            settled = arrived
            await until(lambda n=arrived: len(received) > n)
        for _, delivery in received[settled:]:
            await delivery.ack()
        again = received[2 * BULK_PACK :]
        assert sorted(m.id for m, _ in again) == sorted(m.id for m in sent[BULK_PACK:])
        second_ids = {m.id for m in sent[BULK_PACK : 2 * BULK_PACK]}
        assert all(d.redelivered for m, d in again if m.id in second_ids)
        assert {m.id for m, _ in received} == {m.id for m in sent}
        await asyncio.sleep(0.3)
        assert await queue.depth(ECHO, Lane.BULK) == 0
    finally:
        await consumer.close()
        await queue.delete_queues([ECHO])
        await queue.close()


async def test_interactive_requests_published_together_travel_in_packs(
    settings: Settings,
) -> None:
    """A group commit's requests are one message per INTERACTIVE_PACK of them (a lone request
    its own message), each request delivered once with every field, and the pack settled
    when its last member is; the consumer counts the queue's depth in requests by the packs
    it has been taking."""
    queue = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
    consumer = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
    lone = message(Lane.INTERACTIVE, 0)
    group = [message(Lane.INTERACTIVE, i) for i in range(2 * INTERACTIVE_PACK + 3)]
    try:
        await queue.publish([lone])
        await queue.publish(group)
        assert await queue.depth(ECHO, Lane.INTERACTIVE) == 4  # messages: 1 + 3 packs
        received: list[tuple[QueueMessage, Delivery]] = []

        async def collect(m: QueueMessage, delivery: Delivery) -> None:
            received.append((m, delivery))

        await consumer.consume(ECHO, Lane.INTERACTIVE, collect, prefetch=1)
        await until(lambda: len(received) == 1)
        assert received[0][0] == lone
        await received[0][1].ack()
        await until(lambda: len(received) == 1 + INTERACTIVE_PACK)
        first_pack = received[1:]
        assert [m for m, _ in first_pack] == group[:INTERACTIVE_PACK]  # every field, in order
        # Two packs still queued, counted as requests from the one it took.
        assert 2 < (await consumer.depth(ECHO, Lane.INTERACTIVE) or 0) <= 2 * INTERACTIVE_PACK
        for _, delivery in first_pack[:-1]:
            await delivery.ack()
        await asyncio.sleep(0.3)
        assert len(received) == 1 + INTERACTIVE_PACK, "the pack was settled before its last"
        await first_pack[-1][1].ack()
        await until(lambda: len(received) == 1 + 2 * INTERACTIVE_PACK)
        for _, delivery in received[1 + INTERACTIVE_PACK :]:
            await delivery.ack()
        await until(lambda: len(received) == 1 + len(group))
        await asyncio.sleep(0.3)
        assert len(received) == 1 + len(group)
        assert [m for m, _ in received] == [lone, *group]
        for _, delivery in received[1 + 2 * INTERACTIVE_PACK :]:
            await delivery.ack()
        await asyncio.sleep(0.3)
        assert await queue.depth(ECHO, Lane.INTERACTIVE) == 0
    finally:
        await consumer.close()
        await queue.delete_queues([ECHO])
        await queue.close()


def test_the_readme_says_how_many_requests_a_message_carries() -> None:
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert f"the requests of one group commit {INTERACTIVE_PACK} to a message" in readme
    assert f"publishes them to `requests.<model>.bulk` {BULK_PACK} to a message" in readme
