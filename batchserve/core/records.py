"""Mapping between table rows and the domain values the rest of batchserve sees."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from dataclasses import fields
from datetime import UTC, datetime
from enum import Enum
from typing import Any

import orjson
from psycopg.types.json import Jsonb
from sqlalchemy import JSON, BigInteger, Column, DateTime, Float, Integer, String, Uuid

from batchserve.core.domain import (
    Lane,
    QueueMessage,
    RequestRecord,
    RequestState,
    SubmitCommand,
    Timings,
    to_epoch,
)
from batchserve.core.tables import requests_table

requests_t = requests_table


def aware(value: datetime | None) -> datetime | None:
    """SQLite returns naive datetimes; everything batchserve stores is UTC."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def command_row(cmd: SubmitCommand) -> dict[str, Any]:
    """The request row admission writes for ``cmd``: its columns are :data:`COMMAND_COLUMNS`."""
    row = {column: _stored(getattr(cmd, name)) for name, column in _COMMAND_FIELDS}
    row.update(_ADMITTED)
    return row


def _stored(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


def command_message(cmd: SubmitCommand) -> QueueMessage:
    return QueueMessage(
        id=str(cmd.id),
        model=cmd.model,
        lane=cmd.lane,
        tenant=cmd.tenant,
        created_at=to_epoch(cmd.created_at),
        deadline=to_epoch(cmd.deadline),
        prompt_tokens=cmd.prompt_tokens,
        max_tokens=cmd.max_tokens,
    )


def row_message(row: Mapping[Any, Any]) -> QueueMessage:
    return QueueMessage(
        id=str(row["id"]),
        model=row["model"],
        lane=Lane(row["lane"]),
        tenant=row["tenant"],
        created_at=to_epoch(row["created_at"]),
        deadline=to_epoch(row["deadline"]),
        prompt_tokens=row["est_prompt_tokens"],
        max_tokens=row["max_tokens"],
        group=row["isolation_group"],
    )


def row_record(row: Mapping[Any, Any]) -> RequestRecord:
    timings = None
    if row["total_ms"] is not None:
        timings = Timings(
            queued_ms=row["queued_ms"] or 0.0,
            batch_wait_ms=row["batch_wait_ms"] or 0.0,
            model_ms=row["model_ms"] or 0.0,
            total_ms=row["total_ms"],
            ttft_ms=row["ttft_ms"],
        )
    created_at = aware(row["created_at"])
    deadline = aware(row["deadline"])
    assert created_at is not None and deadline is not None
    return RequestRecord(
        id=_uuid(row["id"]),
        tenant=row["tenant"],
        model=row["model"],
        lane=Lane(row["lane"]),
        state=RequestState(row["state"]),
        created_at=created_at,
        deadline=deadline,
        attempts=row["attempts"],
        batch_id=_uuid(row["batch_id"]) if row["batch_id"] else None,
        finished_at=aware(row["finished_at"]),
        output=row["output"],
        finish_reason=row["finish_reason"],
        error_code=row["error_code"],
        error_message=row["error_message"],
        prompt_tokens=row["prompt_tokens"],
        completion_tokens=row["completion_tokens"],
        timings=timings,
        metadata=row["metadata"],
        idempotency_key=row["idempotency_key"],
        fingerprint=row["fingerprint"],
        webhook_url=row["webhook_url"],
    )


# The column lists below are read off the domain values' fields, which are named as the
# columns they are stored in but for these renames.
_COMMAND_RENAMED = {"prompt_tokens": "est_prompt_tokens"}
_MESSAGE_RENAMED = {"prompt_tokens": "est_prompt_tokens", "group": "isolation_group"}
# What admission sets itself, besides the command's fields.
_ADMITTED: dict[str, Any] = {"state": RequestState.QUEUED.value, "attempts": 0, "failures": 0}


def _columns(value: type[Any], renamed: Mapping[str, str], skip: str = "") -> list[Column[Any]]:
    """The ``requests`` columns of a dataclass's fields (a field without one fails here)."""
    return [requests_t.c[renamed.get(f.name, f.name)] for f in fields(value) if f.name != skip]


_COMMAND_FIELDS = [
    (f.name, str(column.name))  # plain str: rows go to JSON, whose keys must be str
    for f, column in zip(
        fields(SubmitCommand), _columns(SubmitCommand, _COMMAND_RENAMED), strict=True
    )
]
# What admission writes (``command_row``'s keys).
COMMAND_COLUMNS = [column for _, column in _COMMAND_FIELDS] + list(_ADMITTED)
# What a RequestRecord is read from.
RECORD_COLUMNS = _columns(RequestRecord, {}, skip="timings") + _columns(Timings, {})
# What a QueueMessage is read from, its id first (``joined`` is the API's word, never stored).
MESSAGE_COLUMNS = _columns(QueueMessage, _MESSAGE_RENAMED, skip="joined")
JSON_COLUMNS = frozenset(c.name for c in requests_t.c if isinstance(c.type, JSON))


def pg_type(column: Column[Any]) -> str:
    """The Postgres type a hand-written statement casts ``column``'s values to."""
    kind = column.type
    for sql_type, name in _PG_TYPES:
        if isinstance(kind, sql_type):
            return name
    raise TypeError(f"no Postgres type for {column.name} ({kind})")


_PG_TYPES: list[tuple[type[Any], str]] = [
    (Uuid, "uuid"),
    (String, "text"),  # Text too
    (JSON, "jsonb"),
    (BigInteger, "bigint"),
    (Integer, "int"),
    (Float, "float8"),
    (DateTime, "timestamptz"),
]


def rows_document(rows: Sequence[Mapping[str, Any]]) -> str:
    """Rows as the one JSON array parameter a hand-written statement reads with
    :func:`rows_from`: orjson writes it in C, where an array parameter per column goes through
    psycopg's Python array dumpers (``scripts/bench_statements.py --encodings``). A JSON
    ``null`` is SQL ``NULL``; timestamps are RFC 3339 with their offset (a naive one is UTC)."""
    return orjson.dumps(rows, option=orjson.OPT_NAIVE_UTC).decode()


def rows_from(param: str, columns: Sequence[tuple[str, str]], alias: str) -> str:
    """The typed rows of a :func:`rows_document` parameter written as ``param`` (SQLAlchemy's
    ``:name`` or psycopg's ``%(name)s``), for a ``FROM``: ``columns`` are (name, Postgres type)."""
    typed = ", ".join(f"{name} {kind}" for name, kind in columns)
    return f"jsonb_to_recordset(CAST({param} AS jsonb)) AS {alias}({typed})"


def pg_value(column: str, value: Any) -> Any:
    """``value`` as psycopg sends it for ``column`` of ``requests`` (JSON wrapped as jsonb)."""
    if value is not None and column in JSON_COLUMNS:
        return Jsonb(value)
    return value


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
