"""Long-poll waiters: a request's state change wakes the callers waiting on it.

Wake-ups come from the event bus (Redis pub/sub across processes). While the bus is down the
waiters fall back to reading Postgres every ``fallback_poll_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator

from batchserve.core.domain import Event, RequestRecord, StateChange
from batchserve.core.events import EventBus, Subscription


class Wake(asyncio.Event):
    """Set when the watched request changes; ``record``: the request as the notification
    carried it (a batch's results do), else None and the waiter reads it."""

    def __init__(self) -> None:
        super().__init__()
        self.record: RequestRecord | None = None

    def take_record(self) -> RequestRecord | None:
        record, self.record = self.record, None
        return record


class Waiters:
    def __init__(self, events: EventBus, *, fallback_poll_s: float = 0.25) -> None:
        self._events = events
        # Per request, each waiter's event and whether only a terminal state wakes it.
        self._waiting: dict[str, dict[Wake, bool]] = {}
        self._subscription: Subscription | None = None
        self.fallback_poll_s = fallback_poll_s

    def start(self) -> None:
        self._subscription = self._events.subscribe(self._on_event, on_reconnect=self._wake_all)

    async def stop(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()

    @property
    def healthy(self) -> bool:
        return self._subscription is not None and self._subscription.healthy

    @property
    def poll_s(self) -> float | None:
        """How often a waiter must re-read by itself; ``None`` when wake-ups can be trusted."""
        return None if self.healthy else self.fallback_poll_s

    @contextlib.contextmanager
    def watch(self, request_id: str, *, terminal_only: bool = False) -> Iterator[Wake]:
        """An event set when the request changes state (with ``terminal_only``, when it ends:
        a long-poll for the result does not wake, and re-read, when its batch starts)."""
        event = Wake()
        self._waiting.setdefault(request_id, {})[event] = terminal_only
        try:
            yield event
        finally:
            waiting = self._waiting.get(request_id)
            if waiting is not None:
                waiting.pop(event, None)
                if not waiting:
                    del self._waiting[request_id]

    def _on_event(self, event: Event) -> None:
        if not isinstance(event, StateChange):
            return
        terminal = event.state.terminal
        waited = [i for i in event.request_ids if i in self._waiting]
        carried = event.records_for(waited) if waited and terminal else {}
        for request_id in waited:
            for waiter, terminal_only in self._waiting.get(request_id, {}).items():
                if terminal or not terminal_only:
                    found = carried.get(request_id)
                    if found is not None:  # only a terminal record is carried: it is final
                        waiter.record = found
                    waiter.set()

    def _wake_all(self) -> None:
        """After a reconnect some notifications may be lost: everyone re-reads."""
        for waiting in self._waiting.values():
            for waiter in waiting:
                waiter.set()
