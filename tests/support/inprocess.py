"""The real API app run in-process (its lifespan started), and a client of it over ASGI."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

import httpx
from fastapi import FastAPI

from batchserve.api.main import create_app
from batchserve.core.settings import Settings
from tests.support import keys

# The host of an in-process app's client (no port: its requests never leave the process).
ASGI_HOST = "test"


@contextlib.asynccontextmanager
async def running_app(settings: Settings) -> AsyncIterator[FastAPI]:
    application = create_app(settings)
    async with application.router.lifespan_context(application):
        yield application


@contextlib.asynccontextmanager
async def asgi_client(app: FastAPI, *, authed: bool = True) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app``, with the test key unless ``authed`` is false."""
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app),
        base_url=f"http://{ASGI_HOST}",
        headers=keys.auth() if authed else None,
    ) as client:
        yield client


def tenant_settings(settings: Settings) -> Settings:
    """``settings`` for tenant tests: keys read afresh on every request, a webhook-secret key,
    and a small backlog bound a test can reach."""
    from cryptography.fernet import Fernet
    from pydantic import SecretStr

    return settings.model_copy(
        update={
            "key_cache_s": 0.0,
            "secret_key": SecretStr(Fernet.generate_key().decode()),
            "min_backlog": 10,
            "max_queue_s": 1.0,
        }
    )
