"""What the API process holds for its lifetime: adapters, admission, long-poll waiters."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from batchserve.api.auth import KeyRing
from batchserve.api.group_commit import Admitter
from batchserve.api.quotas import Quotas
from batchserve.api.waiters import Waiters
from batchserve.core.domain import from_epoch
from batchserve.core.secretbox import SecretBox
from batchserve.core.settings import Settings
from batchserve.core.ssrf import Allowlist, UrlGuard
from batchserve.core.webhook_secrets import WebhookSecrets
from batchserve.core.wiring import Adapters, connect
from batchserve.models.tokens import PromptCounter


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
    clock: Callable[[], float] = field(default=time.time)

    def now(self) -> datetime:
        return from_epoch(self.clock())

    @classmethod
    def create(
        cls,
        settings: Settings,
        adapters: Adapters | None = None,
        *,
        clock: Callable[[], float] = time.time,
    ) -> ApiServices:
        adapters = adapters or connect(settings)
        admitter = Admitter(adapters.store, adapters.queue, faults=settings.fault_points)
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
        self.prompt_counter.prewarm()

    async def stop(self, *, close_adapters: bool = True) -> None:
        await self.admitter.stop()
        await self.waiters.stop()
        await self.quotas.stop()
        if close_adapters:
            await self.adapters.close()
