"""Who is calling: the API key in ``Authorization: Bearer``, checked against its stored hash.

Lookups are cached for ``key_cache_s``, so a busy API checks each key against the database a
few times a minute, not per request; a revocation is published on the event bus and forgotten by
every replica at once, the cache time bounding it only where the news was missed. Unknown
key ids are cached too, so a flood of made-up keys costs no database round trips either.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict

from batchserve.core import apikeys
from batchserve.core.domain import Event, KeyRevoked
from batchserve.core.errors import Unauthorized
from batchserve.core.events import KEYS, EventBus, Subscription
from batchserve.core.store import JobStore, KeyRow, TenantRow

ANONYMOUS = TenantRow(name="anonymous")
CACHE_SIZE = 10_000


class KeyRing:
    def __init__(self, store: JobStore, *, required: bool, cache_s: float) -> None:
        self._store = store
        self._required = required
        self._cache_s = cache_s
        self._cache: OrderedDict[str, tuple[float, KeyRow | None]] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[KeyRow | None]] = {}
        self._forgets = 0  # lookups begun before a forget() do not fill the cache
        self._subscription: Subscription | None = None

    def listen(self, events: EventBus) -> None:
        """Forget a key the moment any process revokes it (``batchserve keys revoke``
        publishes it); the cache time stays the bound for a notification that is missed, and a
        subscription that was down forgets everything when it is back."""

        def heard(event: Event) -> None:
            if isinstance(event, KeyRevoked):
                self.forget(event.key_id)

        self._subscription = events.subscribe(heard, self._cache.clear, topics=(KEYS,))

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()
            self._subscription = None

    def forget(self, key_id: str) -> None:
        """Drop what is known of ``key_id`` (it was revoked): its next use is looked up."""
        self._cache.pop(key_id, None)
        self._forgets += 1

    async def authenticate(self, authorization: str | None) -> TenantRow:
        """The caller's tenant, or :class:`Unauthorized`. Never logs the key."""
        if not self._required:
            return ANONYMOUS
        scheme, _, presented = (authorization or "").partition(" ")
        presented = presented.strip()
        if scheme.lower() != "bearer" or not presented:
            raise Unauthorized("send an API key: `Authorization: Bearer bsk_...`")
        key_id = apikeys.key_id_of(presented)
        row = await self._lookup(key_id) if key_id else None
        # Compare even when there is no row, so timing doesn't tell a bad id from a bad secret.
        stored = row.key_sha256 if row is not None else "0" * 64
        if not apikeys.matches(presented, stored) or row is None or row.revoked_at is not None:
            raise Unauthorized("the API key is not valid (unknown, malformed or revoked)")
        return row.tenant

    async def _lookup(self, key_id: str) -> KeyRow | None:
        now = time.monotonic()
        hit = self._cache.get(key_id)
        if hit is not None and now - hit[0] < self._cache_s:
            return hit[1]
        # One lookup per key at a time: a burst on an expired entry waits for the same query.
        inflight = self._inflight.get(key_id)
        if inflight is not None:
            return await asyncio.shield(inflight)
        task = asyncio.ensure_future(self._store.find_key(key_id))
        self._inflight[key_id] = task
        forgets = self._forgets
        try:
            row = await asyncio.shield(task)
        finally:
            self._inflight.pop(key_id, None)
        if forgets != self._forgets:  # a revocation came in while it was read: maybe stale
            return row
        self._cache[key_id] = (now, row)
        self._cache.move_to_end(key_id)
        while len(self._cache) > CACHE_SIZE:
            self._cache.popitem(last=False)
        return row
