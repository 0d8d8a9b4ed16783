"""File verbs of the job store: batch input files, and the output files jobs generate."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import insert, select
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core.bulk import FilePurpose, FileRecord
from batchserve.core.db import transaction
from batchserve.core.domain import from_epoch
from batchserve.core.ids import uuid7
from batchserve.core.records import aware
from batchserve.core.store.base import StoreBase
from batchserve.core.tables import files_table

files_t = files_table

FILE_COLUMNS = [
    files_t.c[name] for name in ("id", "tenant", "purpose", "filename", "bytes", "created_at")
]


class FileVerbs(StoreBase):
    async def create_file(
        self, *, tenant: str, purpose: FilePurpose, filename: str, content: bytes, now: float
    ) -> FileRecord:
        """Store a file's bytes whole; the caller has checked its size."""
        async with transaction(self.engine) as conn:
            return await insert_file(
                conn, tenant=tenant, purpose=purpose, filename=filename, content=content, now=now
            )

    async def get_file(self, file_id: uuid.UUID, tenant: str) -> FileRecord | None:
        query = select(*FILE_COLUMNS).where(files_t.c.id == file_id, files_t.c.tenant == tenant)
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return file_record(row) if row else None

    async def file_content(self, file_id: uuid.UUID, tenant: str) -> bytes | None:
        query = select(files_t.c.content).where(files_t.c.id == file_id, files_t.c.tenant == tenant)
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
) -> FileRecord:
    record = FileRecord(
        id=uuid7(),
        tenant=tenant,
        purpose=purpose,
        filename=filename[:255] or "file.jsonl",
        bytes=len(content),
        created_at=from_epoch(now),
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
    )
