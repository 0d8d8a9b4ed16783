"""Late joiners: requests that arrive after a batch was sent, and still ride in it.

The batcher sends a slot its next batch ahead of the running one's end (the pipeline lead),
so that the claim, the Celery hand-over and the lease are done when the slot frees. A request
that arrives within that lead would otherwise miss the batch and wait a whole batch more. So a
batch sent behind a running one, with room, is *joinable*: until its model starts, the batcher
offers it the requests that arrive (what the worker runs: input, parameters, when it was
created and when the batcher held it) in the batch's join box. The worker seals the box the
moment its slot frees, takes what was offered and runs it with the rest at once, while it
claims those still queued into the batch (one statement, fenced by the batch's attempt, begun a
few milliseconds later, clear of the batch before's answers: ``JOIN_CLAIM_DELAY_S`` in
``batchserve/workers/runner.py``); its results write waits for that claim and keeps only the
answers of those it claimed.

The API offers too: the batcher announces each joinable batch (``BatchJoinable``, with the
box's capacity), and the API puts a request it is admitting in the box at once, the offer
sent as its commit is (a request offered but never committed is run and its answer thrown
away: the worker's claim finds no row of it), where the batcher's offer waited for the
broker's delivery and a read of the request's inputs (docs/frontdoor.md). Its message, once
committed, then names the batch, and the
batcher settles it with that batch as if it had offered it. Whoever offers, the box holds no
more than its capacity: an offer that would pass it is refused whole, as a sealed box refuses.

The box decides nothing; Postgres does. A request the worker claimed is the batch's (its
lease, its reaping, its results); one it did not (cancelled meanwhile, the worker died first,
the box sealed before the offer) is still ``queued`` and the batcher, which holds its broker
delivery until then, batches it again. Each offer is all or nothing: refused once sealed.

On Redis (a list and a seal key for each batch, with a TTL) for a deployment; in memory for
the embedded mode and tests. A Celery pool process seals from the thread that runs its model
(``take_blocking``): the slot stands idle until that model starts, and a hop to the process's
event loop and back cost it more than the Redis round trip (docs/frontdoor.md).
"""

from __future__ import annotations

import threading
import time
import uuid
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Callable, Sequence

import orjson
import redis
import redis.asyncio as aioredis
from redis.commands.core import Script

from batchserve.core.domain import BatchItem

# How long a box outlives its last offer or its seal: far past any batch's start.
JOIN_TTL_S = 600.0

# KEYS: the box, its seal. ARGV: ttl ms, capacity (-1: none), then the joiners. 1: offered;
# 0: sealed already, or the box would hold more than its capacity.
_OFFER = """
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
local capacity = tonumber(ARGV[2])
if capacity >= 0 and redis.call('LLEN', KEYS[1]) + #ARGV - 2 > capacity then return 0 end
redis.call('RPUSH', KEYS[1], unpack(ARGV, 3))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return 1
"""
# KEYS: the box, its seal. ARGV: ttl ms. What was offered; nothing can be offered after.
_TAKE = """
redis.call('SET', KEYS[2], '1', 'PX', ARGV[1])
local offered = redis.call('LRANGE', KEYS[1], 0, -1)
redis.call('DEL', KEYS[1])
return offered
"""


_TIMEOUTS = {"socket_connect_timeout": 1, "socket_timeout": 2}


# A joiner travels as the batch item the worker runs (its ``received_at``: when the batcher
# held it).
def _encode(item: BatchItem) -> bytes:
    return orjson.dumps(item.as_dict())


def _decode(raw: bytes | str) -> BatchItem:
    return BatchItem(**orjson.loads(raw))


def _once_each(offered: Sequence[BatchItem]) -> list[BatchItem]:
    """What a box held, each request once (the API and the batcher may both have offered one,
    a batcher that took over not knowing the API's offer)."""
    seen: set[str] = set()
    once = []
    for item in offered:
        if item.request_id not in seen:
            seen.add(item.request_id)
            once.append(item)
    return once


class JoinBox(ABC):
    @abstractmethod
    async def offer(
        self, batch_id: uuid.UUID, joiners: Sequence[BatchItem], capacity: int | None = None
    ) -> bool:
        """Offer ``joiners`` (as the worker will run them) to a batch whose model has not
        started: ``False`` once it has (the box is sealed), or when the box would then hold
        more than ``capacity``, and then none of them is offered."""

    @abstractmethod
    async def take(self, batch_id: uuid.UUID) -> list[BatchItem]:
        """Seal the batch's box and return what was offered to it (the worker, as its model
        starts)."""

    @abstractmethod
    def take_blocking(self, batch_id: uuid.UUID) -> list[BatchItem]:
        """:meth:`take` for a thread outside the event loop (a pool process's model thread)."""

    async def close(self) -> None:
        return None


