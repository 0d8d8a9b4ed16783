"""Admission control: a tenant's quotas, and each model's backlog bound.

Every refusal is early and explicit: 429 with ``Retry-After`` when the caller is over its own
limit (submission rate, unfinished requests, bulk requests in flight), 503 with ``Retry-After``
when the model's backlog is at its bound, so the queue never grows past what the workers can
drain within ``max_queue_s``.

The queued counts come from the database once a second (one grouped query for every tenant)
plus what this process admitted since; with several API replicas a tenant may overshoot its
quota by what the others admitted within that second. The rate bucket lives in Redis, shared
by every replica, so the rate is exact.

A check that passes reserves its place at once (no await between the comparison and the
reservation), until the admission is through or has failed: requests checked together, a
burst arriving in one instant, are counted against the bounds while they wait for their
group commit, so the burst cannot pass them all.

Without a fresh snapshot from the batcher (it restarts, it is starved of CPU, a read of Redis
timed out under the very burst) the backlog bound still holds for what this process admitted
lately, against the model's capacity as last seen: a burst is not let through whole because
the load board fell silent.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import math
import time
from collections import Counter
from dataclasses import dataclass

from batchserve.core.domain import Lane, SubmitCommand
from batchserve.core.errors import Overloaded, QuotaExceeded, Unavailable
from batchserve.core.loadboard import LoadBoard, LoadSnapshot
from batchserve.core.logs import get_logger
from batchserve.core.ratelimit import RateLimiter
from batchserve.core.settings import Settings
from batchserve.core.store import JobStore, TenantRow

log = get_logger("batchserve.quotas")

REFRESH_S = 1.0
UNSEEN_S = 1.5  # the batcher's broker depth is refreshed every second


@dataclass(frozen=True, slots=True)
class Reservation:
    """What a passed check counts until its admission ends: an interactive request's place in
    its tenant's unfinished requests and in its model's backlog (``None``: nothing counted)."""

    tenant: str | None = None
    model: str | None = None


class Quotas:
    def __init__(
        self, settings: Settings, store: JobStore, limiter: RateLimiter, board: LoadBoard
    ) -> None:
        self._settings = settings
        self._store = store
        self._limiter = limiter
        self._board = board
        self._queued: dict[str, int] = {}
        self._since_refresh: Counter[str] = Counter()
        # Per model, when this process admitted each of its latest interactive requests: the
        # batcher's snapshot may not show them yet (its broker depth is up to a second old).
        self._recent: dict[str, collections.deque[float]] = {}
        # Checked and reserved, their admission not through yet: by tenant, and by model.
        self._admitting: Counter[str] = Counter()
        self._admitting_to: Counter[str] = Counter()
        self._refresher: asyncio.Task[None] | None = None
        self._last_seen: dict[str, LoadSnapshot] = {}  # per model, its latest fresh snapshot

    def start(self) -> None:
        self._refresher = asyncio.create_task(self._refresh_forever())

    async def stop(self) -> None:
        if self._refresher is not None:
            self._refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._refresher

    async def check(self, tenant: TenantRow, command: SubmitCommand, now: float) -> Reservation:
        """Raise :class:`QuotaExceeded` or :class:`Overloaded` when ``command`` can't be taken;
        else reserve its place: the caller ends the reservation with :meth:`admitted` or
        :meth:`release`."""
        await self._check_rate(tenant)
        if command.lane is not Lane.INTERACTIVE:
            return Reservation()
        snapshot = await self._board.fresh(command.model, now)
        if snapshot is not None:
            self._last_seen[command.model] = snapshot
        # From here to the reservation, no await: checks running together see each other.
        self._check_queued(tenant)
        self._check_backlog(command.model, snapshot)
        self._admitting[tenant.name] += 1
        self._admitting_to[command.model] += 1
        return Reservation(tenant.name, command.model)

    def admitted(self, reservation: Reservation) -> None:
        """The reserved request is committed: counted as admitted since the last refresh."""
        self.release(reservation)
        if reservation.tenant is not None and reservation.model is not None:
            self._since_refresh[reservation.tenant] += 1
            recent = self._recent.setdefault(reservation.model, collections.deque())
            recent.append(time.monotonic())

    def release(self, reservation: Reservation) -> None:
        """The reserved request was not admitted (refused later, failed, or a replay)."""
        if reservation.tenant is not None:
            _decrement(self._admitting, reservation.tenant)
        if reservation.model is not None:
            _decrement(self._admitting_to, reservation.model)

    async def check_bulk(self, tenant: TenantRow, requests: int) -> None:
        """Refuse a bulk job that would put the tenant over its bulk requests in flight."""
        limit = tenant.max_bulk_in_flight or self._settings.tenant_max_bulk_in_flight
        in_flight = await self._store.bulk_in_flight(tenant.name)
        if in_flight + max(requests, 1) > limit:
            raise QuotaExceeded(
                f"this job's {requests} requests and the {in_flight} bulk requests in flight "
                f"exceed the tenant's limit of {limit}",
                retry_after_s=60.0,
                limit_name="max_bulk_in_flight",
                limit=limit,
                in_flight=in_flight,
            )

    async def _check_rate(self, tenant: TenantRow) -> None:
        rate = tenant.rate_per_s or self._settings.tenant_rate_per_s
        if not rate:
            return
        burst = tenant.burst or self._settings.tenant_burst or max(1, math.ceil(2 * rate))
        wait_s = await self._limiter.take(tenant.name, rate, burst)
        if wait_s > 0:
            raise QuotaExceeded(
                f"over the submission rate of {rate:g}/s (burst {burst})",
                retry_after_s=wait_s,
                limit_name="rate_per_s",
                limit=rate,
                burst=burst,
            )

    def _check_queued(self, tenant: TenantRow) -> None:
        limit = tenant.max_queued or self._settings.tenant_max_queued
        name = tenant.name
        queued = self._queued.get(name, 0) + self._since_refresh[name] + self._admitting[name]
        if queued >= limit:
            raise QuotaExceeded(
                f"{queued} unfinished requests: the tenant's limit is {limit}",
                retry_after_s=5.0,
                limit_name="max_queued",
                limit=limit,
                queued=queued,
            )

    def _check_backlog(self, model: str, snapshot: LoadSnapshot | None) -> None:
        """The model's interactive backlog is bounded by ``max_queue_s`` of its capacity."""
        recent = self._recent.get(model, collections.deque())
        horizon = time.monotonic() - UNSEEN_S
        while recent and recent[0] < horizon:
            recent.popleft()
        if snapshot is not None:
            # Admitted lately and maybe not in the snapshot yet: counted (perhaps twice, which
            # errs on the side of the bound).
            seen = snapshot.pending_interactive + max(snapshot.queued_interactive, len(recent))
        else:
            snapshot = self._last_seen.get(model)
            if snapshot is None:
                return  # never a word from the batcher: the queued quota bounds each tenant
            seen = len(recent)  # no word now: what this process admitted lately, at least
        backlog = seen + self._admitting_to[model]  # checked, committing: in no count yet
        capacity = snapshot.slots * snapshot.max_batch_size / max(snapshot.batch_s, 1e-3)
        limit = max(self._settings.min_backlog, math.floor(capacity * self._settings.max_queue_s))
        if backlog < limit:
            return
        retry_after_s = (backlog - limit + 1) / capacity + 1.0 if capacity else 30.0
        raise Overloaded(
            f"{model} has {backlog} requests waiting, its bound "
            f"({self._settings.max_queue_s:g} s of capacity at {capacity:.0f}/s)",
            retry_after_s=retry_after_s,
            limit_name="max_backlog",
            limit=limit,
            backlog=backlog,
            capacity_per_s=round(capacity, 1),
        )

    async def _refresh_forever(self) -> None:
        while True:
            try:
                counts = await self._store.queued_by_tenant()
            except Unavailable:
                counts = None
            except Exception:  # keep refreshing whatever one round hit
                log.exception("queued_count_failed")
                counts = None
            if counts is not None:
                self._queued = counts
                self._since_refresh.clear()
            await asyncio.sleep(REFRESH_S)


def _decrement(counter: Counter[str], key: str) -> None:
    if counter[key] <= 1:
        counter.pop(key, None)
    else:
        counter[key] -= 1
