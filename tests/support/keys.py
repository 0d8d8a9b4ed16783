"""API keys for the tests: made once per session, installed in the template database (so every
test database has them), handed to clients as ``Authorization`` headers."""

from __future__ import annotations

from batchserve.core import apikeys

# Tenants every test database knows; tests that need quotas make their own with Stack.make_key.
TENANTS = ("tests", "alice", "bob", "someone-else")
KEYS: dict[str, apikeys.NewKey] = {tenant: apikeys.new_key() for tenant in TENANTS}


def key(tenant: str = "tests") -> str:
    return KEYS[tenant].key


def auth(tenant: str = "tests") -> dict[str, str]:
    return {"Authorization": f"Bearer {key(tenant)}"}


def install(database_url: str) -> None:
    """Store every test key (its hash) in a migrated database."""
    import time

    from batchserve.cli.keys import with_store
    from batchserve.core.store import JobStore

    async def job(store: JobStore) -> None:
        for tenant, made in KEYS.items():
            await store.create_key(
                tenant=tenant, key_id=made.id, key_sha256=made.sha256, name=None, now=time.time()
            )

    with_store(database_url, job)
