"""Ingest verbs of the job store: lease a validating job, persist its requests a chunk at a time,
then start it (or fail it, when its file is refused).

A chunk is written in one transaction with the job's ``ingested_lines`` advanced from where
the writer believes it stands, under its lease token: a driver that died mid-ingest leaves its
lease to run out and the next one resumes at the first line not committed. Its rows are written
already marked published, and once the broker has confirmed them the job's ``published_lines``
follows (one row instead of a chunk's): the next driver republishes the lines in between.
Request ids are derived from (job, line), so a line has one id however often it is written.
On Postgres the rows go in by ``COPY`` straight into ``requests`` (the ``ingested_lines``
check is what keeps a chunk from being written twice); on SQLite by multi-row inserts that
skip ids already there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import ColumnElement, delete, or_, select, update
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core.bulk import Endpoint, IngestClaim, JobStatus, LineError
from batchserve.core.db import transaction
from batchserve.core.domain import SubmitCommand, from_epoch
from batchserve.core.ids import uuid7
from batchserve.core.records import aware, command_row, pg_value
from batchserve.core.store.base import StoreBase, requests_t
from batchserve.core.store.jobs import jobs_t, queue_job_webhook

J = JobStatus
SQLITE_ROWS_PER_INSERT = 500


def ingest_waiting(now: float) -> tuple[ColumnElement[bool], ...]:
    """Validating jobs within their window that no driver holds (or whose holder's lease ran
    out by ``now``)."""
    now_dt = from_epoch(now)
    return (
        jobs_t.c.status == J.VALIDATING.value,
        jobs_t.c.expires_at > now_dt,
        or_(jobs_t.c.lease_expires_at.is_(None), jobs_t.c.lease_expires_at <= now_dt),
    )


class IngestVerbs(StoreBase):
    async def claim_ingest(self, now: float, *, lease_s: float) -> IngestClaim | None:
        """Lease the oldest validating job nobody holds (or whose holder's lease ran out)."""
        free = select(jobs_t.c.id).where(*ingest_waiting(now)).order_by(jobs_t.c.id).limit(1)
        if self._postgres:
            free = free.with_for_update(skip_locked=True)
        token = uuid7()
        async with transaction(self.engine) as conn:
            row = (
                (
                    await conn.execute(
                        update(jobs_t)
                        .where(jobs_t.c.id.in_(free.scalar_subquery()))
                        .values(lease_token=token, lease_expires_at=from_epoch(now + lease_s))
                        .returning(
                            jobs_t.c.id,
                            jobs_t.c.tenant,
                            jobs_t.c.endpoint,
                            jobs_t.c.input_file_id,
                            jobs_t.c.ingested_lines,
                            jobs_t.c.published_lines,
                            jobs_t.c.expires_at,
                        )
                    )
                )
                .mappings()
                .first()
            )
        if row is None:
            return None
        expires_at = aware(row["expires_at"])
        assert expires_at is not None
        return IngestClaim(
            job_id=row["id"],
            tenant=row["tenant"],
            token=token,
            endpoint=Endpoint(row["endpoint"]),
            input_file_id=row["input_file_id"],
            ingested_lines=int(row["ingested_lines"]),
            expires_at=expires_at,
            published_lines=int(row["published_lines"]),
        )

    async def ingest_chunk(
        self,
        claim: IngestClaim,
        commands: Sequence[SubmitCommand],
        *,
        start: int,
        now: float,
        lease_s: float,
    ) -> bool:
        """Persist ``commands`` (the job's requests from index ``start``, created ``now``) and
        advance the job.

        False when this claim no longer holds the job (lease lost, job cancelled or expired):
        nothing is written then.
        """
        async with transaction(self.engine) as conn:
            advanced = await conn.execute(
                _held(claim, now)
                .where(jobs_t.c.ingested_lines == start)
                .values(
                    ingested_lines=start + len(commands),
                    lease_expires_at=from_epoch(now + lease_s),
                )
            )
            if not advanced.rowcount:
                return False
            # Published: made true by published_through, or by the next driver.
            at = from_epoch(now)
            rows = [{**command_row(c), "created_at": at, "published_at": at} for c in commands]
            if self._postgres:
                await _copy_requests(conn, rows)
            else:
                await _insert_requests_sqlite(conn, rows)
        return True

    async def published_through(self, claim: IngestClaim, lines: int, now: float) -> bool:
        """The broker confirmed the job's requests up to line ``lines`` (0-based, exclusive)."""
        async with transaction(self.engine) as conn:
            changed = await conn.execute(
                _held(claim, now)
                .where(jobs_t.c.published_lines < lines, jobs_t.c.ingested_lines >= lines)
                .values(published_lines=lines)
            )
        return bool(changed.rowcount)

    async def start_job(
        self, claim: IngestClaim, *, total: int, model: str | None, now: float
    ) -> bool:
        """``validating -> in_progress`` once all ``total`` requests are persisted."""
        async with transaction(self.engine) as conn:
            changed = await conn.execute(
                _held(claim, now)
                .where(jobs_t.c.ingested_lines == total, jobs_t.c.published_lines == total)
                .values(
                    status=J.IN_PROGRESS.value,
                    in_progress_at=from_epoch(now),
                    total=total,
                    model=model,
                    lease_token=None,
                    lease_expires_at=None,
                )
            )
        return bool(changed.rowcount)

    async def fail_job(self, claim: IngestClaim, errors: Sequence[LineError], now: float) -> bool:
        """``validating -> failed``: the input file was refused; ``errors`` say where. The
        requests already written for it (never published) are deleted."""
        async with transaction(self.engine) as conn:
            row = (
                (
                    await conn.execute(
                        _held(claim, now)
                        .values(
                            status=J.FAILED.value,
                            failed_at=from_epoch(now),
                            errors=[e.as_dict() for e in errors],
                            lease_token=None,
                            lease_expires_at=None,
                        )
                        .returning(jobs_t.c.id, jobs_t.c.tenant, jobs_t.c.webhook_url)
                    )
                )
                .mappings()
                .first()
            )
            if row is not None:
                # Chunks written while the rest of the file was checked: never published.
                await conn.execute(delete(requests_t).where(requests_t.c.job_id == claim.job_id))
                await queue_job_webhook(conn, row, J.FAILED, now)
        return row is not None


def _held(claim: IngestClaim, now: float) -> Any:
    """An update of the job that only applies while ``claim`` still holds it, validating."""
    return update(jobs_t).where(
        jobs_t.c.id == claim.job_id,
        jobs_t.c.status == J.VALIDATING.value,
        jobs_t.c.lease_token == claim.token,
        jobs_t.c.expires_at > from_epoch(now),
    )


async def _copy_requests(conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    columns = list(rows[0])
    names = ", ".join(columns)
    raw = await conn.get_raw_connection()
    driver: Any = raw.driver_connection  # psycopg.AsyncConnection, in this transaction
    # Straight into the table: the job row's ``ingested_lines`` check, in this transaction and
    # under its row lock, lets a chunk be written once only, so no id can be there already.
    statement = f"COPY requests ({names}) FROM STDIN"
    async with driver.cursor() as cursor, cursor.copy(statement) as copy:
        for row in rows:
            await copy.write_row([pg_value(name, row[name]) for name in columns])


async def _insert_requests_sqlite(conn: AsyncConnection, rows: list[dict[str, Any]]) -> None:
    stmt = sqlite_insert(requests_t).on_conflict_do_nothing(index_elements=["id"])
    for at in range(0, len(rows), SQLITE_ROWS_PER_INSERT):
        await conn.execute(stmt, rows[at : at + SQLITE_ROWS_PER_INSERT])
