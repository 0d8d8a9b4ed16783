"""The webhook outbox in the job store, on real Postgres and on the embedded SQLite file: a
delivery row is written with every terminal transition of a request that has a URL, and the
lease makes each attempt belong to one sender."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from batchserve.core.db import create_engine
from batchserve.core.domain import DeliveryStatus, Lane, SubmitCommand, utcnow
from batchserve.core.ids import uuid7
from batchserve.core.migrate import upgrade
from batchserve.core.store import Admission, JobStore
from batchserve.core.tables import deliveries_table
from batchserve.core.webhook_policy import AttemptOutcome, RetryDecision, Verdict
from tests.support.batches import complete

URL = "https://hooks.example.com/batchserve"
TENANT = "t1"


@pytest.fixture(params=["postgres", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[JobStore]:
    if request.param == "postgres":
        url = request.getfixturevalue("database_url")
    else:
        url = f"sqlite+aiosqlite:///{tmp_path}/store.sqlite3"
        upgrade(url)
    engine = create_engine(url, pool_size=4)
    yield JobStore(engine, max_failures=3)
    await engine.dispose()


def command(webhook_url: str | None = URL, timeout_s: float = 600) -> SubmitCommand:
    now = utcnow()
    return SubmitCommand(
        id=uuid7(),
        tenant=TENANT,
        model="echo-100ms",
        lane=Lane.INTERACTIVE,
        input="hi",
        messages=None,
        params={"max_tokens": 16},
        created_at=now,
        deadline=now + timedelta(seconds=timeout_s),
        prompt_tokens=1,
        max_tokens=16,
        webhook_url=webhook_url,
    )


async def submit(store: JobStore, *commands: SubmitCommand) -> list[str]:
    outcomes = await store.submit(list(commands))
    return [str(o.record.id) for o in outcomes if isinstance(o, Admission)]


async def deliveries(store: JobStore) -> list[dict[str, object]]:
    async with store.engine.connect() as conn:
        rows = await conn.execute(select(deliveries_table).order_by(deliveries_table.c.id))
        return [dict(r) for r in rows.mappings()]


async def test_every_terminal_transition_of_a_request_with_a_url_queues_one_delivery(
    store: JobStore,
) -> None:
    now = time.time()
    done, cancelled, expired, silent = await submit(
        store, command(), command(), command(timeout_s=1), command(webhook_url=None)
    )
    await complete(store, [done, silent], now)
    await store.cancel(uuid.UUID(cancelled), TENANT, now)
    assert await store.expire_overdue(now + 5) == [expired]
    rows = await deliveries(store)
    by_request = {str(r["request_id"]): r for r in rows}
    assert set(by_request) == {done, cancelled, expired}  # none for the request without a URL
    assert {k: v["event_type"] for k, v in by_request.items()} == {
        done: "request.succeeded",
        cancelled: "request.cancelled",
        expired: "request.expired",
    }
    assert all(r["status"] == "pending" and r["url"] == URL for r in rows)
    ids = [str(r["id"]) for r in rows]
    assert all(i.startswith("msg_") for i in ids) and len(set(ids)) == 3
    # A delivery is due at once; the relay claims each exactly once while its lease holds.
    claimed = await store.claim_due_deliveries(now + 5.1, lease_s=30)
    assert sorted(c.id for c in claimed) == sorted(ids)
    assert await store.claim_due_deliveries(now + 5.2, lease_s=30) == []


async def test_the_lease_lets_one_sender_attempt_and_a_dead_one_be_replaced(
    store: JobStore,
) -> None:
    now = time.time()
    (request_id,) = await submit(store, command())
    await complete(store, [request_id], now)
    (claim,) = await store.claim_due_deliveries(now, lease_s=10)
    start = await store.begin_attempt(claim.id, claim.token, now=now, lease_s=10, max_attempts=3)
    assert start is not None and start.number == 1
    # A duplicate task for the same claim finds its token spent: it sends nothing.
    duplicate = await store.begin_attempt(
        claim.id, claim.token, now=now, lease_s=10, max_attempts=3
    )
    assert duplicate is None
    # Nothing is claimable while the sender's lease holds; once it runs out (the sender died
    # mid-attempt), the delivery is claimed and attempted again, under the same id.
    assert await store.claim_due_deliveries(now + 5, lease_s=10) == []
    (again,) = await store.claim_due_deliveries(now + 11, lease_s=10)
    assert again.id == claim.id
    second = await store.begin_attempt(
        again.id, again.token, now=now + 11, lease_s=10, max_attempts=3
    )
    assert second is not None and second.number == 2
    # The dead sender's late failure does not reschedule what the new holder owns...
    late = RetryDecision(Verdict.RETRY, next_attempt_at=now + 100)
    assert not await store.finish_attempt(start, AttemptOutcome(status_code=500), late, now=now)
    # ...but a success counts, whoever reports it.
    delivered = RetryDecision(Verdict.DELIVERED)
    assert await store.finish_attempt(
        second, AttemptOutcome(status_code=204, duration_ms=3.0), delivered, now=now + 12
    )
    (record,) = await store.list_deliveries(uuid.UUID(request_id), TENANT)
    assert record.status is DeliveryStatus.DELIVERED and record.attempts == 2
    assert [a.status_code for a in record.attempt_log] == [500, 204]
    assert await store.list_deliveries(uuid.UUID(request_id), "someone-else") == []


async def test_a_sender_that_died_on_the_last_attempt_ends_the_delivery(store: JobStore) -> None:
    now = time.time()
    (request_id,) = await submit(store, command())
    await complete(store, [request_id], now)
    (claim,) = await store.claim_due_deliveries(now, lease_s=1)
    start = await store.begin_attempt(claim.id, claim.token, now=now, lease_s=1, max_attempts=1)
    assert start is not None
    (again,) = await store.claim_due_deliveries(now + 2, lease_s=1)
    assert again.id == claim.id
    assert (
        await store.begin_attempt(again.id, again.token, now=now + 2, lease_s=1, max_attempts=1)
        is None
    )
    (record,) = await store.list_deliveries(uuid.UUID(request_id), TENANT)
    assert record.status is DeliveryStatus.FAILED and "gave up" in (record.error or "")
    assert record.attempt_log[0].error is not None  # marked: no result from that attempt
