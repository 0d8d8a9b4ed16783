"""Change notifications: Redis pub/sub between processes, or in memory for the embedded mode.

Notifications are hints, never the only copy: a subscriber that misses one (Redis restarting)
reads Postgres instead, and ``healthy`` tells it when it must. A batch's results notification
carries its requests as committed, so a waiting long-poll answers from it without a read.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from batchserve.core.domain import (
    BatchClosed,
    BatchJoinable,
    Event,
    JobChanged,
    KeyRevoked,
    RequestState,
    SequencesFreed,
    StateChange,
    decode_event,
    encode_event,
)
from batchserve.core.logs import get_logger

log = get_logger("batchserve.events")

Handler = Callable[[Event], None]

# Events travel on topics, and a subscriber hears only the topics it names, so that nobody
# decodes a stream it ignores: requests' state changes (many a second, results carried:
# long-polls, the webhook relay), slots freed (batch ends, an engine's sequences leaving it:
# the batcher), cancellations (also state changes of requests, heard on their own by the
# workers, which stop generating for them), bulk jobs created and cancelled (the job driver),
# API keys revoked (every API replica), batches sent ahead that requests may still join (every
# API replica, which offers them what it admits).
REQUESTS = "requests"
SLOTS = "slots"
JOINS = "joins"
CANCELS = "cancels"
JOBS = "jobs"
KEYS = "keys"


def event_topics(event: Event) -> tuple[str, ...]:
    """The topics ``event`` is published on (a cancellation on two)."""
    if isinstance(event, JobChanged):
        return (JOBS,)
    if isinstance(event, KeyRevoked):
        return (KEYS,)
    if isinstance(event, BatchJoinable):
        return (JOINS,)
    if isinstance(event, BatchClosed | SequencesFreed):
        return (SLOTS,)
    if isinstance(event, StateChange) and event.state is RequestState.CANCELLED:
        return (REQUESTS, CANCELS)
    return (REQUESTS,)


class Subscription:
    """A live subscription; ``healthy`` is False while notifications may be missed."""

    def __init__(self) -> None:
        self.healthy = False
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    async def close(self) -> None:
        self._closed = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task


class EventBus(ABC):
    @abstractmethod
    async def publish(self, event: Event) -> None:
        """Best effort: a failure is logged, never raised."""

    @abstractmethod
    def subscribe(
        self,
        handler: Handler,
        on_reconnect: Callable[[], None] | None = None,
        topics: tuple[str, ...] = (REQUESTS,),
    ) -> Subscription:
        """Call ``handler`` for every event of ``topics``, from the running loop, until
        closed."""

    async def close(self) -> None:
        return None


class MemoryEventBus(EventBus):
    def __init__(self) -> None:
        self._handlers: list[tuple[Handler, tuple[str, ...]]] = []

    async def publish(self, event: Event) -> None:
        published = event_topics(event)
        for handler, topics in list(self._handlers):
            if not any(topic in topics for topic in published):
                continue
            try:
                handler(event)
            except Exception:  # a subscriber's bug must not fail the publisher
                log.exception("event_handler_failed")

    def subscribe(
        self,
        handler: Handler,
        on_reconnect: Callable[[], None] | None = None,
        topics: tuple[str, ...] = (REQUESTS,),
    ) -> Subscription:
        entry = (handler, topics)
        self._handlers.append(entry)
        subscription = _MemorySubscription(self, entry)
        subscription.healthy = True
        return subscription


class _MemorySubscription(Subscription):
    def __init__(self, bus: MemoryEventBus, entry: tuple[Handler, tuple[str, ...]]) -> None:
        super().__init__()
        self._bus = bus
        self._entry = entry

    async def close(self) -> None:
        with contextlib.suppress(ValueError):
            self._bus._handlers.remove(self._entry)


class RedisEventBus(EventBus):
    def __init__(self, url: str, channel: str) -> None:
        self.channel = channel
        self._redis = aioredis.from_url(
            url, socket_connect_timeout=2, socket_timeout=2, health_check_interval=5
        )
        # Subscribers hold a connection with no read timeout: pub/sub waits indefinitely.
        self._sub_redis = aioredis.from_url(url, socket_connect_timeout=2, health_check_interval=5)
        self._warned = False

    def _channel(self, topic: str) -> str:
        # Request events keep the bus's own channel name; other topics get a suffix.
        return self.channel if topic == REQUESTS else f"{self.channel}.{topic}"

    async def publish(self, event: Event) -> None:
        try:
            data = encode_event(event)
            for topic in event_topics(event):
                await self._redis.publish(self._channel(topic), data)
            self._warned = False
        except (RedisError, OSError) as error:
            if not self._warned:
                log.warning("event_publish_failed", error=error)
                self._warned = True

    def subscribe(
        self,
        handler: Handler,
        on_reconnect: Callable[[], None] | None = None,
        topics: tuple[str, ...] = (REQUESTS,),
    ) -> Subscription:
        subscription = Subscription()
        channels = [self._channel(topic) for topic in topics]
        subscription._task = asyncio.create_task(
            self._listen(subscription, handler, on_reconnect, channels)
        )
        return subscription

    async def _listen(
        self,
        subscription: Subscription,
        handler: Handler,
        on_reconnect: Callable[[], None] | None,
        channels: list[str],
    ) -> None:
        backoff_s = 0.1
        while not subscription._closed:
            pubsub = self._sub_redis.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(*channels)
                subscription.healthy = True
                backoff_s = 0.1
                if on_reconnect is not None:
                    on_reconnect()
                # Checked on every wake-up too: redis-py can swallow a cancellation that lands
                # inside get_message, and close() must still end this loop.
                while not subscription._closed:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is None:
                        await pubsub.ping()
                        continue
                    if message.get("type") != "message":
                        continue
                    try:
                        handler(decode_event(message["data"]))
                    except Exception:
                        log.exception("event_handler_failed")
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as error:
                if subscription.healthy:
                    log.warning("event_subscription_lost", error=error)
                subscription.healthy = False
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 2.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()

    async def close(self) -> None:
        await self._redis.aclose()
        await self._sub_redis.aclose()
