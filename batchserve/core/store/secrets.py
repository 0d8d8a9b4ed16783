"""Signing-secret verbs of the job store: one secret per tenant, and the one it replaced.

The store sees ciphertexts only; ``core.webhook_secrets`` encrypts and decrypts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from batchserve.core.db import transaction
from batchserve.core.domain import from_epoch
from batchserve.core.records import aware
from batchserve.core.store.base import StoreBase
from batchserve.core.tables import secrets_table

secrets_t = secrets_table


@dataclass(frozen=True, slots=True)
class SecretRow:
    """A tenant's signing secrets as stored: ciphertexts only."""

    secret_enc: str
    created_at: datetime
    previous_enc: str | None
    previous_expires_at: datetime | None


class SecretVerbs(StoreBase):
    async def get_secret(self, tenant: str) -> SecretRow | None:
        async with transaction(self.engine) as conn:
            row = (
                (await conn.execute(select(secrets_t).where(secrets_t.c.tenant == tenant)))
                .mappings()
                .first()
            )
        return _secret(row) if row else None

    async def insert_secret(self, tenant: str, secret_enc: str, *, now: float) -> bool:
        """Store a first secret; False when the tenant has one already (the first one wins)."""
        dialect_insert = pg_insert if self._postgres else sqlite_insert
        stmt = (
            dialect_insert(secrets_t)
            .values(tenant=tenant, secret_enc=secret_enc, created_at=from_epoch(now))
            .on_conflict_do_nothing(index_elements=["tenant"])
            .returning(secrets_t.c.tenant)
        )
        async with transaction(self.engine) as conn:
            inserted = (await conn.execute(stmt)).first()
        return inserted is not None

    async def rotate_secret(
        self, tenant: str, secret_enc: str, *, now: float, previous_expires_at: float
    ) -> SecretRow:
        """Make ``secret_enc`` current; the one it replaces signs until ``previous_expires_at``."""
        query = select(secrets_t).where(secrets_t.c.tenant == tenant)
        if self._postgres:
            query = query.with_for_update()
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).mappings().first()
            if row is None:
                await conn.execute(
                    insert(secrets_t).values(
                        tenant=tenant, secret_enc=secret_enc, created_at=from_epoch(now)
                    )
                )
                return SecretRow(secret_enc, from_epoch(now), None, None)
            await conn.execute(
                update(secrets_t)
                .where(secrets_t.c.tenant == tenant)
                .values(
                    secret_enc=secret_enc,
                    created_at=from_epoch(now),
                    previous_enc=row["secret_enc"],
                    previous_expires_at=from_epoch(previous_expires_at),
                )
            )
        return SecretRow(
            secret_enc, from_epoch(now), row["secret_enc"], from_epoch(previous_expires_at)
        )


def _secret(row: Mapping[Any, Any]) -> SecretRow:
    created_at = aware(row["created_at"])
    assert created_at is not None
    return SecretRow(
        secret_enc=row["secret_enc"],
        created_at=created_at,
        previous_enc=row["previous_enc"],
        previous_expires_at=aware(row["previous_expires_at"]),
    )
