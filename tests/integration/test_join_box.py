"""The join box on Redis and in memory: offers until sealed, each one all or nothing, and a
seal that takes everything offered before it, even against offers racing it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis

from batchserve.core.domain import BatchItem
from batchserve.core.joins import JoinBox, MemoryJoinBox, RedisJoinBox
from tests.support import servers


@pytest.fixture(params=["memory", "redis"])
async def box(request: pytest.FixtureRequest, run_id: str) -> AsyncIterator[JoinBox]:
    if request.param == "memory":
        yield MemoryJoinBox()
        return
    request.getfixturevalue("live_servers")
    made = RedisJoinBox(servers.REDIS_URL, f"{run_id}joins")
    try:
        yield made
    finally:
        await made.close()


async def test_offers_are_taken_once_and_refused_after_the_seal(box: JoinBox) -> None:
    batch = uuid.uuid4()
    assert await box.offer(batch, [joiner("a", 1.5), joiner("b", 2.25)])
    assert await box.offer(batch, [joiner("c", 3.0)])
    assert await box.take(batch) == [joiner("a", 1.5), joiner("b", 2.25), joiner("c", 3.0)]
    assert not await box.offer(batch, [joiner("d", 4.0)])
    assert await box.take(batch) == []
    assert box.take_blocking(batch) == []
    blocking = uuid.uuid4()  # sealed from a thread of its own: the same box
    assert await box.offer(blocking, [joiner("f", 6.0)])
    assert await asyncio.to_thread(box.take_blocking, blocking) == [joiner("f", 6.0)]
    assert not await box.offer(blocking, [joiner("g", 7.0)])
    other = uuid.uuid4()  # boxes are per batch
    assert await box.offer(other, [joiner("e", 5.0)])
    assert await box.take(other) == [joiner("e", 5.0)]


async def test_a_box_refuses_an_offer_past_its_capacity_whole_and_gives_each_request_once(
    box: JoinBox,
) -> None:
    """The batcher and the API both offer to a box, each up to its capacity: an offer that
    would pass it is refused whole, and a request offered by both is taken once."""
    batch = uuid.uuid4()
    assert await box.offer(batch, [joiner("a", 1.0)], capacity=2)
    assert not await box.offer(batch, [joiner("b", 2.0), joiner("c", 2.0)], capacity=2)
    assert await box.offer(batch, [joiner("a", 3.0)], capacity=2)
    assert not await box.offer(batch, [joiner("d", 4.0)], capacity=2)
    assert await box.take(batch) == [joiner("a", 1.0)]


@pytest.mark.parametrize("sealed_from", ["loop", "thread"])
async def test_every_offer_is_either_taken_or_refused_when_they_race_the_seal(
    box: JoinBox, sealed_from: str
) -> None:
    """Offers before the seal are taken, offers after it refused, and offers racing it each
    one or the other: none accepted and lost, none refused and taken. The same sealed from
    a thread outside the loop (``take_blocking``, as a pool process's model thread does)."""
    batch = uuid.uuid4()

    async def offer(n: int) -> tuple[str, bool]:
        await asyncio.sleep(0.0005 * (n % 7))
        return f"r{n}", await box.offer(batch, [joiner(f"r{n}", float(n))])

    before = await asyncio.gather(*(offer(n) for n in range(10)))
    sealing = asyncio.create_task(
        box.take(batch) if sealed_from == "loop" else asyncio.to_thread(box.take_blocking, batch)
    )
    racing = await asyncio.gather(*(offer(n) for n in range(10, 40)))
    taken = {j.request_id for j in await sealing}
    after = await asyncio.gather(*(offer(n) for n in range(40, 50)))
    assert all(ok for _, ok in before) and not any(ok for _, ok in after)
    accepted = {r for r, ok in [*before, *racing] if ok}
    assert accepted == taken
    assert {f"r{n}" for n in range(10)} <= taken


@pytest.mark.usefixtures("live_servers")
async def test_a_redis_box_expires(run_id: str) -> None:
    made = RedisJoinBox(servers.REDIS_URL, f"{run_id}jointtl", ttl_s=60.0)
    batch = uuid.uuid4()
    try:
        assert await made.offer(batch, [joiner("a", 1.0)])
        await made.take(batch)
        client = redis.Redis.from_url(servers.REDIS_URL)
        ttl = client.pttl(f"{run_id}jointtl.join.{batch}.sealed")
        client.close()
        assert 0 < ttl <= 60_000
    finally:
        await made.close()


async def test_the_memory_box_forgets_boxes_past_their_ttl() -> None:
    """A box offered to a batch that never ran, and a seal, are both forgotten ``ttl_s`` after
    their last use, as Redis's keys expire (the embedded mode runs for months)."""
    now = [0.0]
    box = MemoryJoinBox(ttl_s=10.0, clock=lambda: now[0])
    never_ran, ran = uuid.uuid4(), uuid.uuid4()
    assert await box.offer(never_ran, [joiner("a", 1.0)])
    assert await box.offer(ran, [joiner("b", 1.0)])
    now[0] = 5.0
    assert await box.take(ran) == [joiner("b", 1.0)]
    assert await box.offer(never_ran, [joiner("c", 5.0)])  # refreshed by its last offer
    now[0] = 14.0
    assert len(box) == 2  # both still within 10 s of their last use
    assert not await box.offer(ran, [joiner("d", 14.0)])
    now[0] = 15.5
    assert await box.take(uuid.uuid4()) == [] and len(box) == 1  # only the new seal is left


def joiner(request_id: str, received_at: float) -> BatchItem:
    """A late joiner as a box carries it."""
    return BatchItem(
        request_id, f"input of {request_id}", None, {"max_tokens": 4}, 0.5, received_at
    )
