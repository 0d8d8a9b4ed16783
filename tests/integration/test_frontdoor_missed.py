"""The frontdoor benchmark's figures read from its deployment's batches, on Postgres
(``batchserve/bench/frontdoor.py``): the requests that waited a batch more than the in-process
baseline would have made them (``_MISSED``), and how long after its batch's model ended each
caller had its answer (``_MODEL_ENDS``)."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

from batchserve.bench.frontdoor import answered_after_model, missed_batches

T0 = 1_900_000_000.0  # the round's start, seconds since the epoch


class _Database:
    """What the benchmark's deployment offers the rounds: one query at a time."""

    def __init__(self, url: str) -> None:
        self.dsn = url.replace("postgresql+psycopg://", "postgresql://")

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn) as conn:
            return list(conn.execute(sql, params).fetchall())

    def batch(self, began: float, members: list[float], outcome: str = "succeeded") -> list[str]:
        """A 100 ms batch whose model began ``began`` s after T0, of requests that came
        ``members`` s after T0: their ids."""
        batch_id, ids = uuid.uuid4(), [uuid.uuid4() for _ in members]
        with psycopg.connect(self.dsn) as conn:
            conn.execute(
                "INSERT INTO batches (id, model, size, attempt, dispatched_at, started_at,"
                " finished_at, lease_expires_at, model_ms, outcome) VALUES (%s, 'echo', %s, 1,"
                " to_timestamp(%s), to_timestamp(%s), to_timestamp(%s), to_timestamp(%s), 100,"
                " %s)",
                (batch_id, len(members), T0 + began - 0.02, T0 + began - 0.01,
                 T0 + began + 0.1, T0 + began + 30, outcome),
            )  # fmt: skip
            for request_id, came in zip(ids, members, strict=True):
                conn.execute(
                    "INSERT INTO requests (id, tenant, model, lane, state, params,"
                    " est_prompt_tokens, max_tokens, deadline, attempts, failures, batch_id,"
                    " created_at) VALUES (%s, 't1', 'echo', 'interactive', 'succeeded', '{}', 1,"
                    " 4, to_timestamp(%s), 1, 0, %s, to_timestamp(%s))",
                    (request_id, T0 + came + 60, batch_id, T0 + came),
                )
        return [str(i) for i in ids]


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


def test_each_answer_is_timed_from_its_batchs_model_end(database_url: str) -> None:
    """Two batches' model ends (0.1 and 0.2 s after T0), three callers answered 2, 4 and 9 ms
    after theirs; a request whose batch crashed, and one the database does not hold, have no
    model end to time from."""
    db = _Database(database_url)
    first, second = db.batch(0.0, [-0.05, -0.04]), db.batch(0.1, [0.05])
    [crashed] = db.batch(0.2, [0.15], outcome="crashed")
    answered_at = {
        first[0]: T0 + 0.1 + 0.002,
        first[1]: T0 + 0.1 + 0.009,
        second[0]: T0 + 0.2 + 0.004,
        crashed: T0 + 0.3 + 0.05,
        str(uuid.uuid4()): T0,
    }
    found = answered_after_model(db, answered_at)  # type: ignore[arg-type]
    assert found is not None and found["of"] == 3
    assert found["p50_ms"] == pytest.approx(4.0, abs=0.01)
    assert found["mean_ms"] == pytest.approx(5.0, abs=0.01)
    assert answered_after_model(db, {}) is None  # type: ignore[arg-type]
