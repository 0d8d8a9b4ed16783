"""``batchserve keys``: API keys and the tenants they name (admin commands; they talk to the
database directly, like ``migrate``)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import time
from collections.abc import Awaitable, Callable
from typing import Annotated, Any, TypeVar

import typer

from batchserve.core import apikeys
from batchserve.core.db import create_engine
from batchserve.core.migrate import upgrade
from batchserve.core.settings import Settings
from batchserve.core.store import JobStore, KeyRow, TenantRow

app = typer.Typer(help="API keys: create (printed once), list, revoke.", no_args_is_help=True)

T = TypeVar("T")
AsJson = Annotated[bool, typer.Option("--json", help="One JSON document")]


def _run(job: Callable[[JobStore], Awaitable[T]], settings: Settings | None = None) -> T:
    from batchserve.cli.served import admin_settings, opening

    if settings is None:
        settings = admin_settings()
    with opening(settings.effective_database_url):
        upgrade(settings.effective_database_url)
        return with_store(settings.effective_database_url, job)


def with_store(database_url: str, job: Callable[[JobStore], Awaitable[T]]) -> T:
    """Run ``job`` on a store of ``database_url``, from sync code (in its own thread and event
    loop, so it works where a loop runs already)."""

    async def main() -> T:
        engine = create_engine(database_url, pool_size=1)
        try:
            return await job(JobStore(engine))
        finally:
            await engine.dispose()

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, main()).result()


def create_key_blocking(database_url: str, tenant: str, **quotas: Any) -> str:
    """A new key for ``tenant`` (made if new, with ``quotas``) in a migrated database."""

    async def job(store: JobStore) -> str:
        made, _ = await make_key(store, tenant, None, **quotas)
        return made.key

    return with_store(database_url, job)


async def make_key(
    store: JobStore, tenant: str, name: str | None = None, **quotas: Any
) -> tuple[apikeys.NewKey, TenantRow]:
    made = apikeys.new_key()
    row = await store.create_key(
        tenant=tenant,
        key_id=made.id,
        key_sha256=made.sha256,
        name=name,
        now=time.time(),
        settings={k: v for k, v in quotas.items() if v is not None},
    )
    return made, row


def _tenant_dict(row: TenantRow) -> dict[str, Any]:
    return {
        "tenant": row.name,
        "weight": row.weight,
        "max_queued": row.max_queued,
        "rate_per_s": row.rate_per_s,
        "burst": row.burst,
        "max_bulk_in_flight": row.max_bulk_in_flight,
    }


@app.command()
def create(
    tenant: Annotated[str, typer.Option(help="The tenant the key acts for (made if new)")],
    weight: Annotated[
        float | None, typer.Option(min=0.001, help="Fair-share weight in batches (default 1)")
    ] = None,
    max_queued: Annotated[
        int | None, typer.Option(min=1, help="Unfinished interactive requests")
    ] = None,
    rate: Annotated[float | None, typer.Option(min=0.001, help="Submissions per second")] = None,
    burst: Annotated[int | None, typer.Option(min=1, help="Submissions at once (bucket)")] = None,
    max_bulk: Annotated[
        int | None, typer.Option(min=1, help="Unfinished bulk requests in flight")
    ] = None,
    name: Annotated[str | None, typer.Option(help="A label for the key")] = None,
    as_json: AsJson = False,
) -> None:
    """Make a key for TENANT and print it: it is shown this once, only its hash is kept.

    Weight and quota options set the tenant's (they apply to all its keys)."""
    if not apikeys.valid_tenant_name(tenant):
        typer.echo("batchserve: --tenant: 1-64 of letters, digits, '.', '_', '-'", err=True)
        raise typer.Exit(2)
    made, row = _run(
        lambda store: make_key(
            store,
            tenant,
            name,
            weight=weight,
            max_queued=max_queued,
            rate_per_s=rate,
            burst=burst,
            max_bulk_in_flight=max_bulk,
        )
    )
    if as_json:
        typer.echo(json.dumps({"key": made.key, "key_id": made.id, **_tenant_dict(row)}))
        return
    typer.echo(made.key)
    typer.echo(
        f"key {made.id} for tenant {row.name} (weight {row.weight:g}); "
        "it is not shown again: keep it now",
        err=True,
    )


@app.command("list")
def list_keys(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys")] = None,
    as_json: AsJson = False,
) -> None:
    """Keys (their ids, never the keys) with their tenants, weights and quotas."""
    rows: list[KeyRow] = _run(lambda store: store.list_keys(tenant))
    items = [
        {
            "key_id": r.id,
            "name": r.name,
            "created_at": r.created_at.isoformat(),
            "revoked_at": r.revoked_at.isoformat() if r.revoked_at else None,
            **_tenant_dict(r.tenant),
        }
        for r in rows
    ]
    if as_json:
        typer.echo(json.dumps({"keys": items}))
        return
    typer.echo(f"{'KEY_ID':<14}{'TENANT':<20}{'WEIGHT':>7}  {'CREATED':<20}STATUS")
    for item in items:
        status = "revoked" if item["revoked_at"] else "active"
        created = str(item["created_at"])[:19]
        typer.echo(
            f"{item['key_id']:<14}{item['tenant']:<20}{item['weight']:>7g}  {created:<20}{status}"
        )


@app.command()
def revoke(
    key_id: Annotated[str, typer.Argument(help="The key's id (from `keys list`) or the key")],
) -> None:
    """Revoke a key: every API replica refuses it at once (told over Redis), or within
    BATCHSERVE_KEY_CACHE_S seconds where it missed the news (or runs embedded)."""
    from batchserve.cli.served import admin_settings

    settings = admin_settings()
    key_id = apikeys.key_id_of(key_id) or key_id
    revoked = _run(lambda store: store.revoke_key(key_id, now=time.time()), settings)
    if not revoked:
        typer.echo(f"batchserve: no active key {key_id}", err=True)
        raise typer.Exit(1)
    if not settings.embedded:
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            pool.submit(asyncio.run, _announce_revoked(settings, key_id)).result()
    typer.echo(f"revoked {key_id}")


async def _announce_revoked(settings: Settings, key_id: str) -> None:
    from batchserve.core.domain import KeyRevoked
    from batchserve.core.wiring import redis_event_bus

    bus = redis_event_bus(settings)
    try:
        await bus.publish(KeyRevoked(key_id))
    finally:
        await bus.close()


async def first_key(store: JobStore) -> str | None:
    """A key for the tenant ``default`` when no key exists yet (a new deployment), else None."""
    if await store.count_keys():
        return None
    made, _ = await make_key(store, "default", "first key")
    return made.key


def announce_first_key(settings: Settings) -> None:
    """``batchserve serve`` on a new database: make a first key and print it, once."""
    if settings.auth != "required":
        return
    key = _run(first_key, settings)
    if key is not None:
        typer.echo(
            "batchserve: no API keys yet; made one for tenant 'default' (shown only now):\n"
            f"  export BATCHSERVE_API_KEY={key}\n"
            "  (more: batchserve keys create --tenant NAME)",
            err=True,
        )
