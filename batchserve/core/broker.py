"""The request queues: RabbitMQ quorum queues, or an in-process queue for the embedded mode.

Each model has two durable quorum queues, ``requests.<model>`` (interactive) and
``requests.<model>.bulk``, with a single active consumer each: the active batcher. Messages carry
request ids and the few fields the batcher decides on; Postgres holds everything else.

A message carries the requests of one publish to one queue: one request, or a pack of up to
:data:`INTERACTIVE_PACK` interactive or :data:`BULK_PACK` bulk requests. A confirmed message
each was most of a job's ingest time, and under interactive load most of the broker's CPU and
the admission's publish time (the API publishes each group commit's requests at once); the
batcher holds a pack's requests one by one and the pack is acked once every one of them is
settled.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from typing import Any

import aio_pika
from aio_pika.abc import (
    AbstractChannel,
    AbstractIncomingMessage,
    AbstractQueue,
    AbstractRobustConnection,
)
from aio_pika.connection import make_url
from aiormq.exceptions import AMQPError
from yarl import URL

from batchserve.core.domain import Lane, QueueMessage
from batchserve.core.errors import Unavailable
from batchserve.core.logs import get_logger

log = get_logger("batchserve.broker")

# Requests a bulk message carries at most. The batcher's bulk prefetch is counted in requests
# and turned into packs, so a pack should be small against it (a quarter of 256 by default).
BULK_PACK = 64
# Requests an interactive message carries at most. The interactive prefetch stays counted in
# messages (at low load each carries one request, and the batcher must still hold several
# batches' worth), so the batcher holds at most prefetch x INTERACTIVE_PACK requests; a pack
# is settled once its last member is claimed, and its members came in together.
INTERACTIVE_PACK = 16

QUEUE_ARGUMENTS: dict[str, Any] = {
    "x-queue-type": "quorum",
    "x-single-active-consumer": True,
}


def requests_queue_name(prefix: str, model: str, lane: Lane) -> str:
    base = f"{prefix}.requests.{model}" if prefix else f"requests.{model}"
    return base if lane is Lane.INTERACTIVE else f"{base}.bulk"


class Delivery(ABC):
    redelivered: bool = False  # delivered before (to a batcher that died, or republished)

    @abstractmethod
    async def ack(self) -> None:
        """Settle the message; a failure (channel gone) means it will be redelivered."""

    async def release(self) -> None:
        """Give the message back to the queue, for the next consumer (a graceful stop)."""
        return None


Handler = Callable[[QueueMessage, Delivery], Awaitable[None]]


class RequestQueue(ABC):
    """Where admitted requests wait for the batcher."""

    @abstractmethod
    async def publish(self, messages: Sequence[QueueMessage]) -> None:
        """Publish durably (confirmed); raises :class:`Unavailable` when the broker is down."""

    @abstractmethod
    async def consume(self, model: str, lane: Lane, handler: Handler, prefetch: int) -> None:
        """Deliver messages to ``handler`` until :meth:`close`."""

    async def depth(self, model: str, lane: Lane) -> int | None:
        return None

    async def stop_consuming(self, model: str) -> None:
        """Stop delivering ``model``'s messages to this process (the standby takes over)."""
        return None

    async def close(self) -> None:
        return None


class _MemoryDelivery(Delivery):
    async def ack(self) -> None:
        return None


class MemoryRequestQueue(RequestQueue):
    """In-process queues. Nothing survives the process: the embedded mode re-enqueues at start."""

    def __init__(self) -> None:
        self._queues: dict[tuple[str, Lane], asyncio.Queue[QueueMessage]] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._pumps: dict[str, list[asyncio.Task[None]]] = {}

    def _queue(self, model: str, lane: Lane) -> asyncio.Queue[QueueMessage]:
        return self._queues.setdefault((model, lane), asyncio.Queue())

    async def publish(self, messages: Sequence[QueueMessage]) -> None:
        for message in messages:
            self._queue(message.model, message.lane).put_nowait(message)

    async def consume(self, model: str, lane: Lane, handler: Handler, prefetch: int) -> None:
        queue = self._queue(model, lane)

        async def pump() -> None:
            delivery = _MemoryDelivery()
            while True:
                message = await queue.get()
                await handler(message, delivery)

        task = asyncio.create_task(pump())
        self._tasks.append(task)
        self._pumps.setdefault(model, []).append(task)

    async def stop_consuming(self, model: str) -> None:
        for task in self._pumps.pop(model, []):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def depth(self, model: str, lane: Lane) -> int | None:
        return self._queue(model, lane).qsize()

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task


