"""What happens after a webhook attempt: a pure decision from the attempt's outcome.

- 2xx: delivered.
- 410 Gone: the receiver says the endpoint is gone for good; it is disabled for the tenant and
  the delivery fails (re-enable with ``POST /v1/webhooks/endpoints/enable``).
- every other answer (3xx, since redirects are not followed; 4xx; 5xx), a timeout or a
  connection error: retried on the schedule, like Stripe and Svix do. A 4xx is usually a receiver
  being deployed or misconfigured, which its owner fixes within the retry window; giving up at
  once would lose the event.
- a URL the SSRF guard refuses at delivery time: failed at once (retrying cannot make it safe).

Delays follow ``BATCHSERVE_WEBHOOK_RETRY_SCHEDULE`` with +-10 % jitter, so receivers that failed
together are not all retried in the same instant. A ``Retry-After`` (seconds or an HTTP date)
may push the next attempt later, never sooner than the schedule (a receiver asking for an
immediate retry would otherwise set the pace), and at most a day later.
"""

from __future__ import annotations

import email.utils
from dataclasses import dataclass
from enum import StrEnum

MAX_RETRY_AFTER_S = 86_400.0


class Verdict(StrEnum):
    DELIVERED = "delivered"
    RETRY = "retry"
    FAILED = "failed"
    DISABLE = "disable"  # failed, and the endpoint is disabled


@dataclass(frozen=True, slots=True)
class AttemptOutcome:
    """What one HTTP attempt came to: a status code, or the error that stopped it."""

    status_code: int | None = None
    error: str | None = None
    retry_after_s: float | None = None
    duration_ms: float = 0.0
    address: str | None = None
    # True when retrying cannot help: the URL was refused by the SSRF guard.
    permanent: bool = False


@dataclass(frozen=True, slots=True)
class RetryDecision:
    verdict: Verdict
    next_attempt_at: float | None = None
    reason: str | None = None


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """The retry schedule: ``schedule_s[n]`` is the delay after the (n+1)-th failed attempt."""

    schedule_s: tuple[float, ...]
    jitter: float = 0.1
    max_retry_after_s: float = MAX_RETRY_AFTER_S

    @property
    def max_attempts(self) -> int:
        return len(self.schedule_s) + 1

    def decide(
        self, outcome: AttemptOutcome, *, run_attempts: int, now: float, jitter_draw: float
    ) -> RetryDecision:
        """The verdict on an attempt, the ``run_attempts``-th of its run (1 for the first).

        ``jitter_draw`` is a number in [-1, 1] the caller draws, so this stays deterministic.
        """
        code = outcome.status_code
        if code is not None and 200 <= code < 300:
            return RetryDecision(Verdict.DELIVERED)
        if code == 410:
            return RetryDecision(Verdict.DISABLE, reason="the endpoint answered 410 Gone")
        if outcome.permanent:
            return RetryDecision(Verdict.FAILED, reason=outcome.error or "refused")
        if run_attempts >= self.max_attempts:
            return RetryDecision(
                Verdict.FAILED,
                reason=f"gave up after {run_attempts} attempt(s); last: {describe(outcome)}",
            )
        step_s = self.schedule_s[run_attempts - 1] * (1.0 + self.jitter * jitter_draw)
        delay_s = max(0.0, step_s)
        if outcome.retry_after_s is not None:
            delay_s = max(delay_s, min(outcome.retry_after_s, self.max_retry_after_s))
        return RetryDecision(Verdict.RETRY, next_attempt_at=now + delay_s, reason=describe(outcome))


def describe(outcome: AttemptOutcome) -> str:
    if outcome.error:
        return outcome.error
    return f"HTTP {outcome.status_code}"


def parse_retry_after(value: str | None, now: float) -> float | None:
    """Seconds to wait from a ``Retry-After`` header: delta-seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # HTTP dates are GMT
        return None
    return max(0.0, when.timestamp() - now)
