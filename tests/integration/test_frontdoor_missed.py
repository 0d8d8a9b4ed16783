"""The frontdoor benchmark's count of requests that waited a batch more than the in-process
baseline would have made them (``batchserve/bench/frontdoor.py``: ``_MISSED``), on Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg

from batchserve.bench.frontdoor import missed_batches

T0 = 1_900_000_000.0  # the round's start, seconds since the epoch


class _Database:
    """What the benchmark's deployment offers the rounds: one query at a time."""

    def __init__(self, url: str) -> None:
        self.dsn = url.replace("postgresql+psycopg://", "postgresql://")

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return list(conn.execute(sql, params).fetchall())

    def batch(self, began: float, members: list[float]) -> None:
        """A succeeded 100 ms batch whose model began ``began`` s after T0, of requests that
        came ``members`` s after T0."""
        batch_id = uuid.uuid4()
        with psycopg.connect(self.dsn) as conn:
            conn.execute(
                "INSERT INTO batches (id, model, size, attempt, dispatched_at, started_at,"
                " finished_at, lease_expires_at, model_ms, outcome) VALUES (%s, 'echo', %s, 1,"
                " to_timestamp(%s), to_timestamp(%s), to_timestamp(%s), to_timestamp(%s), 100,"
                " 'succeeded')",
                (batch_id, len(members), T0 + began - 0.02, T0 + began - 0.01,
                 T0 + began + 0.1, T0 + began + 30),
            )  # fmt: skip
            for came in members:
                conn.execute(
                    "INSERT INTO requests (id, tenant, model, lane, state, params,"
                    " est_prompt_tokens, max_tokens, deadline, attempts, failures, batch_id,"
                    " created_at) VALUES (%s, 't1', 'echo', 'interactive', 'succeeded', '{}', 1,"
                    " 4, to_timestamp(%s), 1, 0, %s, to_timestamp(%s))",
                    (uuid.uuid4(), T0 + came + 60, batch_id, T0 + came),
                )


def test_a_request_that_came_before_a_batch_with_room_started_missed_it(
    database_url: str,
) -> None:
    """Batches of up to 4 beginning every 100 ms. A request that came 5 ms before the second
    began and rode in the third missed the second (it had room); one that came before the
    third began, which was full, and rode in the fourth missed nothing the baseline would
    have given it; the first batch has none ahead of it."""
    db = _Database(database_url)
    db.batch(0.0, [-0.05])
    db.batch(0.1, [0.05])
    db.batch(0.2, [0.095, 0.15, 0.15, 0.15])  # full
    db.batch(0.3, [0.19])
    found = missed_batches(db, T0 - 1.0, T0 + 1.0, room=4)  # type: ignore[arg-type]
    assert found == {"count": 1, "of": 7, "by_ms_p50": 5.0}
    # Requests that came, and batches sent, outside the round are not its own.
    later = missed_batches(db, T0 + 0.1, T0 + 1.0, room=4)  # type: ignore[arg-type]
    assert later == {"count": 0, "of": 4, "by_ms_p50": None}
    # Batches of up to 5: the third had room too.
    assert missed_batches(db, T0 - 1.0, T0 + 1.0, room=5)["count"] == 2  # type: ignore[arg-type]
