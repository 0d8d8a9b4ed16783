"""One webhook attempt from start to record: lease, payload, signature, send, decide, record.

The same code runs in the Celery ``webhooks`` worker and in the embedded mode's event loop.
"""

from __future__ import annotations

import random
import ssl
from collections.abc import Callable
from dataclasses import dataclass

import orjson

from batchserve.api.batch_schemas import batch_object
from batchserve.api.schemas import RequestOut, dump
from batchserve.core.bulk import JobRecord
from batchserve.core.clock import deployment_time
from batchserve.core.domain import ClaimedDelivery, DeliveryStart, RequestRecord
from batchserve.core.logs import get_logger
from batchserve.core.metrics import metrics
from batchserve.core.secretbox import SecretBox
from batchserve.core.settings import Settings
from batchserve.core.signing import webhook_headers
from batchserve.core.ssrf import Allowlist, UrlGuard
from batchserve.core.store import JobStore
from batchserve.core.webhook_policy import AttemptOutcome, RetryDecision, RetryPolicy
from batchserve.core.webhook_secrets import WebhookSecrets
from batchserve.workers.webhooks.sender import WebhookSender

log = get_logger("batchserve.webhooks")


@dataclass(frozen=True, slots=True)
class WebhookConfig:
    """The webhook settings the relay and senders need, read once from ``Settings``."""

    schedule_s: tuple[float, ...]
    timeout_s: float = 10.0
    lease_s: float = 30.0
    concurrency: int = 16
    relay_tick_s: float = 0.5
    resolve_timeout_s: float = 2.0
    secret_grace_s: float = 86_400.0
    allowlist: str = ""
    request_retention_s: float = 30 * 86_400.0  # the request's expires_at in a body

    @classmethod
    def from_settings(cls, settings: Settings) -> WebhookConfig:
        return cls(
            schedule_s=settings.retry_schedule_s,
            timeout_s=settings.webhook_timeout_s,
            lease_s=settings.webhook_lease_s,
            concurrency=settings.webhook_concurrency,
            resolve_timeout_s=settings.webhook_resolve_timeout_s,
            secret_grace_s=settings.webhook_secret_grace_s,
            allowlist=settings.webhook_allowlist,
            request_retention_s=settings.request_retention_s,
        )


def event_body(start: DeliveryStart, record: RequestRecord, *, retention_s: float) -> bytes:
    """The JSON body: the event envelope around the request exactly as ``GET`` shows it.

    Built from the terminal (hence unchanging) request and the delivery's own creation time,
    so every attempt of a delivery carries the very same bytes.
    """
    envelope = {
        "type": start.event_type,
        "timestamp": start.created_at.isoformat().replace("+00:00", "Z"),
        "data": dump(RequestOut.of(record, retention_s=retention_s)),
    }
    return orjson.dumps(envelope)


def job_event_body(start: DeliveryStart, job: JobRecord) -> bytes:
    """A ``batch.*`` event: the envelope around the job exactly as ``GET /v1/batches/{id}``
    shows it (an ended job no longer changes, so every attempt sends the same bytes)."""
    envelope = {
        "type": start.event_type,
        "timestamp": start.created_at.isoformat().replace("+00:00", "Z"),
        "data": batch_object(job),
    }
    return orjson.dumps(envelope)


class Deliverer:
    """Makes the attempt a claim entitles it to, and records what came of it."""

    def __init__(
        self,
        *,
        store: JobStore,
        secrets: WebhookSecrets,
        sender: WebhookSender,
        config: WebhookConfig,
        clock: Callable[[], float] = deployment_time,
        rng: random.Random | None = None,
    ) -> None:
        self._store = store
        self._secrets = secrets
        self._sender = sender
        self.config = config
        self.policy = RetryPolicy(config.schedule_s)
        self._clock = clock
        self._rng = rng or random.Random()

    async def deliver(self, claim: ClaimedDelivery) -> RetryDecision | None:
        """One attempt; ``None`` when the claim was stale (another sender holds the lease)."""
        start = await self._store.begin_attempt(
            claim.id,
            claim.token,
            now=self._clock(),
            lease_s=self.config.lease_s,
            max_attempts=self.policy.max_attempts,
        )
        if start is None:
            log.info("webhook_claim_stale", delivery_id=claim.id)
            return None
        outcome = await self._attempt(start)
        now = self._clock()
        decision = self.policy.decide(
            outcome,
            run_attempts=start.run_attempts,
            now=now,
            jitter_draw=self._rng.uniform(-1.0, 1.0),
        )
        await self._store.finish_attempt(start, outcome, decision, now=now)
        metrics().webhook_deliveries.labels(decision.verdict.value).inc()
        log.info(
            "webhook_attempt",
            delivery_id=start.id,
            subject=start.request_id or start.job_id,
            attempt=start.number,
            status=outcome.status_code,
            verdict=decision.verdict.value,
            duration_ms=round(outcome.duration_ms, 1),
            next_in_s=round(decision.next_attempt_at - now, 2)
            if decision.next_attempt_at
            else None,
        )
        return decision

    async def _attempt(self, start: DeliveryStart) -> AttemptOutcome:
        body = await self._body(start)
        if body is None:
            return AttemptOutcome(error="the request or batch no longer exists", permanent=True)
        now = self._clock()
        signing = await self._secrets.signing_secrets(start.tenant, now)
        # A fresh timestamp (and so signature) on every attempt: receivers reject stale ones.
        headers = webhook_headers(signing, start.id, int(now), body)
        return await self._sender.send(start.url, headers, body)

    async def _body(self, start: DeliveryStart) -> bytes | None:
        if start.job_id is not None:
            job = await self._store.get_job(start.job_id, start.tenant)
            return None if job is None else job_event_body(start, job)
        assert start.request_id is not None
        record = await self._store.get(start.request_id, start.tenant)
        if record is None:
            return None
        return event_body(start, record, retention_s=self.config.request_retention_s)

    async def close(self) -> None:
        await self._sender.close()


def url_guard(config: WebhookConfig) -> UrlGuard:
    return UrlGuard(Allowlist.parse(config.allowlist), resolve_timeout_s=config.resolve_timeout_s)


def create_deliverer(
    store: JobStore,
    settings: Settings,
    *,
    guard: UrlGuard | None = None,
    verify: ssl.SSLContext | bool = True,
    clock: Callable[[], float] = deployment_time,
) -> Deliverer:
    """A deliverer wired from settings: guard, sender, the tenants' secrets."""
    config = WebhookConfig.from_settings(settings)
    sender = WebhookSender(
        guard or url_guard(config),
        timeout_s=config.timeout_s,
        max_connections=2 * config.concurrency,
        verify=verify,
    )
    box = SecretBox.from_settings(settings)
    secrets = WebhookSecrets(store, box, grace_s=config.secret_grace_s)
    return Deliverer(store=store, secrets=secrets, sender=sender, config=config, clock=clock)
