"""Worker slots, learned from the workers themselves: each registers with a heartbeat.

A worker with ``n`` slots runs at most ``n`` batches at once. The batcher sums the slots of the
workers whose heartbeat is fresh; a worker that stops beating drops out after ``ttl_s``.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from typing import cast

import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError


def _keys(prefix: str, model: str) -> tuple[str, str]:
    return f"{prefix}.workers.{model}", f"{prefix}.worker_slots.{model}"


class SlotDirectory(ABC):
    @abstractmethod
    async def total_slots(self, model: str, now: float) -> int | None:
        """Slots of live workers of ``model``; ``None`` when the directory can't be read."""


class MemorySlotDirectory(SlotDirectory):
    def __init__(self) -> None:
        self._workers: dict[str, dict[str, tuple[int, float]]] = {}

    def register(self, model: str, worker_id: str, slots: int, expires_at: float) -> None:
        self._workers.setdefault(model, {})[worker_id] = (slots, expires_at)

    def deregister(self, model: str, worker_id: str) -> None:
        self._workers.get(model, {}).pop(worker_id, None)

    async def total_slots(self, model: str, now: float) -> int | None:
        workers = self._workers.get(model, {})
        return sum(slots for slots, expires_at in workers.values() if expires_at > now)


class RedisSlotDirectory(SlotDirectory):
    def __init__(self, url: str, prefix: str) -> None:
        self._redis = aioredis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self._prefix = prefix

    async def total_slots(self, model: str, now: float) -> int | None:
        live_key, slots_key = _keys(self._prefix, model)
        try:
            live = cast(list[bytes], await self._redis.zrangebyscore(live_key, now, "+inf"))
            if not live:
                return 0
            values = await self._redis.hmget(slots_key, [w.decode() for w in live])
        except (RedisError, OSError):
            return None
        return sum(int(v) for v in values if v is not None)

    async def close(self) -> None:
        await self._redis.aclose()


class SlotRegistration:
    """A worker's side: announce ``slots`` for ``model`` and keep the announcement fresh."""

    def __init__(self, url: str, prefix: str, model: str, worker_id: str, slots: int) -> None:
        self._redis = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self._live_key, self._slots_key = _keys(prefix, model)
        self.worker_id = worker_id
        self.slots = slots

    def beat(self, ttl_s: float) -> bool:
        now = time.time()
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.hset(self._slots_key, self.worker_id, self.slots)
            pipe.zadd(self._live_key, {self.worker_id: now + ttl_s})
            pipe.zremrangebyscore(self._live_key, "-inf", now - 60)
            pipe.execute()
        except (RedisError, OSError):
            return False
        return True

    def withdraw(self) -> None:
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.zrem(self._live_key, self.worker_id)
            pipe.hdel(self._slots_key, self.worker_id)
            pipe.execute()
        except (RedisError, OSError):
            pass
