"""The migrated schema is exactly what the ORM declares, on Postgres and on SQLite."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from batchserve.core.migrate import current, head, schema_behind, sync_url, upgrade
from batchserve.core.tables import Base
from batchserve.testing.deployment import free_port
from tests.conftest import server_env
from tests.support import servers


@pytest.mark.parametrize("backend", ["postgres", "sqlite"])
def test_migrated_schema_equals_orm_metadata(
    backend: str, database_url: str, tmp_path: Path
) -> None:
    url = database_url if backend == "postgres" else f"sqlite+aiosqlite:///{tmp_path}/m.sqlite3"
    upgrade(url)
    assert current(url) is not None
    engine = create_engine(sync_url(url))
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, Base.metadata)
    engine.dispose()
    assert diff == []


@pytest.fixture
def empty_database(run_id: str) -> Iterator[str]:
    """A database with no schema at all, dropped at the end; its URL."""
    name = f"{servers.DB_PREFIX}{run_id}_empty{next(_numbers)}"
    servers.create_database(name)
    try:
        yield servers.pg_url(name)
    finally:
        servers.drop_database(name)


_numbers = itertools.count()


def test_migrations_at_once_run_one_after_the_other(empty_database: str) -> None:
    """Three `batchserve migrate` at once on an empty database (a Job and its retries): without
    the advisory lock they all create the first tables and all but one fail."""
    env = {**os.environ, **server_env(empty_database, f"migrate{next(_numbers)}")}
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "batchserve.cli", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    for run in runs:
        out, err = run.communicate(timeout=120)
        assert run.returncode == 0, err
        assert f"database at revision {head()}" in out
    assert current(empty_database) == head()


def test_a_role_refuses_a_schema_older_than_its_code(empty_database: str, tmp_path: Path) -> None:
    assert "none (an empty database)" in (schema_behind(empty_database) or "")
    upgrade(empty_database, "0012")
    behind = schema_behind(empty_database)
    assert behind is not None and "0012" in behind and head() in behind
    assert "batchserve migrate" in behind
    env = {**os.environ, **server_env(empty_database, f"schema{next(_numbers)}")}
    started = subprocess.run(
        [sys.executable, "-m", "batchserve.cli", "maintenance"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 2, started.stderr
    assert f"batchserve maintenance: {behind}" in started.stderr
    upgrade(empty_database)
    assert schema_behind(empty_database) is None
    # A revision this code does not know is a newer schema (a rolling upgrade): used as is.
    with psycopg.connect(empty_database.replace("+psycopg", "")) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    assert schema_behind(empty_database) is None
    # A database out of reach is the role's own retries' business.
    assert schema_behind("postgresql+psycopg://postgres@127.0.0.1:1/nowhere") is None
    sqlite = f"sqlite+aiosqlite:///{tmp_path}/roles.sqlite3"
    assert schema_behind(sqlite) is not None
    upgrade(sqlite)
    assert schema_behind(sqlite) is None


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        response = httpx.get(url, timeout=2)
    except httpx.HTTPError:
        return 0, {}
    return response.status_code, response.json() if "json" in response.headers.get(
        "content-type", ""
    ) else {"text": response.text}


def test_a_role_waits_for_its_migration_then_answers_its_probes(
    empty_database: str, tmp_path: Path
) -> None:
    """With BATCHSERVE_SCHEMA_WAIT_S a role started beside its migration (a Kubernetes Job)
    waits for it instead of exiting; then its exporter answers /healthz, /readyz, /metrics."""
    upgrade(empty_database, "0012")
    port = free_port()
    env = {
        **os.environ,
        **server_env(empty_database, f"schema{next(_numbers)}"),
        "BATCHSERVE_SCHEMA_WAIT_S": "60",
        "BATCHSERVE_METRICS_PORT": str(port),
    }
    log = tmp_path / "maintenance.log"
    with log.open("wb") as out:
        role = subprocess.Popen(
            [sys.executable, "-m", "batchserve.cli", "maintenance"],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 60
        while "schema_behind" not in log.read_text() and time.monotonic() < give_up:
            assert role.poll() is None, log.read_text()
            time.sleep(0.2)
        assert "schema_behind" in log.read_text()
        time.sleep(1.5)  # it keeps waiting
        assert role.poll() is None, "the role exited instead of waiting for the migration"
        assert _get(f"{base}/readyz")[0] == 0  # not started yet: nothing listens
        upgrade(empty_database)
        give_up = time.monotonic() + 30
        while _get(f"{base}/readyz")[0] != 200 and time.monotonic() < give_up:
            time.sleep(0.2)
        assert _get(f"{base}/readyz") == (200, {"status": "ok"})
        status, live = _get(f"{base}/healthz")
        assert status == 200 and live["status"] == "ok"
        metrics = httpx.get(f"{base}/metrics", timeout=2)
        assert metrics.status_code == 200 and "batchserve_requests_finished_total" in metrics.text
        assert _get(f"{base}/nothing")[0] == 404
    finally:
        role.terminate()
        role.wait(timeout=30)
    assert role.returncode == 0, log.read_text()
