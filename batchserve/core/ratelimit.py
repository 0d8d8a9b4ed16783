"""Token buckets for submission rates: in Redis, shared by every API replica, or in memory for
the embedded mode. ``take`` answers 0 when allowed, else the seconds until a token is there."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from batchserve.core.logs import get_logger

log = get_logger("batchserve.ratelimit")

# Refill by elapsed time (Redis' clock, the same for every replica), then take one token.
_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local clock = redis.call('TIME')
local now = tonumber(clock[1]) + tonumber(clock[2]) / 1000000
local state = redis.call('HMGET', KEYS[1], 'tokens', 'at')
local tokens = tonumber(state[1]) or burst
local at = tonumber(state[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - at) * rate)
local wait = 0
if tokens >= 1 then
  tokens = tokens - 1
else
  wait = (1 - tokens) / rate
end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'at', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil(burst / rate * 1000) + 1000)
return tostring(wait)
"""


class RateLimiter(ABC):
    @abstractmethod
    async def take(self, key: str, rate_per_s: float, burst: int) -> float: ...

    async def close(self) -> None:
        return None


class MemoryRateLimiter(RateLimiter):
    def __init__(self) -> None:
        self._buckets: dict[str, tuple[float, float]] = {}

    async def take(self, key: str, rate_per_s: float, burst: int) -> float:
        now = time.monotonic()
        tokens, at = self._buckets.get(key, (float(burst), now))
        tokens = min(float(burst), tokens + (now - at) * rate_per_s)
        if tokens >= 1:
            self._buckets[key] = (tokens - 1, now)
            return 0.0
        self._buckets[key] = (tokens, now)
        return (1 - tokens) / rate_per_s


class RedisRateLimiter(RateLimiter):
    def __init__(self, url: str, prefix: str) -> None:
        self._redis = aioredis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self._script = self._redis.register_script(_TAKE)
        self._prefix = prefix

    async def take(self, key: str, rate_per_s: float, burst: int) -> float:
        try:
            wait = await self._script(keys=[f"{self._prefix}.rate.{key}"], args=[rate_per_s, burst])
        except (RedisError, OSError) as error:
            # Redis away: admit (the queued quota and the backlog bound still hold).
            log.warning("rate_limit_unavailable", error=type(error).__name__)
            return 0.0
        return float(wait)

    async def close(self) -> None:
        await self._redis.aclose()
