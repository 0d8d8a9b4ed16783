"""The hand-written Postgres statements of the job store name the columns their rows carry."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from batchserve.core.domain import ItemResult, Lane, SubmitCommand, Timings
from batchserve.core.records import JSON_COLUMNS, command_row
from batchserve.core.store import ItemOutcome
from batchserve.core.store.batches import _RESULT_COLUMNS, RESULT_FIELDS, result_row
from batchserve.core.store.requests import _INSERT_COLUMNS
from batchserve.core.tables import requests_table

TIMINGS = Timings(1.0, 1.0, 100.0, 102.0, ttft_ms=101.0)


def test_admission_insert_writes_every_column_of_a_command_row() -> None:
    now = datetime.now(UTC)
    command = SubmitCommand(
        id=uuid.uuid4(),
        tenant="t",
        model="m",
        lane=Lane.INTERACTIVE,
        input="hello",
        messages=None,
        params={"max_tokens": 4},
        created_at=now,
        deadline=now,
        prompt_tokens=1,
        max_tokens=4,
    )
    assert [name for name, _ in _INSERT_COLUMNS] == list(command_row(command))


def test_result_write_sets_every_column_of_a_result_row() -> None:
    outcome = ItemOutcome(ItemResult("00000000-0000-0000-0000-000000000001", output="x"), TIMINGS)
    row = result_row(outcome, datetime.now(UTC))
    assert list(row) == [f"b_{name}" for name, _ in _RESULT_COLUMNS]
    assert [name for name, _ in _RESULT_COLUMNS] == ["id", *RESULT_FIELDS]


def test_hand_written_statements_cast_to_the_types_of_the_table() -> None:
    by_column = {name: kind for name, kind in _INSERT_COLUMNS + _RESULT_COLUMNS}
    assert by_column["id"] == "uuid" and by_column["params"] == "jsonb"
    assert by_column["deadline"] == by_column["finished_at"] == "timestamptz"
    assert by_column["max_tokens"] == "int" and by_column["model_ms"] == "float8"
    assert by_column["tenant"] == by_column["output"] == "text"
    assert {c.name for c in requests_table.c if by_column.get(c.name) == "jsonb"} == JSON_COLUMNS
