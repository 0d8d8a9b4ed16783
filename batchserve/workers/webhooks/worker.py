"""``batchserve webhooks``: the outbox relay and a Celery worker for the ``webhooks`` queue.

Sending webhooks is waiting on the network, so one event loop (in a thread of its own) makes
every attempt and runs the relay, while Celery's thread pool consumes the queue and hands each
task to that loop. Killing the process loses nothing: an unacked task returns to the queue (and
finds its claim stale when redelivered), and an attempt in flight has its lease run out and is
claimed and sent again, with the same ``webhook-id``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from celery import Celery, signals

from batchserve.core.clock import follow_database
from batchserve.core.db import create_engine
from batchserve.core.domain import ClaimedDelivery
from batchserve.core.events import RedisEventBus
from batchserve.core.health import role_health
from batchserve.core.logs import get_logger
from batchserve.core.settings import Settings
from batchserve.core.store import JobStore
from batchserve.workers.celery_app import DELIVER_WEBHOOK_TASK, create_celery, webhooks_queue_name
from batchserve.workers.webhooks.delivery import Deliverer, create_deliverer
from batchserve.workers.webhooks.relay import CelerySenders, Relay

log = get_logger("batchserve.webhooks")
T = TypeVar("T")


class WebhookRuntime:
    """The process's event loop thread, with the store, the deliverer and the relay on it."""

    def __init__(self, settings: Settings, app: Celery) -> None:
        self.settings = settings
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="webhooks", daemon=True)
        self._senders = CelerySenders(app, settings)
        self._relay_task: asyncio.Task[None] | None = None
        self._beating: asyncio.Task[None] | None = None
        self._deliverer: Deliverer | None = None

    def start(self) -> None:
        self._thread.start()
        self._call(self._start())

    async def _start(self) -> None:
        # Built on the loop that will use them: engines and Redis clients bind to their loop.
        assert self.settings.redis_url
        follow_database(self.settings.effective_database_url)  # leases on the one clock
        self._engine = create_engine(self.settings.effective_database_url, pool_size=4)
        self._events = RedisEventBus(self.settings.redis_url, self.settings.name("events"))
        store = JobStore(self._engine, max_failures=self.settings.max_failures)
        self._deliverer = create_deliverer(store, self.settings)
        config = self._deliverer.config
        relay = Relay(
            store=store,
            senders=self._senders,
            lease_s=config.lease_s,
            tick_s=config.relay_tick_s,
            events=self._events,
        )
        self._relay_task = asyncio.create_task(relay.run())
        # Every delivery and the relay run on this loop: it beats for the process's liveness.
        self._beating = asyncio.create_task(role_health().beat_forever())

    def deliver(self, claim: ClaimedDelivery) -> None:
        """Run one attempt on the loop; called from Celery's pool threads."""
        assert self._deliverer is not None
        self._call(self._deliverer.deliver(claim), timeout_s=self._deliverer.config.lease_s)

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self._stop(), timeout_s=10.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout=5.0)
        self._senders.close()

    async def _stop(self) -> None:
        if self._beating is not None:
            self._beating.cancel()
        if self._relay_task is not None:
            self._relay_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._relay_task
        if self._deliverer is not None:
            await self._deliverer.close()
        await self._events.close()
        await self._engine.dispose()

    def _call(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=timeout_s)


def run_webhooks(settings: Settings, *, loglevel: str = "INFO") -> None:
    """Relay due deliveries to the ``webhooks`` queue and send them, until stopped."""
    app = create_celery(settings, [], webhooks=True)
    runtime = WebhookRuntime(settings, app)

    def _deliver(delivery_id: str, token: str) -> None:
        runtime.deliver(ClaimedDelivery(id=delivery_id, token=token))

    app.task(name=DELIVER_WEBHOOK_TASK, acks_late=True)(_deliver)

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        role_health().set_ready()
        log.info("webhooks_ready", concurrency=settings.webhook_concurrency)

    @signals.worker_shutting_down.connect(weak=False)
    def _stopping(**_: Any) -> None:
        role_health().set_ready("draining")

    runtime.start()
    worker = app.Worker(
        hostname=f"webhooks@{socket.gethostname()}.{os.getpid()}",
        queues=[webhooks_queue_name(settings)],
        concurrency=settings.webhook_concurrency,
        pool="threads",
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
    )
    try:
        worker.start()
    finally:
        runtime.stop()
