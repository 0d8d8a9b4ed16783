"""Settling verbs of the job store: end the open requests of an expired or cancelled job, and
end a job (completed, expired or cancelled) with its output files, once none is open.

Ending a job and writing its files, counts and ``batch.*`` webhook is one transaction that
holds the job row (``FOR UPDATE SKIP LOCKED``: another maintenance process skips it) and first
checks that none of its requests is still queued or running, so the files are final.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Exists, exists, select, update
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core.bulk import FilePurpose, JobLine, JobStatus, RenderedFiles, job_public_id
from batchserve.core.db import transaction
from batchserve.core.domain import RequestState, from_epoch
from batchserve.core.lifecycle import Cause
from batchserve.core.records import RECORD_COLUMNS, aware, row_record
from batchserve.core.store.base import requests_t
from batchserve.core.store.files import files_t, insert_file
from batchserve.core.store.jobs import OPEN_REQUEST_STATES, JobVerbs, jobs_t, queue_job_webhook

J = JobStatus

# (endpoint, ending status, finished requests by line, the input file when lines are missing)
Render = Callable[[str, JobStatus, Sequence[JobLine], bytes | None], RenderedFiles]

ENDED_AT = {J.COMPLETED: "completed_at", J.EXPIRED: "expired_at", J.CANCELLED: "cancelled_at"}


def job_not_ended() -> ColumnElement[bool]:
    """Jobs the driver still has to move along."""
    active = (J.VALIDATING, J.IN_PROGRESS, J.FINALIZING, J.CANCELLING)
    return jobs_t.c.status.in_([s.value for s in active])


@dataclass(frozen=True, slots=True)
class ActiveJob:
    id: uuid.UUID
    status: JobStatus
    expires_at: datetime


class SettleVerbs(JobVerbs):
    async def active_jobs(self, limit: int = 100) -> list[ActiveJob]:
        """Jobs not yet ended, oldest first (the job driver moves them along)."""
        query = (
            select(jobs_t.c.id, jobs_t.c.status, jobs_t.c.expires_at)
            .where(job_not_ended())
            .order_by(jobs_t.c.id)
            .limit(limit)
        )
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).all()
        return [ActiveJob(r[0], J(r[1]), aware(r[2]) or from_epoch(0)) for r in rows]

    async def end_job_requests(
        self,
        job_id: uuid.UUID,
        state: RequestState,
        *,
        code: str,
        message: str,
        now: float,
        limit: int = 5000,
    ) -> list[str]:
        """Expire or cancel up to ``limit`` of the job's queued and running requests.

        Rows another transaction holds (a worker writing results) are skipped and left for
        the next round; a running request's late result is discarded as for any cancel.
        """
        open_ids = (
            select(requests_t.c.id)
            .where(requests_t.c.job_id == job_id, requests_t.c.state.in_(OPEN_REQUEST_STATES))
            .order_by(requests_t.c.id)
            .limit(limit)
        )
        if self._postgres:
            open_ids = open_ids.with_for_update(skip_locked=True)
        async with transaction(self.engine) as conn:
            ended = await self._end(
                conn,
                Cause.JOB_ENDED,
                state,
                requests_t.c.id.in_(open_ids.scalar_subquery()),
                now=now,
                code=code,
                message=message,
            )
        await self._notify(ended)
        return list(ended.ids)

    async def mark_finalizing(self, job_id: uuid.UUID, now: float) -> bool:
        """``in_progress -> finalizing`` once none of the job's requests is queued or running."""
        async with transaction(self.engine) as conn:
            changed = await conn.execute(
                update(jobs_t)
                .where(
                    jobs_t.c.id == job_id,
                    jobs_t.c.status == J.IN_PROGRESS.value,
                    ~_open_requests(job_id),
                )
                .values(status=J.FINALIZING.value, finalizing_at=from_epoch(now))
            )
        return bool(changed.rowcount)

    async def finish_job(
        self,
        job_id: uuid.UUID,
        *,
        from_statuses: Sequence[JobStatus],
        to_status: JobStatus,
        now: float,
        render: Render,
    ) -> bool:
        """End the job as ``to_status`` with its output and error files, if it is in one of
        ``from_statuses``, nobody else holds it, and none of its requests is open."""
        query = select(jobs_t).where(
            jobs_t.c.id == job_id, jobs_t.c.status.in_([s.value for s in from_statuses])
        )
        if self._postgres:
            query = query.with_for_update(skip_locked=True)
        async with transaction(self.engine) as conn:
            job = (await conn.execute(query)).mappings().first()
            if job is None or (await conn.execute(select(_open_requests(job_id)))).scalar():
                return False
            lines = await _job_lines(conn, job_id)
            content = None
            if job["total"] == 0 or len(lines) < job["total"]:  # ingest never finished
                content = await _file_bytes(conn, job["input_file_id"])
            rendered = render(job["endpoint"], to_status, lines, content)
            output_id = await _store_file(conn, job, "output", rendered.output, now)
            error_id = await _store_file(conn, job, "error", rendered.errors, now)
            await conn.execute(
                update(jobs_t)
                .where(jobs_t.c.id == job_id)
                .values(
                    {
                        "status": to_status.value,
                        ENDED_AT[to_status]: from_epoch(now),
                        "output_file_id": output_id,
                        "error_file_id": error_id,
                        "total": rendered.counts.total,
                        "completed": rendered.counts.completed,
                        "failed": rendered.counts.failed,
                        "lease_token": None,
                        "lease_expires_at": None,
                    }
                )
            )
            await queue_job_webhook(conn, job, to_status, now)
        return True


def _open_requests(job_id: uuid.UUID) -> Exists:
    return exists().where(
        requests_t.c.job_id == job_id, requests_t.c.state.in_(OPEN_REQUEST_STATES)
    )


async def _job_lines(conn: AsyncConnection, job_id: uuid.UUID) -> list[JobLine]:
    query = (
        select(*RECORD_COLUMNS, requests_t.c.custom_id, requests_t.c.job_line)
        .where(requests_t.c.job_id == job_id)
        .order_by(requests_t.c.job_line)
    )
    rows = (await conn.execute(query)).mappings().all()
    return [JobLine(r["job_line"], r["custom_id"], row_record(r)) for r in rows]


async def _file_bytes(conn: AsyncConnection, file_id: uuid.UUID) -> bytes | None:
    row = (await conn.execute(select(files_t.c.content).where(files_t.c.id == file_id))).first()
    return bytes(row[0]) if row else None


async def _store_file(
    conn: AsyncConnection, job: Mapping[Any, Any], kind: str, content: bytes | None, now: float
) -> uuid.UUID | None:
    if content is None:
        return None
    record = await insert_file(
        conn,
        tenant=job["tenant"],
        purpose=FilePurpose.BATCH_OUTPUT,
        filename=f"{job_public_id(job['id'])}_{kind}.jsonl",
        content=content,
        now=now,
        expires_after_s=job["output_expires_after_s"],
    )
    return record.id
