"""Shared fixtures. Unit tests need none of the servers; everything else isolates itself on them
with its own database (cloned from a migrated template), queue and key namespace, and port."""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from batchserve.core.migrate import upgrade
from batchserve.core.settings import Settings
from batchserve.testing.deployment import Stack
from tests.support import keys, servers
from tests.support.inprocess import asgi_client, running_app

TEST_MODELS = Path(__file__).parent / "models.toml"
_counter = itertools.count(1)


@pytest.fixture(scope="session")
def run_id() -> Iterator[str]:
    run = servers.new_run_id()
    yield run
    servers.delete_queues(run)
    servers.delete_redis_keys(run)


@pytest.fixture(scope="session")
def live_servers() -> None:
    missing = [
        f"{name} ({host}:{port})"
        for name, host, port in (
            ("PostgreSQL", "127.0.0.1", 5432),
            ("RabbitMQ", "127.0.0.1", 5672),
            ("Redis", "127.0.0.1", 6379),
        )
        if not servers.port_open(host, port)
    ]
    if missing:
        pytest.fail(f"servers not running: {', '.join(missing)} (`make test` starts them)")


@pytest.fixture(scope="session")
def template_db(live_servers: None, run_id: str) -> Iterator[str]:
    servers.drop_stale_databases()
    name = f"{servers.DB_PREFIX}{run_id}_template"
    servers.create_database(name)
    upgrade(servers.pg_url(name))
    keys.install(servers.pg_url(name))
    yield name
    servers.drop_database(name)


@contextlib.contextmanager
def own_database(template_db: str, run_id: str, suffix: str) -> Iterator[str]:
    """A database cloned from the migrated template, dropped at the end; its URL."""
    name = f"{servers.DB_PREFIX}{run_id}_{suffix}"
    servers.create_database(name, template=template_db)
    try:
        yield servers.pg_url(name)
    finally:
        servers.drop_database(name)


@pytest.fixture
def database_url(template_db: str, run_id: str) -> Iterator[str]:
    with own_database(template_db, run_id, str(next(_counter))) as url:
        yield url


@pytest.fixture
def namespace(run_id: str) -> str:
    return f"{run_id}n{next(_counter)}"


def server_env(database_url: str, namespace: str, **overrides: str) -> dict[str, str]:
    env = {
        "BATCHSERVE_DATABASE_URL": database_url,
        "BATCHSERVE_BROKER_URL": servers.BROKER_URL,
        "BATCHSERVE_REDIS_URL": servers.REDIS_URL,
        "BATCHSERVE_NAMESPACE": namespace,
        "BATCHSERVE_MODELS": str(TEST_MODELS),
        "BATCHSERVE_LOG_LEVEL": "INFO",
        "BATCHSERVE_REPUBLISH_AFTER_S": "2",
        # For clients the tests start (load generators); the servers don't read it.
        "BATCHSERVE_API_KEY": keys.key(),
    }
    env.update(overrides)
    return env


@pytest.fixture
def settings(database_url: str, namespace: str) -> Settings:
    env = server_env(database_url, namespace)
    fields: dict[str, Any] = {k.removeprefix("BATCHSERVE_").lower(): v for k, v in env.items()}
    return Settings(**fields)


def registered_test_models() -> list[str]:
    from batchserve.models.registry import load_registry

    return load_registry(TEST_MODELS).names()


@contextlib.contextmanager
def deployment(database_url: str, namespace: str, log_dir: Path) -> Iterator[Stack]:
    """A deployment on its own database and namespace: its roles killed and its queues
    deleted at the end."""
    env = {**os.environ, **server_env(database_url, namespace)}
    stack = Stack(env=env, log_dir=log_dir, keys={"tests": keys.key()})
    try:
        yield stack
    finally:
        stack.discard()
        servers.delete_namespace_queues(namespace, registered_test_models())


@pytest.fixture
def stack(database_url: str, namespace: str, tmp_path: Path) -> Iterator[Stack]:
    with deployment(database_url, namespace, tmp_path) as started:
        yield started


@contextlib.asynccontextmanager
async def client_of(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``stack``'s API (start the API first)."""
    limits = httpx.Limits(max_connections=200, max_keepalive_connections=200)
    async with httpx.AsyncClient(
        base_url=stack.url, timeout=60, limits=limits, headers=keys.auth()
    ) as client:
        yield client


@pytest.fixture
async def http(stack: Stack) -> AsyncIterator[httpx.AsyncClient]:
    """A client of the stack's API (start the API first)."""
    async with client_of(stack) as client:
        yield client


@pytest.fixture
async def app(settings: Settings) -> AsyncIterator[FastAPI]:
    """The real API app in-process (Postgres, RabbitMQ and Redis behind it)."""
    async with running_app(settings) as application:
        yield application


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    """A client of ``app`` over ASGI, with the test key."""
    async with asgi_client(app) as http:
        yield http


@pytest.fixture
async def adapters(settings: Settings) -> AsyncIterator[object]:
    from batchserve.core.wiring import connect

    connected = connect(settings, pool_size=4)
    try:
        yield connected
    finally:
        await connected.close()
        servers.delete_namespace_queues(settings.namespace, registered_test_models())
