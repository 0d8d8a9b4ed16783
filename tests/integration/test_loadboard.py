"""The load board on Redis: what a batcher publishes, an API process reads from a local copy
that its reads refresh (in the background while young, before answering once older than the
keep-alive), and nobody's reads mean no Redis traffic at all."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest

from batchserve.core import loadboard
from batchserve.core.loadboard import LOAD_KEEPALIVE_S, READ_WAIT_S, LoadSnapshot, RedisLoadBoard
from batchserve.core.settings import Settings

MODEL = "echo-100ms"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def snapshot(pending: int) -> LoadSnapshot:
    return LoadSnapshot(
        model=MODEL,
        at=time.time(),
        slots=1,
        slot_free_at=(),
        pending_interactive=pending,
        pending_bulk=0,
        queued_interactive=0,
        queued_bulk=0,
        batch_s=0.1,
        max_batch_size=32,
        max_batch_delay_s=0.1,
        arrival_rate=0.0,
    )


class Boards:
    def __init__(self, settings: Settings) -> None:
        assert settings.redis_url
        self.clock = Clock()
        self.batcher = RedisLoadBoard(settings.redis_url, settings.key_prefix)
        self.api = RedisLoadBoard(settings.redis_url, settings.key_prefix, clock=self.clock)
        self.reads = 0
        mget = self.api._redis.mget

        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.reads += 1
            return await mget(*args, **kwargs)

        self.api._redis.mget = counted  # type: ignore[method-assign]

    async def pending(self) -> int | None:
        found = await self.api.read(MODEL)
        return None if found is None else found.pending_interactive


@pytest.fixture
async def boards(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Boards]:
    # A read that waits for its refresh waits here as long as the round trip takes: on a
    # loaded host the first one (a new connection) can take longer than the 50 ms bound, which
    # its own test below checks against a server that never answers.
    monkeypatch.setattr(loadboard, "READ_WAIT_S", 5.0)
    made = Boards(settings)
    yield made
    await made.api.close()
    await made.batcher.close()


async def settle() -> None:
    """Let a refresh started in the background finish (a Redis round trip)."""
    for _ in range(50):
        await asyncio.sleep(0.01)


async def test_a_read_refreshes_its_copy_in_the_background_while_young(boards: Boards) -> None:
    await boards.batcher.publish(snapshot(1))
    assert await boards.pending() == 1  # the first read of a model waits for it
    await boards.batcher.publish(snapshot(2))
    assert await boards.pending() == 1 and boards.reads == 1  # the copy is fresh: no read
    boards.clock.now += 0.2  # older than refresh_s: answered from the copy, refreshed behind
    assert await boards.pending() == 1
    await settle()
    assert await boards.pending() == 2 and boards.reads == 2


async def test_a_copy_older_than_the_keepalive_is_refreshed_before_the_answer(
    boards: Boards,
) -> None:
    await boards.batcher.publish(snapshot(1))
    assert await boards.pending() == 1
    await boards.batcher.publish(snapshot(3))
    boards.clock.now += LOAD_KEEPALIVE_S + 0.01
    assert await boards.pending() == 3 and boards.reads == 2


async def test_a_reader_nobody_asks_reads_nothing(boards: Boards) -> None:
    await boards.batcher.publish(snapshot(1))
    assert await boards.pending() == 1
    boards.clock.now += 60.0
    await settle()  # half a second: it polled five times in as long
    assert boards.reads == 1


async def test_a_model_whose_snapshot_expired_is_dropped_from_the_copy(
    boards: Boards, settings: Settings
) -> None:
    assert settings.redis_url
    short = RedisLoadBoard(settings.redis_url, settings.key_prefix, ttl_s=0.05)
    try:
        await short.publish(snapshot(4))
        assert await boards.pending() == 4
        await asyncio.sleep(0.1)  # the batcher went away: its key expired
        boards.clock.now += LOAD_KEEPALIVE_S + 0.01
        assert await boards.pending() is None
    finally:
        await short.close()


async def test_a_redis_that_does_not_answer_holds_admissions_once_and_briefly() -> None:
    """Cut off (accepting, never answering) rather than refusing: the reads that must refresh
    first wait READ_WAIT_S once between them, not the client's one-second timeout each."""

    done = asyncio.Event()

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(1 << 16)
        await done.wait()
        writer.close()

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    board = RedisLoadBoard(f"redis://127.0.0.1:{port}/0", "cutoff")
    try:
        started = time.monotonic()
        for _ in range(20):
            assert await board.read(MODEL) is None  # don't know: admit
        waited = time.monotonic() - started
        assert waited < READ_WAIT_S + 0.2, waited
    finally:
        done.set()
        await board.close()
        server.close()
        await server.wait_closed()
