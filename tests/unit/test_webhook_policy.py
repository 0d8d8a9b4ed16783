"""The webhook retry decision: pure, so every branch is checked with plain numbers."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from batchserve.core.webhook_policy import (
    AttemptOutcome,
    RetryDecision,
    RetryPolicy,
    Verdict,
    parse_retry_after,
)

POLICY = RetryPolicy((5.0, 30.0, 120.0))
NOW = 1_000_000.0


def decide(
    outcome: AttemptOutcome, run_attempts: int = 1, jitter_draw: float = 0.0
) -> RetryDecision:
    return POLICY.decide(outcome, run_attempts=run_attempts, now=NOW, jitter_draw=jitter_draw)


@pytest.mark.parametrize("code", [200, 201, 204, 299])
def test_2xx_is_delivered(code: int) -> None:
    assert decide(AttemptOutcome(status_code=code)).verdict is Verdict.DELIVERED


def test_410_disables_the_endpoint() -> None:
    assert decide(AttemptOutcome(status_code=410)).verdict is Verdict.DISABLE


@pytest.mark.parametrize(
    "outcome",
    [
        AttemptOutcome(status_code=500),
        AttemptOutcome(status_code=503),
        AttemptOutcome(status_code=429),
        AttemptOutcome(status_code=301, error="redirect not followed"),
        AttemptOutcome(status_code=404),
        AttemptOutcome(error="timed out after 10 s"),
        AttemptOutcome(error="connection error: ConnectError"),
    ],
)
def test_everything_else_is_retried_on_the_schedule(outcome: AttemptOutcome) -> None:
    first = decide(outcome, run_attempts=1)
    assert first.verdict is Verdict.RETRY and first.next_attempt_at == NOW + 5.0
    third = decide(outcome, run_attempts=3)
    assert third.next_attempt_at == NOW + 120.0
    last = decide(outcome, run_attempts=4)
    assert last.verdict is Verdict.FAILED and "4 attempt" in (last.reason or "")


def test_jitter_stays_within_ten_percent() -> None:
    low = decide(AttemptOutcome(status_code=500), run_attempts=2, jitter_draw=-1.0)
    high = decide(AttemptOutcome(status_code=500), run_attempts=2, jitter_draw=1.0)
    assert low.next_attempt_at == pytest.approx(NOW + 27.0)
    assert high.next_attempt_at == pytest.approx(NOW + 33.0)


def test_retry_after_can_only_push_the_next_attempt_later_and_at_most_a_day() -> None:
    later = decide(AttemptOutcome(status_code=429, retry_after_s=60.0))
    assert later.next_attempt_at == NOW + 60.0
    sooner = decide(AttemptOutcome(status_code=503, retry_after_s=0.0))
    assert sooner.next_attempt_at == NOW + 5.0
    capped = decide(AttemptOutcome(status_code=503, retry_after_s=10 * 86_400.0))
    assert capped.next_attempt_at == NOW + 86_400.0


def test_a_refused_url_fails_at_once() -> None:
    refused = decide(AttemptOutcome(error="refused: loopback", permanent=True))
    assert refused.verdict is Verdict.FAILED


def test_retry_after_parses_seconds_and_http_dates() -> None:
    assert parse_retry_after("120", NOW) == 120.0
    when = format_datetime(datetime.fromtimestamp(NOW + 90, UTC), usegmt=True)
    assert parse_retry_after(when, NOW) == pytest.approx(90.0)
    assert parse_retry_after("soon", NOW) is None
    assert parse_retry_after(None, NOW) is None
