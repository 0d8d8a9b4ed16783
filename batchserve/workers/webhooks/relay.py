"""The outbox relay: claims due deliveries and hands each to a sender.

It wakes every ``relay_tick_s`` and at once when a request reaches a terminal state (a hint from
the event bus; the table is the record). Several relays may run: claims skip rows another holds.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol

from celery import Celery
from kombu.exceptions import KombuError

from batchserve.core.clock import deployment_time
from batchserve.core.domain import ClaimedDelivery, Event, StateChange
from batchserve.core.errors import Unavailable
from batchserve.core.events import EventBus, Subscription
from batchserve.core.logs import get_logger
from batchserve.core.settings import Settings
from batchserve.core.store import JobStore
from batchserve.workers.celery_app import DELIVER_WEBHOOK_TASK, webhooks_queue
from batchserve.workers.webhooks.delivery import Deliverer

log = get_logger("batchserve.webhooks")

MAX_CLAIM = 100


class Senders(Protocol):
    def free(self) -> int:
        """How many claims to hand over now."""

    async def hand_over(self, claims: Sequence[ClaimedDelivery]) -> None: ...


class Relay:
    """Moves due deliveries from the outbox table to senders."""

    def __init__(
        self,
        *,
        store: JobStore,
        senders: Senders,
        lease_s: float,
        tick_s: float = 0.5,
        events: EventBus | None = None,
        clock: Callable[[], float] = deployment_time,
    ) -> None:
        self._store = store
        self._senders = senders
        self._lease_s = lease_s
        self._tick_s = tick_s
        self._events = events
        self._clock = clock
        self._wake = asyncio.Event()

    async def run(self) -> None:
        log.info(
            "webhook_relay_started", tick_s=round(self._tick_s, 2), lease_s=round(self._lease_s, 1)
        )
        subscription: Subscription | None = None
        if self._events is not None:
            subscription = self._events.subscribe(self._on_event)
        try:
            while True:
                claimed = 0
                try:
                    claimed = await self.tick(self._clock())
                except Unavailable as error:
                    log.warning("webhook_relay_backoff", error=error)
                except Exception:
                    log.exception("webhook_relay_tick_failed")
                if claimed >= MAX_CLAIM:
                    continue  # a backlog: claim the next ones at once
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=self._tick_s)
                self._wake.clear()
        finally:
            if subscription is not None:
                await subscription.close()

    async def tick(self, now: float) -> int:
        """Claim what is due (as much as the senders take) and hand it over."""
        limit = min(MAX_CLAIM, self._senders.free())
        if limit <= 0:
            return 0
        claims = await self._store.claim_due_deliveries(now, lease_s=self._lease_s, limit=limit)
        if claims:
            await self._senders.hand_over(claims)
        return len(claims)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, StateChange) and event.state.terminal:
            self._wake.set()


class InProcessSenders:
    """Senders as tasks of this event loop: the embedded mode, and tests."""

    def __init__(self, deliverer: Deliverer, concurrency: int) -> None:
        self._deliverer = deliverer
        self._concurrency = concurrency
        self._tasks: set[asyncio.Task[None]] = set()

    def free(self) -> int:
        return self._concurrency - len(self._tasks)

    async def hand_over(self, claims: Sequence[ClaimedDelivery]) -> None:
        for claim in claims:
            task = asyncio.create_task(self._run(claim))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, claim: ClaimedDelivery) -> None:
        try:
            await self._deliverer.deliver(claim)
        except Exception:
            # The lease runs out and the relay sends it again.
            log.exception("webhook_attempt_crashed", delivery_id=claim.id)

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


class CelerySenders:
    """Senders as Celery tasks on the ``webhooks`` quorum queue (confirmed publishes)."""

    def __init__(self, app: Celery, settings: Settings) -> None:
        self._app = app
        self._queue = webhooks_queue(settings)
        # kombu blocks; one thread sends, in order.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="webhook-relay")

    def free(self) -> int:
        # The queue absorbs a burst; a claim not started within its lease is claimed again.
        return MAX_CLAIM

    async def hand_over(self, claims: Sequence[ClaimedDelivery]) -> None:
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, self._send, list(claims))
        except (KombuError, OSError, ConnectionError) as error:
            raise Unavailable(f"could not queue webhooks: {error}", component="broker") from error

    def _send(self, claims: list[ClaimedDelivery]) -> None:
        for claim in claims:
            self._app.send_task(
                DELIVER_WEBHOOK_TASK, args=[claim.id, claim.token], queue=self._queue
            )

    def close(self) -> None:
        self._executor.shutdown(wait=False)
