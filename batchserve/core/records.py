"""Mapping between table rows and the domain values the rest of batchserve sees."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

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
    return {
        "id": cmd.id,
        "tenant": cmd.tenant,
        "idempotency_key": cmd.idempotency_key,
        "fingerprint": cmd.fingerprint,
        "model": cmd.model,
        "lane": cmd.lane.value,
        "state": RequestState.QUEUED.value,
        "input": cmd.input,
        "messages": cmd.messages,
        "params": cmd.params,
        "metadata": cmd.metadata,
        "webhook_url": cmd.webhook_url,
        "est_prompt_tokens": cmd.prompt_tokens,
        "max_tokens": cmd.max_tokens,
        "deadline": cmd.deadline,
        "attempts": 0,
        "failures": 0,
        "created_at": cmd.created_at,
        "job_id": cmd.job_id,
        "custom_id": cmd.custom_id,
        "job_line": cmd.job_line,
    }


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


RECORD_COLUMNS = [
    requests_t.c[name]
    for name in (
        "id",
        "tenant",
        "model",
        "lane",
        "state",
        "created_at",
        "deadline",
        "attempts",
        "batch_id",
        "finished_at",
        "output",
        "finish_reason",
        "error_code",
        "error_message",
        "prompt_tokens",
        "completion_tokens",
        "queued_ms",
        "batch_wait_ms",
        "model_ms",
        "total_ms",
        "ttft_ms",
        "metadata",
        "idempotency_key",
        "fingerprint",
        "webhook_url",
    )
]

MESSAGE_COLUMNS = [
    requests_t.c[name]
    for name in (
        "id",
        "model",
        "lane",
        "tenant",
        "created_at",
        "deadline",
        "est_prompt_tokens",
        "max_tokens",
        "isolation_group",
    )
]


def _uuid(value: Any) -> uuid.UUID:
    return value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))
