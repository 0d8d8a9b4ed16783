"""OpenAI's File and Batch objects, and the body of ``POST /v1/batches``."""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from batchserve.api.schemas import MAX_METADATA_KEYS, MetaKey, MetaValue, WebhookUrl
from batchserve.core.bulk import Endpoint, FileRecord, JobRecord, file_public_id, job_public_id
from batchserve.core.domain import to_epoch
from batchserve.core.errors import InvalidInput
from batchserve.core.settings import Settings

WINDOW = re.compile(r"^(\d{1,7})(s|m|h|d)$")
UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86_400}
EXPIRES_MIN_S, EXPIRES_MAX_S = 3_600, 2_592_000  # OpenAI's bounds on expiry: an hour to 30 days


class ExpiresAfter(BaseModel):
    """OpenAI's ``expires_after``: a file expires ``seconds`` after its ``created_at``."""

    model_config = ConfigDict(extra="forbid")

    anchor: Literal["created_at"]
    seconds: Annotated[int, Field(ge=EXPIRES_MIN_S, le=EXPIRES_MAX_S)]


class CreateBatch(BaseModel):
    """``POST /v1/batches``. ``webhook_url`` is batchserve's own addition: a ``batch.*`` event
    is POSTed there when the job ends. Any other field is refused by name, none ignored."""

    model_config = ConfigDict(extra="forbid")

    input_file_id: Annotated[str, StringConstraints(min_length=1, max_length=64)]
    # Checked by the route, which names the choices; the document lists them.
    endpoint: str = Field(json_schema_extra={"enum": [e.value for e in Endpoint]})
    # Its choices depend on the settings: the document states them (openapi.py).
    completion_window: str
    metadata: Annotated[dict[MetaKey, MetaValue], Field(max_length=MAX_METADATA_KEYS)] | None = None
    webhook_url: WebhookUrl | None = None
    output_expires_after: ExpiresAfter | None = None


def window_s(window: str, settings: Settings) -> float:
    """Seconds in a completion window (``24h``); batchserve accepts the windows its settings
    allow, OpenAI only ``24h``."""
    match = WINDOW.match(window)
    seconds = int(match.group(1)) * UNIT_S[match.group(2)] if match else None
    lo, hi = settings.batch_min_window_s, settings.batch_max_window_s
    if seconds is None or not lo <= seconds <= hi:
        allowed = "'24h'" if lo == hi == 86_400 else f"from {lo:g} s to {hi:g} s, e.g. '24h'"
        raise InvalidInput(
            f"completion_window {window!r} is not supported: {allowed}",
            field="completion_window",
            limit={"min_s": lo, "max_s": hi},
        )
    return float(seconds)


def _ts(value: datetime | None) -> int | None:
    return None if value is None else int(to_epoch(value))


def openai_list(page: list[dict[str, Any]], has_more: bool) -> dict[str, Any]:
    """A page of objects in OpenAI's list shape: ``after`` takes its ``last_id``."""
    return {
        "object": "list",
        "data": page,
        "first_id": page[0]["id"] if page else None,
        "last_id": page[-1]["id"] if page else None,
        "has_more": has_more,
    }


def file_object(record: FileRecord) -> dict[str, Any]:
    return {
        "id": file_public_id(record.id),
        "object": "file",
        "bytes": record.bytes,
        "created_at": _ts(record.created_at),
        "filename": record.filename,
        "purpose": record.purpose.value,
        "status": "processed",
        "expires_at": _ts(record.expires_at),
        "status_details": None,
    }


def batch_object(job: JobRecord) -> dict[str, Any]:
    """A job exactly as OpenAI's Batch object shows one (plus ``webhook_url``)."""
    errors = None
    if job.errors:
        errors = {"object": "list", "data": [e.as_dict() for e in job.errors]}
    return {
        "id": job_public_id(job.id),
        "object": "batch",
        "endpoint": job.endpoint,
        "model": job.model,
        "errors": errors,
        "input_file_id": file_public_id(job.input_file_id),
        "completion_window": job.completion_window,
        "status": job.status.value,
        "output_file_id": file_public_id(job.output_file_id) if job.output_file_id else None,
        "error_file_id": file_public_id(job.error_file_id) if job.error_file_id else None,
        "created_at": _ts(job.created_at),
        "in_progress_at": _ts(job.in_progress_at),
        "expires_at": _ts(job.expires_at),
        "finalizing_at": _ts(job.finalizing_at),
        "completed_at": _ts(job.completed_at),
        "failed_at": _ts(job.failed_at),
        "expired_at": _ts(job.expired_at),
        "cancelling_at": _ts(job.cancelling_at),
        "cancelled_at": _ts(job.cancelled_at),
        "request_counts": {
            "total": job.counts.total,
            "completed": job.counts.completed,
            "failed": job.counts.failed,
        },
        "metadata": job.metadata,
        "webhook_url": job.webhook_url,
    }


def window_spellings(seconds: float) -> list[str]:
    """Every way to write a window of exactly ``seconds`` (``24h``, ``1d``, ``1440m``, ...)."""
    whole = int(seconds)
    if whole != seconds:
        return []
    return [
        f"{whole // size}{unit}"
        for unit, size in sorted(UNIT_S.items(), key=lambda item: -item[1])
        if whole % size == 0 and len(str(whole // size)) <= 7
    ]
