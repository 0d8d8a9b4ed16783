"""The batch task on the real broker: the batcher publishes it on its own loop (aio-pika), and
what reaches the worker's queue is the message Celery's own ``send_task`` would have sent."""

from __future__ import annotations

import asyncio
import gc
import time
from typing import Any

import aio_pika
import pytest
from kombu import Queue

from batchserve.core.broker import RabbitRequestQueue
from batchserve.core.domain import BatchItem, BatchMessage
from batchserve.core.errors import Unavailable
from batchserve.core.settings import Settings
from batchserve.workers.celery_app import RUN_BATCH_TASK, batches_queue_name, create_celery
from batchserve.workers.dispatch import CeleryDispatcher
from tests.support import servers

ECHO = "echo-100ms"


def batch(batch_id: str) -> BatchMessage:
    now = time.time()
    item = BatchItem(
        request_id="r1",
        input="hello",
        messages=None,
        params={"max_tokens": 4},
        created_at=now,
        received_at=now,
    )
    return BatchMessage(
        batch_id=batch_id, model=ECHO, dispatched_at=now, estimated_s=0.1, items=(item,)
    )


async def take(channel: aio_pika.abc.AbstractChannel, name: str) -> aio_pika.IncomingMessage:
    queue = await channel.declare_queue(name, durable=True, passive=True)
    for _ in range(50):
        found = await queue.get(no_ack=True, fail=False)
        if found is not None:
            return found  # type: ignore[return-value]
        await asyncio.sleep(0.05)
    raise AssertionError(f"nothing on {name}")


def without_argsrepr(headers: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in headers.items() if k != "argsrepr"}


async def test_the_batch_message_is_the_one_celery_would_send(settings: Settings) -> None:
    app = create_celery(settings, [ECHO])
    broker = RabbitRequestQueue(settings.broker_url or "", settings.namespace)
    ours, theirs = batches_queue_name(settings, ECHO), settings.name("celery-sent")
    message = batch("0195f0c2-0000-7000-8000-000000000001")
    connection = await aio_pika.connect(settings.broker_url or "")
    try:
        await CeleryDispatcher(app, settings, broker).dispatch(message, 2.5)
        await asyncio.to_thread(
            app.send_task,
            RUN_BATCH_TASK,
            args=[message.as_dict()],
            queue=Queue(theirs, routing_key=theirs, durable=True),
            time_limit=2.5,
            task_id=message.batch_id,
        )
        channel = await connection.channel()
        sent, expected = await take(channel, ours), await take(channel, theirs)
        assert sent.body == expected.body
        assert without_argsrepr(sent.headers) == without_argsrepr(expected.headers)
        assert sent.headers["timelimit"] == [2.5, None]
        assert sent.headers["argsrepr"] == "batch of 1"  # not every member's input in a log
        for name in ("content_type", "content_encoding", "delivery_mode", "correlation_id"):
            assert getattr(sent, name) == getattr(expected, name), name
    finally:
        await connection.close()
        await broker.close()
        await asyncio.to_thread(servers.delete_namespace_queues, settings.namespace, [ECHO])
        await asyncio.to_thread(servers._delete_over_amqp, [theirs])


async def test_an_unreachable_broker_is_unavailable_not_a_crash(settings: Settings) -> None:
    """The batcher puts a batch it could not hand over back itself (``dispatch_failed``)."""
    closed = settings.model_copy(update={"broker_url": "amqp://guest:guest@127.0.0.1:1//"})
    broker = RabbitRequestQueue(closed.broker_url or "", closed.namespace)
    dispatcher = CeleryDispatcher(create_celery(closed, [ECHO]), closed, broker)
    with pytest.raises(Unavailable):
        await dispatcher.dispatch(batch("0195f0c2-0000-7000-8000-000000000002"), None)
    await broker.close()


async def test_a_connection_that_failed_is_closed_not_left_to_the_garbage_collector(
    settings: Settings,
) -> None:
    """aio_pika.connect_robust leaves a connection that failed open, and aio-pika's finalizer
    of an open connection makes a ``close()`` coroutine; collected later in another thread, it
    cannot schedule it ("coroutine 'RobustConnection.close' was never awaited", a warning
    under whichever test the collection fell in)."""

    def left_open() -> int:
        gc.collect()
        # type(), not isinstance(): that would ask every object in the process its class
        # (some of torch's answer with a deprecation warning).
        return sum(
            1 for o in gc.get_objects() if type(o) is aio_pika.RobustConnection and not o.is_closed
        )

    before = left_open()
    broker = RabbitRequestQueue("amqp://guest:guest@127.0.0.1:1//", settings.namespace)
    for _ in range(3):
        with pytest.raises(Unavailable):
            await broker.send(settings.name("nowhere"), aio_pika.Message(b"{}"))
    await broker.close()
    assert left_open() == before
