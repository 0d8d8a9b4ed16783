"""Tenant and API-key verbs of the job store, and the per-tenant counts quotas read."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, insert, select, update

from batchserve.core.db import transaction
from batchserve.core.domain import from_epoch
from batchserve.core.records import aware
from batchserve.core.store.base import StoreBase
from batchserve.core.tables import keys_table, requests_table, tenants_table

tenants_t = tenants_table
keys_t = keys_table
requests_t = requests_table

NOT_TERMINAL = ("queued", "running")


@dataclass(frozen=True, slots=True)
class TenantRow:
    name: str
    weight: float = 1.0
    max_queued: int | None = None
    rate_per_s: float | None = None
    burst: int | None = None
    max_bulk_in_flight: int | None = None


@dataclass(frozen=True, slots=True)
class KeyRow:
    id: str
    tenant: TenantRow
    key_sha256: str
    name: str | None
    created_at: datetime
    revoked_at: datetime | None


QUOTA_FIELDS = ("weight", "max_queued", "rate_per_s", "burst", "max_bulk_in_flight")


class TenantVerbs(StoreBase):
    async def create_key(
        self,
        *,
        tenant: str,
        key_id: str,
        key_sha256: str,
        name: str | None,
        now: float,
        settings: Mapping[str, Any] | None = None,
    ) -> TenantRow:
        """Store a key (its hash) for ``tenant``, making the tenant if new; ``settings`` (weight
        and quotas) update the tenant when given."""
        changes = {k: v for k, v in (settings or {}).items() if k in QUOTA_FIELDS}
        async with transaction(self.engine) as conn:
            exists = (
                await conn.execute(select(tenants_t.c.name).where(tenants_t.c.name == tenant))
            ).first()
            if exists is None:
                values = {"weight": 1.0, **changes, "name": tenant, "created_at": from_epoch(now)}
                await conn.execute(insert(tenants_t).values(**values))
            elif changes:
                await conn.execute(
                    update(tenants_t).where(tenants_t.c.name == tenant).values(**changes)
                )
            await conn.execute(
                insert(keys_t).values(
                    id=key_id,
                    tenant=tenant,
                    key_sha256=key_sha256,
                    name=name,
                    created_at=from_epoch(now),
                )
            )
            row = (
                (await conn.execute(select(tenants_t).where(tenants_t.c.name == tenant)))
                .mappings()
                .one()
            )
        return _tenant(row)

    async def get_tenant(self, name: str) -> TenantRow | None:
        async with transaction(self.engine) as conn:
            row = (
                (await conn.execute(select(tenants_t).where(tenants_t.c.name == name)))
                .mappings()
                .first()
            )
        return _tenant(row) if row else None

    async def find_key(self, key_id: str) -> KeyRow | None:
        query = (
            select(keys_t, *(tenants_t.c[f] for f in QUOTA_FIELDS))
            .join(tenants_t, tenants_t.c.name == keys_t.c.tenant)
            .where(keys_t.c.id == key_id)
        )
        async with transaction(self.engine) as conn:
            row = (await conn.execute(query)).mappings().first()
        return _key(row) if row else None

    async def list_keys(self, tenant: str | None = None) -> list[KeyRow]:
        query = (
            select(keys_t, *(tenants_t.c[f] for f in QUOTA_FIELDS))
            .join(tenants_t, tenants_t.c.name == keys_t.c.tenant)
            .order_by(keys_t.c.tenant, keys_t.c.created_at)
        )
        if tenant is not None:
            query = query.where(keys_t.c.tenant == tenant)
        async with transaction(self.engine) as conn:
            rows = (await conn.execute(query)).mappings().all()
        return [_key(row) for row in rows]

    async def revoke_key(self, key_id: str, *, now: float) -> bool:
        """Revoke a key; False when there is no such key or it was revoked already."""
        stmt = (
            update(keys_t)
            .where(keys_t.c.id == key_id, keys_t.c.revoked_at.is_(None))
            .values(revoked_at=from_epoch(now))
            .returning(keys_t.c.id)
        )
        async with transaction(self.engine) as conn:
            return (await conn.execute(stmt)).first() is not None

    async def count_keys(self) -> int:
        async with transaction(self.engine) as conn:
            return int((await conn.execute(select(func.count()).select_from(keys_t))).scalar_one())

    async def tenant_weights(self) -> dict[str, float]:
        query = select(tenants_t.c.name, tenants_t.c.weight).where(tenants_t.c.weight != 1.0)
        async with transaction(self.engine) as conn:
            return {name: float(weight) for name, weight in await conn.execute(query)}

    async def queued_by_tenant(self) -> dict[str, int]:
        """Unfinished interactive requests per tenant (what the queued quota bounds)."""
        query = (
            select(requests_t.c.tenant, func.count())
            .where(requests_t.c.state.in_(NOT_TERMINAL), requests_t.c.lane == "interactive")
            .group_by(requests_t.c.tenant)
        )
        async with transaction(self.engine) as conn:
            return {tenant: int(n) for tenant, n in await conn.execute(query)}

    async def bulk_in_flight(self, tenant: str) -> int:
        """Unfinished bulk requests of ``tenant`` (what the bulk quota bounds)."""
        query = select(func.count()).where(
            requests_t.c.tenant == tenant,
            requests_t.c.state.in_(NOT_TERMINAL),
            requests_t.c.lane == "bulk",
        )
        async with transaction(self.engine) as conn:
            return int((await conn.execute(query)).scalar_one())


def _tenant(row: Mapping[Any, Any], name_key: str = "name") -> TenantRow:
    return TenantRow(
        name=row[name_key],
        weight=float(row["weight"]),
        max_queued=row["max_queued"],
        rate_per_s=row["rate_per_s"],
        burst=row["burst"],
        max_bulk_in_flight=row["max_bulk_in_flight"],
    )


def _key(row: Mapping[Any, Any]) -> KeyRow:
    created_at = aware(row["created_at"])
    assert created_at is not None
    return KeyRow(
        id=row["id"],
        tenant=_tenant(row, "tenant"),
        key_sha256=row["key_sha256"],
        name=row["name"],
        created_at=created_at,
        revoked_at=aware(row["revoked_at"]),
    )
