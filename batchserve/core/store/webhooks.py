"""Webhook verbs of the job store: claim due deliveries, attempt, reschedule, redeliver, and
the endpoints disabled after a 410 Gone.

A delivery row is written by ``_log_ended`` with the terminal state change itself (the outbox).
From there: a relay claims due rows under a lease token (``claim_due_deliveries``), a sender
swaps that token for a fresh one as it starts (``begin_attempt``), so a duplicate task for the
same claim finds the token gone and sends nothing, and reports the outcome
(``finish_attempt``). A sender that dies mid-attempt leaves its lease to run out; the row is
claimed again and sent again with the same ``webhook-id``: at least once, never lost.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import insert, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core.db import transaction
from batchserve.core.domain import (
    AttemptRecord,
    ClaimedDelivery,
    DeliveryRecord,
    DeliveryStart,
    DeliveryStatus,
    from_epoch,
)
from batchserve.core.errors import InvalidTransition, NotFound
from batchserve.core.ids import uuid7
from batchserve.core.records import aware
from batchserve.core.store.base import StoreBase, deliveries_t
from batchserve.core.tables import attempts_table, endpoints_table
from batchserve.core.webhook_policy import AttemptOutcome, RetryDecision, Verdict

attempts_t = attempts_table
endpoints_t = endpoints_table
D = DeliveryStatus

ENDPOINT_DISABLED = (
    "the endpoint answered 410 Gone and is disabled; POST /v1/webhooks/endpoints/enable"
)
ABANDONED = "no result: the sender stopped in the middle of this attempt"


def url_key(url: str) -> str:
    return hashlib.sha256(url.encode()).hexdigest()


class WebhookVerbs(StoreBase):
    async def claim_due_deliveries(
        self, now: float, *, lease_s: float, limit: int = 100
    ) -> list[ClaimedDelivery]:
        """Lease up to ``limit`` deliveries that are due and not held by a live sender."""
        now_dt = from_epoch(now)
        due = (
            select(deliveries_t.c.id)
            .where(
                deliveries_t.c.status == D.PENDING.value,
                deliveries_t.c.next_attempt_at <= now_dt,
                or_(
                    deliveries_t.c.lease_expires_at.is_(None),
                    deliveries_t.c.lease_expires_at <= now_dt,
                ),
            )
            .order_by(deliveries_t.c.next_attempt_at)
            .limit(limit)
        )
        if self._postgres:
            due = due.with_for_update(skip_locked=True)
        token = uuid7()
        async with transaction(self.engine) as conn:
            rows = await conn.execute(
                update(deliveries_t)
                .where(deliveries_t.c.id.in_(due.scalar_subquery()))
                .values(lease_token=token, lease_expires_at=from_epoch(now + lease_s))
                .returning(deliveries_t.c.id)
            )
            ids = [str(r[0]) for r in rows]
        return [ClaimedDelivery(id=i, token=str(token)) for i in ids]

    async def begin_attempt(
        self, delivery_id: str, token: str, *, now: float, lease_s: float, max_attempts: int
    ) -> DeliveryStart | None:
        """Start an attempt if ``token`` still holds the lease; ``None`` when it does not, or
        when the delivery ends here (endpoint disabled, attempts spent)."""
        try:
            held = uuid.UUID(token)
        except ValueError:
            return None
        query = select(deliveries_t).where(deliveries_t.c.id == delivery_id)
        if self._postgres:
            query = query.with_for_update()
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).mappings().first()
            if row is None or row["status"] != D.PENDING.value or row["lease_token"] != held:
                return None
            # An attempt still open belonged to a sender that died in the middle of it.
            await conn.execute(
                update(attempts_t)
                .where(
                    attempts_t.c.delivery_id == delivery_id,
                    attempts_t.c.duration_ms.is_(None),
                    attempts_t.c.error.is_(None),
                )
                .values(error=ABANDONED)
            )
            if await self._endpoint_disabled(conn, row["tenant"], row["url"]):
                await self._fail(conn, delivery_id, now, ENDPOINT_DISABLED)
                return None
            if row["run_attempts"] >= max_attempts:  # the last attempt's sender died
                await self._fail(conn, delivery_id, now, f"gave up after {max_attempts} attempts")
                return None
            fresh = uuid7()
            number, run_attempts = row["attempts"] + 1, row["run_attempts"] + 1
            await conn.execute(
                update(deliveries_t)
                .where(deliveries_t.c.id == delivery_id)
                .values(
                    lease_token=fresh,
                    lease_expires_at=from_epoch(now + lease_s),
                    attempts=number,
                    run_attempts=run_attempts,
                )
            )
            await conn.execute(
                insert(attempts_t).values(
                    delivery_id=delivery_id, number=number, started_at=from_epoch(now)
                )
            )
        created_at = aware(row["created_at"])
        assert created_at is not None
        return DeliveryStart(
            id=delivery_id,
            token=str(fresh),
            number=number,
            run_attempts=run_attempts,
            request_id=row["request_id"],
            tenant=row["tenant"],
            url=row["url"],
            event_type=row["event_type"],
            created_at=created_at,
            job_id=row["job_id"],
        )

    async def finish_attempt(
        self, start: DeliveryStart, outcome: AttemptOutcome, decision: RetryDecision, *, now: float
    ) -> bool:
        """Record the attempt and act on the decision; False if the delivery moved on meanwhile.

        A success counts whoever sent it; a failure only reschedules or ends the delivery while
        its sender still holds the lease (otherwise a newer attempt owns what happens next).
        """
        now_dt = from_epoch(now)
        async with transaction(self.engine) as conn:
            await conn.execute(
                update(attempts_t)
                .where(attempts_t.c.delivery_id == start.id, attempts_t.c.number == start.number)
                .values(
                    status_code=outcome.status_code,
                    error=outcome.error,
                    duration_ms=round(outcome.duration_ms, 3),
                    address=outcome.address,
                )
            )
            pending = update(deliveries_t).where(
                deliveries_t.c.id == start.id, deliveries_t.c.status == D.PENDING.value
            )
            released: dict[str, Any] = {"lease_token": None, "lease_expires_at": None}
            if decision.verdict is Verdict.DELIVERED:
                stmt = pending.values(
                    status=D.DELIVERED.value,
                    finished_at=now_dt,
                    next_attempt_at=None,
                    error=None,
                    **released,
                )
            else:
                owned = pending.where(deliveries_t.c.lease_token == uuid.UUID(start.token))
                if decision.verdict is Verdict.RETRY:
                    assert decision.next_attempt_at is not None
                    stmt = owned.values(
                        next_attempt_at=from_epoch(decision.next_attempt_at), **released
                    )
                else:
                    stmt = owned.values(
                        status=D.FAILED.value,
                        finished_at=now_dt,
                        next_attempt_at=None,
                        error=decision.reason,
                        **released,
                    )
            changed = bool((await conn.execute(stmt)).rowcount)
            if changed and decision.verdict is Verdict.DISABLE:
                await self._disable_endpoint(conn, start.tenant, start.url, now, decision.reason)
        return changed

    # -- reads and commands for the API ---------------------------------------------------

    async def list_deliveries(self, request_id: uuid.UUID, tenant: str) -> list[DeliveryRecord]:
        """A request's deliveries with their attempts, oldest first."""
        query = (
            select(deliveries_t)
            .where(deliveries_t.c.request_id == request_id, deliveries_t.c.tenant == tenant)
            .order_by(deliveries_t.c.id)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
            ids = [r["id"] for r in rows]
            attempts = (
                (
                    await conn.execute(
                        select(attempts_t)
                        .where(attempts_t.c.delivery_id.in_(ids))
                        .order_by(attempts_t.c.delivery_id, attempts_t.c.number)
                    )
                )
                .mappings()
                .all()
            )
        by_delivery: dict[str, list[AttemptRecord]] = {}
        for a in attempts:
            by_delivery.setdefault(a["delivery_id"], []).append(_attempt(a))
        return [_delivery(r, by_delivery.get(r["id"], [])) for r in rows]

    async def redeliver(
        self, request_id: uuid.UUID, delivery_id: str, tenant: str, *, now: float
    ) -> DeliveryRecord:
        """Queue a fresh attempt now, under the same ``webhook-id``, with a fresh retry run."""
        query = select(deliveries_t).where(
            deliveries_t.c.id == delivery_id,
            deliveries_t.c.request_id == request_id,
            deliveries_t.c.tenant == tenant,
        )
        if self._postgres:
            query = query.with_for_update()
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).mappings().first()
            if row is None:
                raise NotFound(f"no delivery {delivery_id} of request {request_id}")
            if await self._endpoint_disabled(conn, tenant, row["url"]):
                raise InvalidTransition(ENDPOINT_DISABLED, state="endpoint_disabled")
            lease_until = aware(row["lease_expires_at"])
            if row["status"] == D.PENDING.value and lease_until and lease_until > from_epoch(now):
                raise InvalidTransition("an attempt is in progress; retry when it ends")
            await conn.execute(
                update(deliveries_t)
                .where(deliveries_t.c.id == delivery_id)
                .values(
                    status=D.PENDING.value,
                    run_attempts=0,
                    next_attempt_at=from_epoch(now),
                    lease_token=None,
                    lease_expires_at=None,
                    finished_at=None,
                    error=None,
                )
            )
        deliveries = await self.list_deliveries(request_id, tenant)
        return next(d for d in deliveries if d.id == delivery_id)

    async def enable_endpoint(self, tenant: str, url: str) -> bool:
        """Lift a 410's ban on (tenant, url); True if it was disabled."""
        async with transaction(self.engine) as conn:
            result = await conn.execute(
                update(endpoints_t)
                .where(
                    endpoints_t.c.tenant == tenant,
                    endpoints_t.c.url_sha256 == url_key(url),
                    endpoints_t.c.disabled_at.is_not(None),
                )
                .values(disabled_at=None, disabled_reason=None)
            )
        return bool(result.rowcount)

    # -- helpers -----------------------------------------------------------------------------

    async def _endpoint_disabled(self, conn: AsyncConnection, tenant: str, url: str) -> bool:
        row = await conn.execute(
            select(endpoints_t.c.tenant).where(
                endpoints_t.c.tenant == tenant,
                endpoints_t.c.url_sha256 == url_key(url),
                endpoints_t.c.disabled_at.is_not(None),
            )
        )
        return row.first() is not None

    async def _disable_endpoint(
        self, conn: AsyncConnection, tenant: str, url: str, now: float, reason: str | None
    ) -> None:
        dialect_insert = pg_insert if self._postgres else sqlite_insert
        values = {"disabled_at": from_epoch(now), "disabled_reason": reason}
        stmt = dialect_insert(endpoints_t).values(
            tenant=tenant, url_sha256=url_key(url), url=url, **values
        )
        await conn.execute(
            stmt.on_conflict_do_update(index_elements=["tenant", "url_sha256"], set_=values)
        )

    async def _fail(self, conn: AsyncConnection, delivery_id: str, now: float, error: str) -> None:
        await conn.execute(
            update(deliveries_t)
            .where(deliveries_t.c.id == delivery_id)
            .values(
                status=D.FAILED.value,
                finished_at=from_epoch(now),
                next_attempt_at=None,
                lease_token=None,
                lease_expires_at=None,
                error=error,
            )
        )


def _attempt(row: Mapping[Any, Any]) -> AttemptRecord:
    started_at = aware(row["started_at"])
    assert started_at is not None
    return AttemptRecord(
        number=row["number"],
        started_at=started_at,
        status_code=row["status_code"],
        error=row["error"],
        duration_ms=row["duration_ms"],
        address=row["address"],
    )


def _delivery(row: Mapping[Any, Any], attempts: list[AttemptRecord]) -> DeliveryRecord:
    created_at = aware(row["created_at"])
    assert created_at is not None
    return DeliveryRecord(
        id=row["id"],
        request_id=row["request_id"],
        tenant=row["tenant"],
        url=row["url"],
        event_type=row["event_type"],
        status=DeliveryStatus(row["status"]),
        attempts=row["attempts"],
        next_attempt_at=aware(row["next_attempt_at"]),
        created_at=created_at,
        finished_at=aware(row["finished_at"]),
        error=row["error"],
        attempt_log=tuple(attempts),
    )
