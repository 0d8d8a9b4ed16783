"""Long-poll waiters: a request's state change wakes the callers waiting on it.

Wake-ups come from the event bus (Redis pub/sub across processes). While the bus is down the
waiters fall back to reading Postgres every ``fallback_poll_s``.

The waiters also remember, for ``remember_s``, the requests this process admitted and whether
an end of each has been announced since: a long-poll for one that has not ended need not read
it first (see :func:`batchserve.api.polling.read_or_wait`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass

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


@dataclass(slots=True)
class _Admitted:
    tenant: str
    until: float  # monotonic: forgotten after this
    ended: bool = False


# A long-poll follows its submit at once; one that comes later reads, as any other does.
REMEMBER_S = 30.0
REMEMBER_MAX = 100_000  # about 25 MB at most


class Waiters:
    def __init__(
        self,
        events: EventBus,
        *,
        fallback_poll_s: float = 0.25,
        remember_s: float = REMEMBER_S,
        remember_max: int = REMEMBER_MAX,
    ) -> None:
        self._events = events
        # Per request, each waiter's event and whether only a terminal state wakes it.
        self._waiting: dict[str, dict[Wake, bool]] = {}
        self._subscription: Subscription | None = None
        self.fallback_poll_s = fallback_poll_s
        # Requests this process is admitting or admitted, oldest first.
        self._admitted: OrderedDict[str, _Admitted] = OrderedDict()
        self.remember_s = remember_s
        self.remember_max = remember_max

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

    def expect(self, request_id: str, tenant: str) -> None:
        """This process is about to admit the request (called before its commit, so no
        announcement of its end can come first)."""
        now = time.monotonic()
        admitted = self._admitted
        while admitted:
            oldest = next(iter(admitted.values()))
            if oldest.until > now and len(admitted) < self.remember_max:
                break
            admitted.popitem(last=False)
        admitted[request_id] = _Admitted(tenant, now + self.remember_s)

    def forget(self, request_id: str) -> None:
        """The admission did not create this request (refused, or a retry of another)."""
        self._admitted.pop(request_id, None)

    def unfinished(self, request_id: str, tenant: str) -> bool:
        """Whether ``tenant``'s request is one this process admitted within ``remember_s`` and
        no end of it has been announced since, every announcement heard (the subscription
        unbroken since the admission: a reconnect forgets them all). Such a request has not
        ended, or its end is on its way here."""
        entry = self._admitted.get(request_id)
        return (
            entry is not None
            and not entry.ended
            and entry.tenant == tenant
            and entry.until > time.monotonic()
            and self.healthy
        )

    def _on_event(self, event: Event) -> None:
        if not isinstance(event, StateChange):
            return
        terminal = event.state.terminal
        if terminal and self._admitted:
            for request_id in event.request_ids:
                entry = self._admitted.get(request_id)
                if entry is not None:
                    entry.ended = True
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
        """After a reconnect some notifications may be lost: everyone re-reads, and no request
        admitted before is known not to have ended."""
        self._admitted.clear()
        for waiting in self._waiting.values():
            for waiter in waiting:
                waiter.set()
