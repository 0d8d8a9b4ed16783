"""Bulk-job verbs of the job store that the API calls: create, read, list, cancel.

A job's request counts are counted from its requests until it ends, then frozen on the job row
in the transaction that ends it, so they always agree with the requests and the output files.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import func, insert, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core import lifecycle
from batchserve.core.bulk import JobCounts, JobRecord, JobStatus, LineError, NewJob
from batchserve.core.db import transaction
from batchserve.core.domain import DeliveryStatus, from_epoch, to_epoch
from batchserve.core.errors import InvalidTransition, NotFound
from batchserve.core.records import aware
from batchserve.core.store.base import S, StoreBase, deliveries_t, new_delivery_id, requests_t
from batchserve.core.store.creations import CreationKey, claim_creation
from batchserve.core.tables import jobs_table

jobs_t = jobs_table
J = JobStatus

CANCELLABLE = (J.VALIDATING.value, J.IN_PROGRESS.value)
OPEN_REQUEST_STATES = lifecycle.values(lifecycle.OPEN)


class JobVerbs(StoreBase):
    async def create_job(self, job: NewJob, *, idempotency: CreationKey | None = None) -> JobRecord:
        """Record a new job as ``validating``; the job driver takes it from there. With
        ``idempotency``, a key used before answers with the job it created (as it is now)."""
        async with transaction(self.engine) as conn:
            if idempotency is not None:
                earlier = await claim_creation(
                    conn,
                    tenant=job.tenant,
                    kind="batch",
                    key=idempotency,
                    object_id=job.id,
                    now=to_epoch(job.created_at),
                )
                if earlier is not None:
                    row = (
                        (await conn.execute(select(jobs_t).where(jobs_t.c.id == earlier)))
                        .mappings()
                        .first()
                    )
                    assert row is not None  # jobs are never deleted while their key is kept
                    return await _with_counts(conn, row)
            await conn.execute(
                insert(jobs_t).values(
                    id=job.id,
                    tenant=job.tenant,
                    status=J.VALIDATING.value,
                    endpoint=job.endpoint.value,
                    completion_window=job.completion_window,
                    input_file_id=job.input_file_id,
                    metadata=job.metadata,
                    webhook_url=job.webhook_url,
                    output_expires_after_s=job.output_expires_after_s,
                    total=0,
                    completed=0,
                    failed=0,
                    ingested_lines=0,
                    published_lines=0,
                    created_at=job.created_at,
                    expires_at=job.expires_at,
                )
            )
        record = await self.get_job(job.id, job.tenant)
        assert record is not None
        return record

    async def get_job(self, job_id: uuid.UUID, tenant: str | None = None) -> JobRecord | None:
        query = select(jobs_t).where(jobs_t.c.id == job_id)
        if tenant is not None:
            query = query.where(jobs_t.c.tenant == tenant)
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).mappings().first()
            if row is None:
                return None
            return await _with_counts(conn, row)

    async def list_jobs(
        self, tenant: str, *, limit: int, before: uuid.UUID | None = None
    ) -> list[JobRecord]:
        """Newest first; ``before`` is the cursor (the last id of the previous page)."""
        query = select(jobs_t).where(jobs_t.c.tenant == tenant)
        if before is not None:
            query = query.where(jobs_t.c.id < before)
        query = query.order_by(jobs_t.c.id.desc()).limit(limit)
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
            return [await _with_counts(conn, row) for row in rows]

    async def cancel_job(self, job_id: uuid.UUID, tenant: str, now: float) -> JobRecord:
        """Move a validating or running job to ``cancelling``; the driver cancels its requests.

        Cancelling a job that is cancelling or cancelled already answers it as it is.
        """
        async with transaction(self.engine) as conn:
            changed = await conn.execute(
                update(jobs_t)
                .where(
                    jobs_t.c.id == job_id,
                    jobs_t.c.tenant == tenant,
                    jobs_t.c.status.in_(CANCELLABLE),
                )
                .values(status=J.CANCELLING.value, cancelling_at=from_epoch(now))
            )
        record = await self.get_job(job_id, tenant)
        if record is None:
            raise NotFound(f"no batch {job_id}")
        if changed.rowcount or record.status in (J.CANCELLING, J.CANCELLED):
            return record
        raise InvalidTransition(
            f"a batch that is {record.status.value} cannot be cancelled",
            state=record.status.value,
        )

    async def job_counts(self, job_id: uuid.UUID) -> dict[str, int]:
        """How many of the job's requests are in each state."""
        async with transaction(self.engine) as conn:
            return await count_states(conn, job_id)


async def count_states(conn: AsyncConnection, job_id: uuid.UUID) -> dict[str, int]:
    rows = await conn.execute(
        select(requests_t.c.state, func.count())
        .where(requests_t.c.job_id == job_id)
        .group_by(requests_t.c.state)
    )
    return {state: int(count) for state, count in rows}


def counts_of(by_state: Mapping[str, int], total: int) -> JobCounts:
    """Succeeded requests are ``completed``; every other ending counts as ``failed``."""
    completed = by_state.get(S.SUCCEEDED.value, 0)
    ended = sum(n for state, n in by_state.items() if state not in OPEN_REQUEST_STATES)
    persisted = sum(by_state.values())
    return JobCounts(total=max(total, persisted), completed=completed, failed=ended - completed)


async def _with_counts(conn: AsyncConnection, row: Mapping[Any, Any]) -> JobRecord:
    if J(row["status"]).terminal:
        counts = JobCounts(total=row["total"], completed=row["completed"], failed=row["failed"])
    else:
        counts = counts_of(await count_states(conn, row["id"]), row["total"])
    return job_record(row, counts)


def job_record(row: Mapping[Any, Any], counts: JobCounts) -> JobRecord:
    created_at, expires_at = aware(row["created_at"]), aware(row["expires_at"])
    assert created_at is not None and expires_at is not None
    return JobRecord(
        id=row["id"],
        tenant=row["tenant"],
        status=J(row["status"]),
        endpoint=row["endpoint"],
        completion_window=row["completion_window"],
        input_file_id=row["input_file_id"],
        output_file_id=row["output_file_id"],
        error_file_id=row["error_file_id"],
        model=row["model"],
        metadata=row["metadata"],
        webhook_url=row["webhook_url"],
        errors=tuple(LineError.from_dict(e) for e in row["errors"] or ()),
        counts=counts,
        created_at=created_at,
        expires_at=expires_at,
        in_progress_at=aware(row["in_progress_at"]),
        finalizing_at=aware(row["finalizing_at"]),
        completed_at=aware(row["completed_at"]),
        failed_at=aware(row["failed_at"]),
        expired_at=aware(row["expired_at"]),
        cancelling_at=aware(row["cancelling_at"]),
        cancelled_at=aware(row["cancelled_at"]),
    )


async def queue_job_webhook(
    conn: AsyncConnection, row: Mapping[Any, Any], status: JobStatus, now: float
) -> None:
    """The outbox row of a job's ``batch.<status>`` event, in the transaction that ends it."""
    if not row["webhook_url"]:
        return
    at = from_epoch(now)
    await conn.execute(
        insert(deliveries_t).values(
            id=new_delivery_id(),
            request_id=None,
            job_id=row["id"],
            tenant=row["tenant"],
            url=row["webhook_url"],
            event_type=f"batch.{status.value}",
            status=DeliveryStatus.PENDING.value,
            attempts=0,
            run_attempts=0,
            next_attempt_at=at,
            created_at=at,
        )
    )