class MemoryJoinBox(JoinBox):
    """The embedded mode's boxes: like Redis's, each forgotten ``ttl_s`` after its last offer
    or its seal (a box offered to a batch that never ran does not stay)."""

    def __init__(
        self, ttl_s: float = JOIN_TTL_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._ttl_s = ttl_s
        self._clock = clock
        self._offered: OrderedDict[uuid.UUID, tuple[float, list[BatchItem]]] = OrderedDict()
        self._sealed: OrderedDict[uuid.UUID, float] = OrderedDict()  # batch -> seal lapses at
        self._lock = threading.Lock()  # a seal from another thread against the loop's offers

    def __len__(self) -> int:
        """Boxes held (offered to or sealed)."""
        return len(self._offered) + len(self._sealed)

    def _forget_old(self, now: float) -> None:
        # Each kept in order of its expiry (refreshed ones moved to the end).
        for held in (self._sealed, self._offered):
            while held:
                first = next(iter(held))
                until = self._sealed[first] if held is self._sealed else self._offered[first][0]
                if until > now:
                    break
                del held[first]

    async def offer(
        self, batch_id: uuid.UUID, joiners: Sequence[BatchItem], capacity: int | None = None
    ) -> bool:
        with self._lock:
            now = self._clock()
            self._forget_old(now)
            if batch_id in self._sealed:
                return False
            _, offered = self._offered.get(batch_id, (0.0, []))
            if capacity is not None and len(offered) + len(joiners) > capacity:
                return False
            self._offered.pop(batch_id, None)  # put back last: the boxes in order of expiry
            self._offered[batch_id] = (now + self._ttl_s, [*offered, *joiners])
            return True

    async def take(self, batch_id: uuid.UUID) -> list[BatchItem]:
        return self.take_blocking(batch_id)

    def take_blocking(self, batch_id: uuid.UUID) -> list[BatchItem]:
        with self._lock:
            now = self._clock()
            self._forget_old(now)
            self._sealed.pop(batch_id, None)
            self._sealed[batch_id] = now + self._ttl_s
            return _once_each(self._offered.pop(batch_id, (0.0, []))[1])


class RedisJoinBox(JoinBox):
    def __init__(self, url: str, prefix: str, ttl_s: float = JOIN_TTL_S) -> None:
        self._url = url
        self._redis = aioredis.from_url(url, **_TIMEOUTS)
        self._prefix = prefix
        self._ttl_ms = str(int(ttl_s * 1000))
        self._offer = self._redis.register_script(_OFFER)
        self._take = self._redis.register_script(_TAKE)
        # A client of its own, and its take, made by the first take_blocking.
        self._blocking: tuple[redis.Redis, Script] | None = None

    def _keys(self, batch_id: uuid.UUID) -> list[str]:
        box = f"{self._prefix}.join.{batch_id}"
        return [box, f"{box}.sealed"]

    async def offer(
        self, batch_id: uuid.UUID, joiners: Sequence[BatchItem], capacity: int | None = None
    ) -> bool:
        if not joiners:
            return True
        limit = str(-1 if capacity is None else capacity)
        args: list[bytes | str] = [self._ttl_ms, limit, *(_encode(j) for j in joiners)]
        return bool(await self._offer(keys=self._keys(batch_id), args=args))

    async def take(self, batch_id: uuid.UUID) -> list[BatchItem]:
        offered = await self._take(keys=self._keys(batch_id), args=[self._ttl_ms])
        return _once_each([_decode(raw) for raw in offered])

    def take_blocking(self, batch_id: uuid.UUID) -> list[BatchItem]:
        if self._blocking is None:
            client = redis.Redis.from_url(self._url, **_TIMEOUTS)
            self._blocking = (client, client.register_script(_TAKE))
        offered = self._blocking[1](keys=self._keys(batch_id), args=[self._ttl_ms])
        return _once_each([_decode(raw) for raw in offered])

    async def close(self) -> None:
        await self._redis.aclose()
        if self._blocking is not None:
            self._blocking[0].close()
