"""The migrated schema is exactly what the ORM declares, on Postgres and on SQLite."""

from __future__ import annotations

from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from batchserve.core.migrate import current, sync_url, upgrade
from batchserve.core.tables import Base


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
