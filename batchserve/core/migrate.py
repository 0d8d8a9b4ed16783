"""``batchserve migrate``: Alembic upgrade to head, on Postgres or the embedded SQLite file.

Migrations run under a Postgres advisory lock (``migrations/env.py``): two ``migrate`` at once
(a Job and a restarted Job, two hosts) run one after the other, and the second finds nothing to
do. Every role checks the schema before it starts (:func:`schema_behind`) and refuses to run on
one older than its code.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

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


def _scripts() -> Any:
    """This code's migrations (no database needed to read them)."""
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config("sqlite://"))


def head() -> str:
    """The latest revision this code knows."""
    found = _scripts().get_current_head()
    assert found is not None
    return str(found)


def schema_behind(url: str) -> str | None:
    """Why a role must not start on this database (its schema is older than the code's, or
    empty), else ``None``. A database this code cannot reach now is the role's own retries'
    business; one at a revision this code does not know is newer (a rolling upgrade migrated
    first) and is used as it is."""
    from sqlalchemy.exc import SQLAlchemyError

    try:
        at = current(url)
    except (SQLAlchemyError, OSError):
        return None
    scripts = _scripts()
    latest = str(scripts.get_current_head())
    if at == latest:
        return None
    if at is not None and at not in {r.revision for r in scripts.walk_revisions()}:
        return None
    return (
        f"the database schema is at revision {at or 'none (an empty database)'} and this "
        f"batchserve needs {latest}: run `batchserve migrate` first"
    )


def wait_for_schema(url: str, wait_s: float, *, poll_s: float = 1.0) -> str | None:
    """:func:`schema_behind`, asked again every ``poll_s`` for up to ``wait_s`` while the
    schema is behind: a role started beside its migration (a Kubernetes Job, a compose
    service) waits for it instead of failing. What is still wrong then, or ``None``."""
    give_up = time.monotonic() + wait_s
    problem = schema_behind(url)
    if problem is not None and wait_s > 0:
        from batchserve.core.logs import get_logger

        get_logger("batchserve").warning("schema_behind", waiting_s=wait_s, problem=problem)
    while problem is not None and time.monotonic() < give_up:
        time.sleep(min(poll_s, max(0.0, give_up - time.monotonic())))
        problem = schema_behind(url)
    return problem
