"""File verbs of the job store: batch input files, and the output files jobs generate."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import ColumnElement, delete, insert, or_, select, true
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core.bulk import ENDED_JOB_STATUSES, FilePurpose, FileRecord, job_public_id
from batchserve.core.db import transaction
from batchserve.core.domain import from_epoch
from batchserve.core.errors import InvalidTransition, NotFound
from batchserve.core.ids import uuid7
from batchserve.core.records import aware
from batchserve.core.store.base import StoreBase
from batchserve.core.store.creations import CreationKey, claim_creation
from batchserve.core.tables import files_table, jobs_table

files_t = files_table

FILE_COLUMNS = [
    files_t.c[name]
    for name in ("id", "tenant", "purpose", "filename", "bytes", "created_at", "expires_at")
]
ACTIVE_JOB = jobs_table.c.status.not_in([s.value for s in ENDED_JOB_STATUSES])


def _live(now: float | None) -> ColumnElement[bool]:
    """Files not expired at ``now`` (every file when ``now`` is None: the job driver reads an
    active job's input whatever its expiry)."""
    if now is None:
        return true()
    return or_(files_t.c.expires_at.is_(None), files_t.c.expires_at > from_epoch(now))


class FileVerbs(StoreBase):
    async def create_file(
        self,
        *,
        tenant: str,
        purpose: FilePurpose,
        filename: str,
        content: bytes,
        now: float,
        expires_after_s: float | None = None,
        idempotency: CreationKey | None = None,
    ) -> FileRecord:
        """Store a file's bytes whole; the caller has checked its size. ``expires_after_s``:
        the file expires that long after its creation (never without it). With
        ``idempotency``, a key used before answers with the file it created."""
        async with transaction(self.engine) as conn:
            if idempotency is not None:
                file_id = uuid7()
                earlier = await claim_creation(
                    conn, tenant=tenant, kind="file", key=idempotency, object_id=file_id, now=now
                )
                if earlier is not None:
                    query = select(*FILE_COLUMNS).where(
                        files_t.c.id == earlier, files_t.c.tenant == tenant
                    )
                    row = (await conn.execute(query)).mappings().first()
                    if row is None:
                        raise NotFound("the file this Idempotency-Key created has been deleted")
                    return file_record(row)
            return await insert_file(
                conn,
                tenant=tenant,
                purpose=purpose,
                filename=filename,
                content=content,
                now=now,
                expires_after_s=expires_after_s,
                file_id=file_id if idempotency is not None else None,
            )

    async def get_file(
        self, file_id: uuid.UUID, tenant: str, *, now: float | None = None
    ) -> FileRecord | None:
        """A file, unless it had expired at ``now``."""
        query = select(*FILE_COLUMNS).where(
            files_t.c.id == file_id, files_t.c.tenant == tenant, _live(now)
        )
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return file_record(row) if row else None

    async def list_files(
        self,
        tenant: str,
        *,
        limit: int,
        after: uuid.UUID | None = None,
        newest_first: bool = True,
        purpose: FilePurpose | None = None,
        now: float | None = None,
    ) -> list[FileRecord]:
        """The tenant's files in id (creation) order, newest first unless not ``newest_first``;
        ``after``: the last id of the previous page; not those expired at ``now``."""
        query = select(*FILE_COLUMNS).where(files_t.c.tenant == tenant, _live(now))
        if purpose is not None:
            query = query.where(files_t.c.purpose == purpose.value)
        if after is not None:
            query = query.where(files_t.c.id < after if newest_first else files_t.c.id > after)
        order = files_t.c.id.desc() if newest_first else files_t.c.id.asc()
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query.order_by(order).limit(limit))).mappings().all()
        return [file_record(row) for row in rows]

    async def delete_file(self, file_id: uuid.UUID, tenant: str) -> bool:
        """Delete a file; false if the tenant has no such file. A job that has not ended still
        reads its input file (to check it, then to write its output in the input's order):
        deleting that one is refused, naming the job."""
        jobs_t = jobs_table
        async with transaction(self.engine) as conn:
            using = (
                await conn.execute(
                    select(jobs_t.c.id, jobs_t.c.status).where(
                        jobs_t.c.tenant == tenant,
                        jobs_t.c.input_file_id == file_id,
                        ACTIVE_JOB,
                    )
                )
            ).first()
            if using is not None:
                raise InvalidTransition(
                    f"the file is the input of batch {job_public_id(using[0])}, which is "
                    f"{using[1]}: delete it once the batch has ended"
                )
            deleted = await conn.execute(
                delete(files_t).where(files_t.c.id == file_id, files_t.c.tenant == tenant)
            )
        return bool(deleted.rowcount)

    async def delete_expired_files(self, now: float) -> int:
        """Delete the files expired at ``now``, but not the input of a job that has not ended
        (it goes once the job has)."""
        jobs_t = jobs_table
        still_read = select(jobs_t.c.input_file_id).where(ACTIVE_JOB)
        async with transaction(self.engine) as conn:
            deleted = await conn.execute(
                delete(files_t).where(
                    files_t.c.expires_at <= from_epoch(now), files_t.c.id.not_in(still_read)
                )
            )
        return int(deleted.rowcount or 0)

    async def file_content(
        self, file_id: uuid.UUID, tenant: str, *, now: float | None = None
    ) -> bytes | None:
        """A file's bytes, unless it had expired at ``now``."""
        query = select(files_t.c.content).where(
            files_t.c.id == file_id, files_t.c.tenant == tenant, _live(now)
        )
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).first()
        return bytes(row[0]) if row else None


async def insert_file(
    conn: AsyncConnection,
    *,
    tenant: str,
    purpose: FilePurpose,
    filename: str,
    content: bytes,
    now: float,
    expires_after_s: float | None = None,
    file_id: uuid.UUID | None = None,
) -> FileRecord:
    record = FileRecord(
        id=file_id or uuid7(),
        tenant=tenant,
        purpose=purpose,
        filename=filename[:255] or "file.jsonl",
        bytes=len(content),
        created_at=from_epoch(now),
        expires_at=from_epoch(now + expires_after_s) if expires_after_s is not None else None,
    )
    await conn.execute(
        insert(files_t).values(
            id=record.id,
            tenant=tenant,
            purpose=purpose.value,
            filename=record.filename,
            bytes=record.bytes,
            content=content,
            created_at=record.created_at,
            expires_at=record.expires_at,
        )
    )
    return record


def file_record(row: Mapping[Any, Any]) -> FileRecord:
    created_at = aware(row["created_at"])
    assert created_at is not None
    return FileRecord(
        id=row["id"],
        tenant=row["tenant"],
        purpose=FilePurpose(row["purpose"]),
        filename=row["filename"],
        bytes=int(row["bytes"]),
        created_at=created_at,
        expires_at=aware(row["expires_at"]),
    )
