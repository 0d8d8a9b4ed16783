"""Worker capacity, learned from the workers themselves: each registers with a heartbeat.

A batch worker with ``n`` slots runs at most ``n`` batches at once. An engine worker announces
what its engine holds at once: sequences and KV tokens (``"32/45000"``), with the speed it
measured when it started. The batcher sums what the workers whose heartbeat is fresh announce;
a worker that stops beating drops out after ``ttl_s``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import redis
import redis.asyncio as aioredis
from redis.exceptions import RedisError

from batchserve.core.clock import deployment_time


def _keys(prefix: str, model: str) -> tuple[str, str, str]:
    return (
        f"{prefix}.workers.{model}",
        f"{prefix}.worker_slots.{model}",
        f"{prefix}.worker_profiles.{model}",
    )


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the live workers of a model hold at once, together."""

    units: int  # batch slots, or engine sequences
    tokens: int = 0  # engine KV tokens
    profile: dict[str, Any] | None = None  # an engine's measured speed (one live worker's)
    workers: int = 0


def encode_units(units: int, tokens: int | None) -> str:
    return str(units) if tokens is None else f"{units}/{tokens}"


def _sum(values: Iterable[str], profiles: Iterable[Any]) -> Capacity:
    units = tokens = workers = 0
    for value in values:
        head, _, tail = value.partition("/")
        units += int(head)
        tokens += int(tail) if tail else 0
        workers += 1
    profile = next((p for p in profiles if p), None)
    return Capacity(units, tokens, profile, workers)


class SlotDirectory(ABC):
    @abstractmethod
    async def capacity(self, model: str, now: float) -> Capacity | None:
        """What live workers of ``model`` hold; ``None`` when the directory can't be read."""

    async def total_slots(self, model: str, now: float) -> int | None:
        """Slots (or engine sequences) of live workers of ``model``."""
        found = await self.capacity(model, now)
        return None if found is None else found.units


class MemorySlotDirectory(SlotDirectory):
    def __init__(self) -> None:
        self._workers: dict[str, dict[str, tuple[str, float, dict[str, Any] | None]]] = {}

    def register(
        self,
        model: str,
        worker_id: str,
        slots: int,
        expires_at: float,
        *,
        tokens: int | None = None,
        profile: dict[str, Any] | None = None,
    ) -> None:
        value = encode_units(slots, tokens)
        self._workers.setdefault(model, {})[worker_id] = (value, expires_at, profile)

    async def capacity(self, model: str, now: float) -> Capacity | None:
        live = [w for w in self._workers.get(model, {}).values() if w[1] > now]
        return _sum((value for value, _, _ in live), (profile for _, _, profile in live))


# The live workers' announcements and profiles, read in one round trip (the batcher reads
# them four times a second, idle or not).
_LIVE = """
local live = redis.call('ZRANGEBYSCORE', KEYS[1], ARGV[1], '+inf')
if #live == 0 then return {{}, {}} end
return {redis.call('HMGET', KEYS[2], unpack(live)), redis.call('HMGET', KEYS[3], unpack(live))}
"""


class RedisSlotDirectory(SlotDirectory):
    def __init__(self, url: str, prefix: str) -> None:
        self._redis = aioredis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self._live = self._redis.register_script(_LIVE)
        self._prefix = prefix

    async def capacity(self, model: str, now: float) -> Capacity | None:
        try:
            values, profiles = await self._live(keys=_keys(self._prefix, model), args=[repr(now)])
        except (RedisError, OSError):
            return None
        return _sum(
            (v.decode() if isinstance(v, bytes) else str(v) for v in values if v is not None),
            (orjson.loads(p) for p in profiles if p),
        )

    async def close(self) -> None:
        await self._redis.aclose()


class SlotRegistration:
    """A worker's side: announce its capacity for ``model`` and keep the announcement fresh."""

    def __init__(
        self,
        url: str,
        prefix: str,
        model: str,
        worker_id: str,
        slots: int,
        *,
        tokens: int | None = None,
        profile: dict[str, Any] | None = None,
    ) -> None:
        self._redis = redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self._live_key, self._slots_key, self._profiles_key = _keys(prefix, model)
        self.worker_id = worker_id
        self.value = encode_units(slots, tokens)
        self.profile = profile

    def beat(self, ttl_s: float) -> bool:
        now = deployment_time()  # the batcher compares it on its own host
        try:
            pipe = self._redis.pipeline(transaction=False)
            pipe.hset(self._slots_key, self.worker_id, self.value)
            if self.profile is not None:
                pipe.hset(self._profiles_key, self.worker_id, orjson.dumps(self.profile))
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
            pipe.hdel(self._profiles_key, self.worker_id)
            pipe.execute()
        except (RedisError, OSError):
            pass
