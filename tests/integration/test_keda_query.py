"""KEDA's query (the worker ScaledObject's `postgresql` trigger, as each overlay renders it) on a
migrated Postgres database: it counts the queued requests of its model alone, through the libpq
URL form KEDA reads (KEDA_POSTGRES_CONNECTION), and Postgres can answer it from an index."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from sqlalchemy.engine import make_url

from batchserve.core.domain import RequestState
from tests.unit.test_kubernetes_manifests import OVERLAYS, render, scaled_object, served_model


def libpq_url(database_url: str) -> str:
    """The SQLAlchemy URL of the test database as a libpq URL (postgresql://...)."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def insert(conn: psycopg.Connection, model: str, state: str, count: int) -> None:
    now = datetime.now(UTC)
    finished = None if state in ("queued", "running") else now
    with conn.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO requests (id, tenant, model, lane, state, params, est_prompt_tokens,"
            " max_tokens, deadline, attempts, failures, created_at, finished_at)"
            " VALUES (%s, 'anonymous', %s, 'interactive', %s, '{}', 1, 1, %s, 0, 0, %s, %s)",
            [
                (uuid.uuid4(), model, state, now + timedelta(hours=1), now, finished)
                for _ in range(count)
            ],
        )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_keda_query_counts_the_queued_requests_of_its_model(
    overlay: str, database_url: str
) -> None:
    docs = render(overlay)
    model = served_model(docs).name
    (trigger,) = scaled_object(docs)["spec"]["triggers"]
    query = trigger["metadata"]["query"]
    with psycopg.connect(libpq_url(database_url), autocommit=True) as conn:
        assert conn.execute(query).fetchone() == (0,)
        insert(conn, model, "queued", 7)
        for state in RequestState:  # the model's other states are not queued work
            if state is not RequestState.QUEUED:
                insert(conn, model, state.value, 2)
        insert(conn, f"{model}-other", "queued", 5)  # nor another model's queue
        insert(conn, "echo-slow", "queued", 3)
        assert conn.execute(query).fetchone() == (7,)

        # Cheap: Postgres can read the queued rows from an index whose first column is the state,
        # not the whole table (most of which is finished requests).
        conn.execute("SET enable_seqscan = off")
        plan = "\n".join(row[0] for row in conn.execute(f"EXPLAIN {query}").fetchall())
        assert "ix_requests_state_deadline" in plan, plan
        (columns,) = conn.execute(
            "SELECT pg_get_indexdef('ix_requests_state_deadline'::regclass)"
        ).fetchone() or ("",)
        assert "(state, deadline)" in columns, columns
