"""The batcher's published view of its load, which the API reads to refuse hopeless deadlines.

The active batcher of each model publishes a :class:`LoadSnapshot` when its load changes
(checked every ~100 ms; a quiet batcher, with nothing held, queued or running, checks at the
keep-alive, or at once when a request arrives) and at least every ``LOAD_KEEPALIVE_S``
(Redis key with a short TTL, or in memory for the embedded mode). Admission reads it to
estimate when a new request would finish; a missing or stale snapshot means "don't know" and
admits.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import orjson
import redis.asyncio as aioredis
from redis.exceptions import RedisError


@dataclass(frozen=True, slots=True)
class LoadSnapshot:
    model: str
    at: float
    slots: int
    slot_free_at: tuple[float, ...]  # per live slot: now if idle, else its batch's expected end
    pending_interactive: int
    pending_bulk: int
    queued_interactive: int  # still in the broker, not yet held by the batcher
    queued_bulk: int
    batch_s: float  # a full batch's estimated time (engine models: a typical sequence's)
    max_batch_size: int
    max_batch_delay_s: float
    arrival_rate: float
    # Engine models: room for this many more sequences and KV tokens (``slots`` is the total
    # of sequences their engines hold), and what the batcher believes a sequence takes.
    kind: str = "batch"
    free_seqs: int = 0
    free_tokens: int = 0
    capacity_tokens: int = 0
    estimate: dict[str, Any] = field(default_factory=dict)

    def encode(self) -> bytes:
        return orjson.dumps(asdict(self))

    @classmethod
    def decode(cls, body: bytes | str) -> LoadSnapshot:
        data = orjson.loads(body)
        data["slot_free_at"] = tuple(data["slot_free_at"])
        return cls(**data)

    def ahead_of(self, bulk: bool) -> int:
        """Requests a new one would queue behind: interactive go before bulk."""
        ahead = self.pending_interactive + self.queued_interactive
        return ahead + self.pending_bulk + self.queued_bulk if bulk else ahead


# A snapshot older than this says nothing reliable about the batcher now.
STALE_AFTER_S = 2.0
# The batcher publishes its load when it changes (checked every ~100 ms), and the same load
# again this often, well inside STALE_AFTER_S.
LOAD_KEEPALIVE_S = 0.5
# A read that must refresh its copy first waits for Redis at most this long: one that does not
# answer (cut off, not refusing) must not hold admissions for its socket timeout.
READ_WAIT_S = 0.05


def load_shape(snapshot: LoadSnapshot) -> LoadSnapshot:
    """What a reader would act on differently: the snapshot without its time, idle slots
    (free "now") by their count alone, and without the arrival rate, which no reader acts on
    (it is there to be seen) and which decays by the tick for seconds after each arrival: a
    batcher serving a request a second published its load ten times a second for it."""
    return replace(
        snapshot,
        at=0.0,
        slot_free_at=tuple(t for t in snapshot.slot_free_at if t > snapshot.at),
        arrival_rate=0.0,
    )


class LoadBoard(ABC):
    @abstractmethod
    async def publish(self, snapshot: LoadSnapshot) -> None: ...

    @abstractmethod
    async def read(self, model: str) -> LoadSnapshot | None: ...

    async def fresh(self, model: str, now: float) -> LoadSnapshot | None:
        """The model's snapshot, or None when there is none or it is stale: don't know."""
        snapshot = await self.read(model)
        return None if snapshot is None or now - snapshot.at > STALE_AFTER_S else snapshot

    async def close(self) -> None:
        return None


class MemoryLoadBoard(LoadBoard):
    def __init__(self) -> None:
        self._snapshots: dict[str, LoadSnapshot] = {}

    async def publish(self, snapshot: LoadSnapshot) -> None:
        self._snapshots[snapshot.model] = snapshot

    async def read(self, model: str) -> LoadSnapshot | None:
        return self._snapshots.get(model)


class RedisLoadBoard(LoadBoard):
    """Snapshots in Redis. Readers keep a local copy of the models they read (one MGET for all
    of them), refreshed when a read finds it older than ``refresh_s``: in the background while
    the copy is younger than ``LOAD_KEEPALIVE_S`` (admission does not wait on Redis), and before
    answering, for at most ``READ_WAIT_S``, once it is older. A reader nobody asks reads Redis
    not at all (it polled ten times a second)."""

    def __init__(
        self,
        url: str,
        prefix: str,
        *,
        ttl_s: float = 2.0,
        refresh_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._redis = aioredis.from_url(url, socket_connect_timeout=1, socket_timeout=1)
        self._prefix = prefix
        self._ttl_ms = int(ttl_s * 1000)
        self._refresh_s = refresh_s
        self._clock = clock
        self._local: dict[str, LoadSnapshot] = {}
        self._watched: set[str] = set()
        self._fetched_at = float("-inf")
        self._refresher: asyncio.Task[None] | None = None  # the latest, which reads share
        self._refresher_at = float("-inf")  # when it started
        self._refreshes: set[asyncio.Task[None]] = set()

    def _key(self, model: str) -> str:
        return f"{self._prefix}.load.{model}"

    async def publish(self, snapshot: LoadSnapshot) -> None:
        # On failure admission falls back to admitting; the batcher tries again shortly.
        with contextlib.suppress(RedisError, OSError):
            await self._redis.set(self._key(snapshot.model), snapshot.encode(), px=self._ttl_ms)

    async def read(self, model: str) -> LoadSnapshot | None:
        age = self._clock() - self._fetched_at
        if model not in self._watched:
            self._watched.add(model)
            # Its own read: one under way may not ask for this model.
            await self._within(self._refreshing(new=True))
        elif age > LOAD_KEEPALIVE_S:
            await self._within(self._refreshing())
        elif age > self._refresh_s:
            self._refreshing()
        return self._local.get(model)

    def _refreshing(self, *, new: bool = False) -> asyncio.Task[None]:
        """The refresh under way, or (none, or ``new``) a new one."""
        if new or self._refresher is None or self._refresher.done():
            self._refresher = asyncio.create_task(self._refresh())
            self._refresher_at = self._clock()
            self._refreshes.add(self._refresher)
            self._refresher.add_done_callback(self._refreshes.discard)
        return self._refresher

    async def _within(self, refresh: asyncio.Task[None]) -> None:
        """Wait for ``refresh`` until READ_WAIT_S after it started: reads arriving while Redis
        does not answer wait that once between them, not each in turn. It goes on behind a
        reader that stops waiting (or is cancelled)."""
        left_s = READ_WAIT_S - (self._clock() - self._refresher_at)
        if left_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(refresh), left_s)

    async def _refresh(self) -> None:
        models = sorted(self._watched)
        try:
            bodies = await self._redis.mget([self._key(m) for m in models])
        except (RedisError, OSError):
            bodies = [None] * len(models)  # stale load is worse than none: admit while away
        self._fetched_at = self._clock()
        local = dict(self._local)  # a read of fewer models (under way when one was added)
        for model, body in zip(models, bodies, strict=True):
            if body:
                local[model] = LoadSnapshot.decode(body)
            else:
                local.pop(model, None)
        self._local = local

    async def close(self) -> None:
        for refresh in list(self._refreshes):
            refresh.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresh
        await self._redis.aclose()
