"""Idempotent creation of OpenAI objects (files, batch jobs): a retry under the same
``Idempotency-Key`` gets the object the first call created, never a second one.

The claim is a row of ``idempotent_creations`` written in the transaction that creates the
object: of two calls racing with one key, the second's insert waits for the first's commit, then
finds its row and answers with its object. A key used again with another body is refused.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.ext.asyncio import AsyncConnection

from batchserve.core.domain import from_epoch
from batchserve.core.errors import IdempotencyConflict
from batchserve.core.tables import creations_table

creations_t = creations_table


@dataclass(frozen=True, slots=True)
class CreationKey:
    """A creating call's ``Idempotency-Key`` and the fingerprint of what it sent."""

    key: str
    fingerprint: str


async def claim_creation(
    conn: AsyncConnection,
    *,
    tenant: str,
    kind: str,
    key: CreationKey,
    object_id: uuid.UUID,
    now: float,
) -> uuid.UUID | None:
    """Claim ``key`` for a new object ``object_id`` of ``kind`` (``file``, ``batch``): ``None``
    when the key is new (create the object, in this transaction), else the id of the object an
    earlier call created with it. Raises :class:`IdempotencyConflict` for another body."""
    insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    claimed = await conn.execute(
        insert(creations_t)
        .values(
            tenant=tenant,
            kind=kind,
            key=key.key,
            fingerprint=key.fingerprint,
            object_id=object_id,
            created_at=from_epoch(now),
        )
        .on_conflict_do_nothing(index_elements=["tenant", "kind", "key"])
        .returning(creations_t.c.object_id)
    )
    if claimed.first() is not None:
        return None
    row = (
        await conn.execute(
            select(creations_t.c.object_id, creations_t.c.fingerprint).where(
                creations_t.c.tenant == tenant,
                creations_t.c.kind == kind,
                creations_t.c.key == key.key,
            )
        )
    ).first()
    assert row is not None  # the conflict was with this row, and only pruning deletes rows
    if row.fingerprint != key.fingerprint:
        raise IdempotencyConflict("this Idempotency-Key was used with a different request body")
    existing: uuid.UUID = row.object_id
    return existing