class _RabbitDelivery(Delivery):
    __slots__ = ("_message", "redelivered")

    def __init__(self, message: AbstractIncomingMessage) -> None:
        self._message = message
        self.redelivered = bool(message.redelivered)

    async def ack(self) -> None:
        try:
            await self._message.ack()
        except (AMQPError, RuntimeError, ConnectionError) as error:
            # The channel died (broker restart): the message comes back and its twin is found.
            log.debug("ack_failed", error=error, note="the message will be redelivered")

    async def release(self) -> None:
        try:
            await self._message.nack(requeue=True)
        except (AMQPError, RuntimeError, ConnectionError) as error:
            log.debug("release_failed", error=error, note="the channel's end returns it")


class _PackDelivery(Delivery):
    """A delivery that carries several requests: acked when the last of them is settled,
    released (all of it) at the first release."""

    __slots__ = ("_inner", "_left", "redelivered")

    def __init__(self, inner: _RabbitDelivery, members: int) -> None:
        self._inner = inner
        self._left = members
        self.redelivered = inner.redelivered

    async def ack(self) -> None:
        self._left -= 1
        if self._left == 0:
            await self._inner.ack()

    async def release(self) -> None:
        # Members already settled come back too: their claim finds them no longer queued.
        if self._left > 0:
            self._left = 0
            await self._inner.release()


