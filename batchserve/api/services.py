"""What the API process holds for its lifetime: adapters, admission, long-poll waiters."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime

from batchserve.api.auth import KeyRing
from batchserve.api.deadlines import RecentAdmissions
from batchserve.api.group_commit import MARK_EVERY_S, Admitter
from batchserve.api.joiners import JoinOffers
from batchserve.api.quotas import Quotas
from batchserve.api.waiters import Waiters
from batchserve.core.clock import deployment_time
from batchserve.core.domain import from_epoch
from batchserve.core.logs import get_logger
from batchserve.core.secretbox import SecretBox
from batchserve.core.settings import Settings
from batchserve.core.ssrf import Allowlist, UrlGuard
from batchserve.core.webhook_secrets import WebhookSecrets
from batchserve.core.wiring import Adapters, connect
from batchserve.models.tokens import PromptCounter

log = get_logger("batchserve.api")


@dataclass
class ApiServices:
    settings: Settings
    adapters: Adapters
    admitter: Admitter
    waiters: Waiters
    webhook_secrets: WebhookSecrets
    url_guard: UrlGuard
    prompt_counter: PromptCounter
    keyring: KeyRing
    quotas: Quotas
    # The clock requests are stamped with (the embedded stack's, which a test may step).
    clock: Callable[[], float] = field(default=deployment_time)
    # Admitted since the batcher's latest load snapshot: deadline admission counts them.
    recent_admissions: RecentAdmissions = field(default_factory=RecentAdmissions)

    def now(self) -> datetime:
        return from_epoch(self.clock())

    @classmethod
    def create(
        cls,
        settings: Settings,
        adapters: Adapters | None = None,
        *,
        clock: Callable[[], float] = deployment_time,
    ) -> ApiServices:
        # A fixed pool by default: under load, a request waits for one of its connections
        # rather than opening (and Postgres forking) one of its own (docs/frontdoor.md).
        adapters = adapters or connect(
            settings,
            pool_size=settings.api_db_pool_size,
            max_overflow=settings.api_db_max_overflow,
        )
        admitter = Admitter(
            adapters.store,
            adapters.queue,
            # Well within the time after which maintenance publishes an unmarked request again.
            mark_every_s=min(MARK_EVERY_S, settings.republish_after_s / 10),
            faults=settings.fault_points,
            joiners=JoinOffers(adapters.joins, adapters.events, clock),
        )
        waiters = Waiters(adapters.events)
        secrets = WebhookSecrets(
            adapters.store,
            SecretBox.from_settings(settings),
            grace_s=settings.webhook_secret_grace_s,
        )
        guard = UrlGuard(
            Allowlist.parse(settings.webhook_allowlist),
            resolve_timeout_s=settings.webhook_resolve_timeout_s,
        )
        counter = PromptCounter(adapters.registry)
        keyring = KeyRing(
            adapters.store, required=settings.auth == "required", cache_s=settings.key_cache_s
        )
        quotas = Quotas(settings, adapters.store, adapters.ratelimit, adapters.loadboard)
        return cls(
            settings, adapters, admitter, waiters, secrets, guard, counter, keyring, quotas, clock
        )

    async def start(self) -> None:
        self.admitter.start()
        self.waiters.start()
        self.quotas.start()
        self.keyring.listen(self.adapters.events)
        self.prompt_counter.prewarm()

    async def stop(self, *, close_adapters: bool = True, step_s: float = 10.0) -> None:
        """Stop each part in turn, none for longer than ``step_s`` past its own bound (the
        admitter finishes its flushes within 15 s): a part that does not stop is named in the
        log and left behind, so that the process still stops."""
        await _bounded("admitter", self.admitter.stop(), 15.0 + step_s)
        await _bounded("waiters", self.waiters.stop(), step_s)
        await _bounded("quotas", self.quotas.stop(), step_s)
        await _bounded("keyring", self.keyring.close(), step_s)
        await _bounded("prompt_counter", asyncio.to_thread(self.prompt_counter.stop), step_s)
        if close_adapters:
            await _bounded("adapters", self.adapters.close(), step_s)


async def _bounded(part: str, stopping: Awaitable[None], timeout_s: float) -> None:
    """Await ``stopping`` for at most ``timeout_s``; then cancel it and go on without waiting
    (a coroutine that swallows its cancellation must not hold the process's shutdown)."""
    task = asyncio.ensure_future(stopping)
    done, _ = await asyncio.wait({task}, timeout=timeout_s)
    if not done:
        task.cancel()
        log.warning("api_stop_part_timeout", part=part, timeout_s=timeout_s)
    elif not task.cancelled() and (error := task.exception()) is not None:
        log.warning("api_stop_part_failed", part=part, error=error)
