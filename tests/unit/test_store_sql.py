"""The hand-written Postgres statements of the job store name the columns their rows carry."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from batchserve.core.domain import Lane, SubmitCommand
from batchserve.core.records import command_row
from batchserve.core.store.requests import _UNNEST_INSERT_COLUMNS


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
    assert [name for name, _ in _UNNEST_INSERT_COLUMNS] == list(command_row(command))