def pack_prefetch(lane: Lane, prefetch: int) -> int:
    """The channel prefetch, in messages: the interactive one as given, the bulk one holding
    about ``prefetch`` requests."""
    return prefetch if lane is Lane.INTERACTIVE else max(1, -(-prefetch // BULK_PACK))


def pack_size(lane: Lane) -> int:
    return INTERACTIVE_PACK if lane is Lane.INTERACTIVE else BULK_PACK


def heartbeat_of(url: str, default_s: int) -> int:
    """The AMQP heartbeat a connection to ``url`` uses: the URL's own ``heartbeat=`` (aiormq
    and kombu read it from the query), else ``default_s``."""
    given = URL(url).query.get("heartbeat")
    return int(given) if given is not None and given.isdigit() else default_s


def with_heartbeat(url: str, default_s: int) -> str:
    """``url`` naming the heartbeat :func:`heartbeat_of` gives it."""
    parsed = URL(url)
    if "heartbeat" in parsed.query:
        return url
    return str(parsed.update_query(heartbeat=default_s))


class RabbitRequestQueue(RequestQueue):
    def __init__(
        self, url: str, prefix: str, *, publish_timeout_s: float = 5.0, heartbeat_s: int = 5
    ) -> None:
        self._url = with_heartbeat(url, heartbeat_s)
        self.connection_name = f"batchserve {prefix}".strip()
        self._prefix = prefix
        self._publish_timeout_s = publish_timeout_s
        self._connection: AbstractRobustConnection | None = None
        self._publish_channel: AbstractChannel | None = None
        self._declared: set[str] = set()
        self._consumers: dict[str, list[tuple[AbstractQueue, str]]] = {}
        # Per interactive queue consumed here, the requests a message carried (moving mean).
        self._members_seen: dict[str, float] = {}
        self._lock = asyncio.Lock()
        self._channel_lock = asyncio.Lock()

    async def _connect(self) -> AbstractRobustConnection:
        if self._connection is None or self._connection.is_closed:
            async with self._lock:
                if self._connection is None or self._connection.is_closed:
                    connection = aio_pika.RobustConnection(
                        make_url(self._url),
                        # Named by deployment, so an operator (and a test) tells them apart.
                        client_properties={"connection_name": self.connection_name},
                    )
                    try:
                        await connection.connect(timeout=5)
                    except (TimeoutError, AMQPError, OSError) as error:
                        # Closed here: aio_pika.connect_robust leaves a failed connection open,
                        # and its finalizer, run by a collection in another thread, makes a
                        # close() coroutine it cannot schedule ("never awaited").
                        with contextlib.suppress(AMQPError, OSError):
                            await connection.close()
                        raise Unavailable(
                            f"broker unreachable: {error!r}", component="broker"
                        ) from error
                    self._connection = connection
        return self._connection

    async def _channel(self) -> AbstractChannel:
        channel = self._publish_channel
        if channel is not None and not channel.is_closed:
            return channel
        connection = await self._connect()
        async with self._channel_lock:  # concurrent publishers share one confirmed channel
            if self._publish_channel is None or self._publish_channel.is_closed:
                self._publish_channel = await connection.channel(publisher_confirms=True)
            return self._publish_channel

    async def declare(self, channel: AbstractChannel, name: str) -> None:
        if name not in self._declared:
            await channel.declare_queue(name, durable=True, arguments=QUEUE_ARGUMENTS)
            self._declared.add(name)

    async def publish(self, messages: Sequence[QueueMessage]) -> None:
        if not messages:
            return
        async with self._confirmed() as channel:
            exchange = channel.default_exchange
            for name in {requests_queue_name(self._prefix, m.model, m.lane) for m in messages}:
                await self.declare(channel, name)
            await asyncio.gather(
                *(
                    exchange.publish(
                        aio_pika.Message(
                            body,
                            delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                            content_type="application/json",
                            message_id=first_id,
                        ),
                        routing_key=routing_key,
                    )
                    for routing_key, first_id, body in self._bodies(messages)
                )
            )

    async def send(self, queue: str, message: aio_pika.Message) -> None:
        """Publish one message, confirmed, to a classic durable queue that another consumer
        declares the same way (Celery's ``batches.<model>``: no queue arguments)."""
        async with self._confirmed() as channel:
            if queue not in self._declared:
                await channel.declare_queue(queue, durable=True)
                self._declared.add(queue)
            await channel.default_exchange.publish(message, routing_key=queue)

    @contextlib.asynccontextmanager
    async def _confirmed(self) -> AsyncIterator[AbstractChannel]:
        """The confirmed channel, for publishes that are over when the block ends: one bound
        for all of it (a channel being reopened or a declare waits as long as the confirms
        may); a failure is :class:`Unavailable`, and the next publish opens a new channel."""
        try:
            async with asyncio.timeout(self._publish_timeout_s):
                yield await self._channel()
        except Unavailable:
            raise
        except (TimeoutError, AMQPError, OSError, RuntimeError) as error:
            self._publish_channel = None
            raise Unavailable(f"broker publish failed: {error!r}", component="broker") from error

    def _bodies(self, messages: Sequence[QueueMessage]) -> Iterator[tuple[str, str, bytes]]:
        """(routing key, first request id, body) of each AMQP message: the requests of each
        queue in packs of up to its lane's :func:`pack_size`, a lone request as itself."""
        packs: dict[tuple[str, Lane], list[QueueMessage]] = {}
        for m in messages:
            packs.setdefault(
                (requests_queue_name(self._prefix, m.model, m.lane), m.lane), []
            ).append(m)
        for (name, lane), members in packs.items():
            size = pack_size(lane)
            for first in range(0, len(members), size):
                pack = members[first : first + size]
                body = pack[0].encode() if len(pack) == 1 else QueueMessage.encode_pack(pack)
                yield name, pack[0].id, body

    async def consume(self, model: str, lane: Lane, handler: Handler, prefetch: int) -> None:
        """``prefetch``: about how many requests this consumer holds unsettled at most."""
        connection = await self._connect()
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=pack_prefetch(lane, prefetch))
        name = requests_queue_name(self._prefix, model, lane)
        queue = await channel.declare_queue(name, durable=True, arguments=QUEUE_ARGUMENTS)

        async def on_message(incoming: AbstractIncomingMessage) -> None:
            try:
                messages = QueueMessage.decode_any(incoming.body)
                if not messages:
                    raise ValueError("an empty pack")
            except (ValueError, KeyError, TypeError):
                log.error("malformed_request_message", queue=name, body=repr(incoming.body[:200]))
                await incoming.reject(requeue=False)
                return
            if lane is Lane.INTERACTIVE:  # interactive packs vary: count them as they come
                seen = self._members_seen.get(name, 1.0)
                self._members_seen[name] = seen + (len(messages) - seen) * 0.05
            single = _RabbitDelivery(incoming)
            delivery = single if len(messages) == 1 else _PackDelivery(single, len(messages))
            for message in messages:
                await handler(message, delivery)

        tag = await queue.consume(on_message)
        self._consumers.setdefault(model, []).append((queue, tag))

    async def stop_consuming(self, model: str) -> None:
        for queue, tag in self._consumers.pop(model, []):
            try:
                await queue.cancel(tag)
            except (AMQPError, RuntimeError, ConnectionError, OSError) as error:
                log.debug("cancel_consumer_failed", model=model, error=error)

    async def depth(self, model: str, lane: Lane) -> int | None:
        try:
            channel = await self._channel()
            name = requests_queue_name(self._prefix, model, lane)
            queue = await channel.declare_queue(name, durable=True, arguments=QUEUE_ARGUMENTS)
            messages = int(queue.declaration_result.message_count or 0)
            if lane is Lane.INTERACTIVE:
                # As many requests a message as the ones this consumer took lately carried.
                return math.ceil(messages * self._members_seen.get(name, 1.0))
            # Bulk messages are packs: count them full (an upper bound; most are).
            return messages * BULK_PACK
        except (Unavailable, AMQPError, OSError, RuntimeError):
            return None

    async def delete_queues(self, models: Sequence[str]) -> None:
        """Remove this prefix's request queues (test clean-up)."""
        channel = await self._channel()
        for model in models:
            for lane in Lane:
                with contextlib.suppress(AMQPError):
                    await channel.queue_delete(requests_queue_name(self._prefix, model, lane))

    async def close(self) -> None:
        if self._connection is not None:
            with contextlib.suppress(Exception):
                await self._connection.close()
