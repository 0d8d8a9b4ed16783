"""The security tier: what an outside tester tried, each case held by a test (issue 21)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI

from batchserve.core.settings import Settings
from tests.support.inprocess import asgi_client, running_app


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    """The real app in-process, Postgres, RabbitMQ and Redis behind it."""
    async with running_app(settings) as application:
        yield application


@pytest.fixture
async def api(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with asgi_client(app) as client:
        yield client


async def stored_requests(app: FastAPI) -> int:
    return sum((await app.state.services.adapters.store.count_by_state()).values())
