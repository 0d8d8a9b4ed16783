"""Connect the adapters a process needs, from settings: servers, or the embedded defaults."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from batchserve.core.broker import MemoryRequestQueue, RabbitRequestQueue, RequestQueue
from batchserve.core.clock import follow_database
from batchserve.core.db import Statements, autocommit, create_engine, is_postgres
from batchserve.core.domain import Lane, StateChange
from batchserve.core.events import EventBus, MemoryEventBus, RedisEventBus
from batchserve.core.joins import JoinBox, MemoryJoinBox, RedisJoinBox
from batchserve.core.loadboard import LoadBoard, MemoryLoadBoard, RedisLoadBoard
from batchserve.core.logs import get_logger
from batchserve.core.ratelimit import MemoryRateLimiter, RateLimiter, RedisRateLimiter
from batchserve.core.settings import Settings
from batchserve.core.slots import MemorySlotDirectory, RedisSlotDirectory, SlotDirectory
from batchserve.core.store import JobStore, OnChange
from batchserve.core.tokenlog import MemoryTokenLog, RedisTokenLog, TokenLog, TokenLogConfig
from batchserve.models.registry import Registry, load_registry

log = get_logger("batchserve.wiring")

# How long one client's close may take before a stopping role leaves it behind.
CLOSE_S = 3.0


async def _close_within(close: Callable[[], Awaitable[None]]) -> None:
    try:
        await asyncio.wait_for(close(), CLOSE_S)
    except TimeoutError:
        log.warning("close_timed_out", client=getattr(close, "__qualname__", repr(close)))


@dataclass
class Adapters:
    settings: Settings
    registry: Registry
    engine: AsyncEngine
    store: JobStore
    queue: RequestQueue
    events: EventBus
    slots: SlotDirectory
    loadboard: LoadBoard
    ratelimit: RateLimiter
    tokens: TokenLog
    joins: JoinBox = field(default_factory=MemoryJoinBox)

    async def close(self) -> None:
        """Close every client, each within :data:`CLOSE_S`: one whose close hangs is logged
        (``close_timed_out``, naming it) and left behind, so that a stopping role still exits
        within its grace period."""
        closers = [
            self.queue.close,
            self.events.close,
            self.loadboard.close,
            self.ratelimit.close,
            self.tokens.close,
            self.joins.close,
        ]
        if isinstance(self.slots, RedisSlotDirectory):
            closers.append(self.slots.close)
        if self.store.statements is not None:
            closers.append(self.store.statements.close)
        for closer in closers:
            with contextlib.suppress(Exception):
                await _close_within(closer)
        await _close_within(self.engine.dispose)

    async def check(self) -> dict[str, str]:
        """Reachability of each backing server, for ``/readyz``."""
        checks: dict[str, str] = {}
        try:
            async with autocommit(self.engine) as conn:
                await conn.execute(text("SELECT 1"))
            checks["database"] = "ok"
        except Exception as error:
            checks["database"] = f"unreachable: {type(error).__name__}"
        if self.settings.embedded:
            checks["broker"] = checks["events"] = "ok (in-process)"
            return checks
        names = self.registry.names()
        depth = await self.queue.depth(names[0], Lane.INTERACTIVE) if names else 0
        checks["broker"] = "ok" if depth is not None else "unreachable"
        total = await self.slots.total_slots("__readyz__", 0.0)
        checks["events"] = "ok" if total is not None else "unreachable"
        return checks


def token_log_config(settings: Settings) -> TokenLogConfig:
    return TokenLogConfig(
        ttl_s=settings.token_log_ttl_s,
        linger_s=settings.token_log_linger_s,
        max_entries=settings.token_log_max_entries,
    )


def redis_token_log(settings: Settings) -> RedisTokenLog:
    assert settings.redis_url
    return RedisTokenLog(settings.redis_url, settings.key_prefix, token_log_config(settings))


def store_hook(events: EventBus, tokens: TokenLog) -> OnChange:
    """What a committed state change sets off: its entries in the token log (queued, never
    awaited), then the notification that wakes long-polls, the batcher and workers."""

    async def on_change(event: StateChange) -> None:
        await tokens.on_change(event)
        await events.publish(event)

    return on_change


def redis_event_bus(settings: Settings) -> RedisEventBus:
    """The deployment's event bus on Redis (every role's, and the admin commands')."""
    assert settings.redis_url
    return RedisEventBus(settings.redis_url, settings.name("events"))


def connect(
    settings: Settings,
    *,
    pool_size: int = 10,
    max_overflow: int | None = None,
    events: EventBus | None = None,
) -> Adapters:
    registry = load_registry(settings.models)
    if not settings.embedded:
        follow_database(settings.effective_database_url)  # the deployment's one clock
    engine = create_engine(
        settings.effective_database_url, pool_size=pool_size, max_overflow=max_overflow
    )
    queue: RequestQueue
    slots: SlotDirectory
    loadboard: LoadBoard
    ratelimit: RateLimiter
    tokens: TokenLog
    joins: JoinBox
    if settings.embedded:
        events = events or MemoryEventBus()
        queue = MemoryRequestQueue()
        slots = MemorySlotDirectory()
        loadboard = MemoryLoadBoard()
        ratelimit = MemoryRateLimiter()
        tokens = MemoryTokenLog(token_log_config(settings))
        joins = MemoryJoinBox()
    else:
        assert settings.broker_url and settings.redis_url
        events = events or redis_event_bus(settings)
        queue = RabbitRequestQueue(
            settings.broker_url, settings.namespace, heartbeat_s=settings.broker_heartbeat_s
        )
        slots = RedisSlotDirectory(settings.redis_url, settings.key_prefix)
        loadboard = RedisLoadBoard(settings.redis_url, settings.key_prefix)
        ratelimit = RedisRateLimiter(settings.redis_url, settings.key_prefix)
        tokens = redis_token_log(settings)
        joins = RedisJoinBox(settings.redis_url, settings.key_prefix)
    statements = (
        Statements(settings.effective_database_url, size=pool_size) if is_postgres(engine) else None
    )
    store = JobStore(
        engine,
        max_failures=settings.max_failures,
        on_change=store_hook(events, tokens),
        statements=statements,
    )
    return Adapters(
        settings, registry, engine, store, queue, events, slots, loadboard, ratelimit, tokens, joins
    )
