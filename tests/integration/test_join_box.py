"""The join box on Redis and in memory: offers until sealed, each one all or nothing, and a
seal that takes everything offered before it, even against offers racing it."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
import redis

from batchserve.core.joins import JoinBox, Joiner, MemoryJoinBox, RedisJoinBox
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
    assert await box.offer(batch, [Joiner("a", 1.5), Joiner("b", 2.25)])
    assert await box.offer(batch, [Joiner("c", 3.0)])
    assert await box.take(batch) == [Joiner("a", 1.5), Joiner("b", 2.25), Joiner("c", 3.0)]
    assert not await box.offer(batch, [Joiner("d", 4.0)])
    assert await box.take(batch) == []
    other = uuid.uuid4()  # boxes are per batch
    assert await box.offer(other, [Joiner("e", 5.0)])
    assert await box.take(other) == [Joiner("e", 5.0)]


async def test_every_offer_is_either_taken_or_refused_when_they_race_the_seal(
    box: JoinBox,
) -> None:
    batch = uuid.uuid4()

    async def offer(n: int) -> tuple[str, bool]:
        await asyncio.sleep(0.0005 * (n % 7))
        return f"r{n}", await box.offer(batch, [Joiner(f"r{n}", float(n))])

    async def seal() -> list[Joiner]:
        await asyncio.sleep(0.002)
        return await box.take(batch)

    sealing = asyncio.create_task(seal())
    answers = await asyncio.gather(*(offer(n) for n in range(40)))
    taken = {j.request_id for j in await sealing}
    accepted = {r for r, ok in answers if ok}
    assert len(accepted) < len(answers)  # the seal came before some of them
    assert accepted == taken  # none accepted and lost, none refused and taken


@pytest.mark.usefixtures("live_servers")
async def test_a_redis_box_expires(run_id: str) -> None:
    made = RedisJoinBox(servers.REDIS_URL, f"{run_id}jointtl", ttl_s=60.0)
    batch = uuid.uuid4()
    try:
        assert await made.offer(batch, [Joiner("a", 1.0)])
        await made.take(batch)
        client = redis.Redis.from_url(servers.REDIS_URL)
        ttl = client.pttl(f"{run_id}jointtl.join.{batch}.sealed")
        client.close()
        assert 0 < ttl <= 60_000
    finally:
        await made.close()
