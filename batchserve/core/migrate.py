"""``batchserve migrate``: Alembic upgrade to head, on Postgres or the embedded SQLite file."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy.engine import make_url

from batchserve import migrations


def sync_url(url: str) -> str:
    """The same database through a synchronous driver (Alembic runs synchronously)."""
    parsed = make_url(url)
    if parsed.drivername == "sqlite+aiosqlite":
        if parsed.database:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        parsed = parsed.set(drivername="sqlite")
    elif parsed.drivername in ("postgresql+asyncpg", "postgresql"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    return parsed.render_as_string(hide_password=False)


def alembic_config(url: str) -> Config:
    config = Config()
    config.set_main_option("script_location", str(Path(migrations.__file__).parent))
    config.set_main_option("sqlalchemy.url", sync_url(url).replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    from alembic.runtime.migration import MigrationContext
    from sqlalchemy import create_engine

    engine = create_engine(sync_url(url))
    with engine.connect() as conn:
        revision = MigrationContext.configure(conn).get_current_revision()
    engine.dispose()
    return revision
