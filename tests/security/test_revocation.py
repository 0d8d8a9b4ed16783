"""A revoked key stops working on every API replica at once, not after the key cache time
(issue 21, item 9): ``batchserve keys revoke`` publishes the revocation over Redis."""

from __future__ import annotations

import asyncio
import time
from contextlib import AsyncExitStack

import httpx
from typer.testing import CliRunner

from batchserve.cli.keys import create_key_blocking
from batchserve.cli.main import app as cli_app
from batchserve.core.settings import Settings
from tests.conftest import server_env
from tests.support.inprocess import asgi_client, running_app


async def test_a_revoked_key_is_refused_by_every_replica_within_a_second(
    settings: Settings, database_url: str, namespace: str
) -> None:
    cached = settings.model_copy(update={"key_cache_s": 300.0})  # the cache alone: 5 minutes
    key = create_key_blocking(settings.effective_database_url, "acme")
    auth = {"Authorization": f"Bearer {key}"}
    async with AsyncExitStack() as stack:
        replicas: list[httpx.AsyncClient] = []
        for _ in range(2):
            app = await stack.enter_async_context(running_app(cached))
            replicas.append(await stack.enter_async_context(asgi_client(app, authed=False)))
        await asyncio.sleep(0.3)  # both subscribed
        for replica in replicas:  # the key is good, and now cached on both
            assert (await replica.get("/v1/models", headers=auth)).status_code == 200
        env = server_env(database_url, namespace)
        revoked = CliRunner().invoke(cli_app, ["keys", "revoke", key], env=env)
        assert revoked.exit_code == 0, revoked.output
        began = time.monotonic()
        for replica in replicas:
            while (await replica.get("/v1/models", headers=auth)).status_code != 401:
                assert time.monotonic() - began < 1.0, "a replica still takes the revoked key"
                await asyncio.sleep(0.02)
