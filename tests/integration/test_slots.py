"""The slot directory: what the live workers of a model announce, summed; on Redis (one
round trip, the batcher reads it four times a second) as in memory (the embedded mode)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from batchserve.core.clock import deployment_time
from batchserve.core.settings import Settings
from batchserve.core.slots import (
    Capacity,
    MemorySlotDirectory,
    RedisSlotDirectory,
    SlotDirectory,
    SlotRegistration,
)

PROFILE = {"prefill_tokens_per_s": 900.0, "decode_step_s": 0.02}


class Directory:
    """A directory and a way to announce a worker in it, for either backend."""

    def __init__(self, settings: Settings, redis: bool) -> None:
        self.settings = settings
        self.memory = None if redis else MemorySlotDirectory()
        self.directory: SlotDirectory = self.memory or RedisSlotDirectory(
            str(settings.redis_url), settings.key_prefix
        )

    def announce(self, model: str, worker: str, slots: int, ttl_s: float, **extra: Any) -> None:
        if self.memory is not None:
            self.memory.register(model, worker, slots, deployment_time() + ttl_s, **extra)
            return
        registration = SlotRegistration(
            str(self.settings.redis_url), self.settings.key_prefix, model, worker, slots, **extra
        )
        assert registration.beat(ttl_s)


@pytest.fixture(params=["redis", "memory"])
async def directory(request: pytest.FixtureRequest, settings: Settings) -> AsyncIterator[Directory]:
    made = Directory(settings, request.param == "redis")
    yield made
    if isinstance(made.directory, RedisSlotDirectory):
        await made.directory.close()


async def test_a_model_no_worker_announced_has_no_capacity(directory: Directory) -> None:
    assert await directory.directory.capacity("nobody", deployment_time()) == Capacity(0)


async def test_the_live_workers_are_summed_and_a_silent_one_left_out(
    directory: Directory,
) -> None:
    directory.announce("batch", "w1", 2, 10.0)
    directory.announce("batch", "w2", 3, 10.0)
    directory.announce("batch", "w3", 5, -1.0)  # its heartbeat ran out a second ago
    directory.announce("other", "w4", 7, 10.0)
    found = await directory.directory.capacity("batch", deployment_time())
    assert found == Capacity(5, workers=2)


async def test_engines_sum_sequences_and_tokens_and_bring_their_measured_speed(
    directory: Directory,
) -> None:
    directory.announce("engine", "e1", 32, 10.0, tokens=45_000, profile=PROFILE)
    directory.announce("engine", "e2", 16, 10.0, tokens=20_000)
    found = await directory.directory.capacity("engine", deployment_time())
    assert found == Capacity(48, 65_000, PROFILE, 2)
