"""Values of bulk jobs (the OpenAI Batch API): job statuses, files, counts, line errors, ids."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from batchserve.core.domain import RequestRecord

FILE_PREFIX = "file-"
JOB_PREFIX = "batch_"


class JobStatus(StrEnum):
    """A bulk job's status, named exactly as OpenAI's Batch object names them."""

    VALIDATING = "validating"
    FAILED = "failed"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    COMPLETED = "completed"
    EXPIRED = "expired"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"

    @property
    def terminal(self) -> bool:
        return self in ENDED_JOB_STATUSES


ENDED_JOB_STATUSES = frozenset(
    {JobStatus.FAILED, JobStatus.COMPLETED, JobStatus.EXPIRED, JobStatus.CANCELLED}
)


class FilePurpose(StrEnum):
    BATCH = "batch"  # uploaded: a batch input file
    BATCH_OUTPUT = "batch_output"  # generated: a job's output or error file


class Endpoint(StrEnum):
    """The endpoints a bulk job's lines may call."""

    CHAT = "/v1/chat/completions"
    COMPLETIONS = "/v1/completions"
    EMBEDDINGS = "/v1/embeddings"


def file_public_id(file_id: uuid.UUID) -> str:
    return FILE_PREFIX + file_id.hex


def job_public_id(job_id: uuid.UUID) -> str:
    return JOB_PREFIX + job_id.hex


def parse_public_id(value: str, prefix: str) -> uuid.UUID | None:
    """The UUID behind ``file-...`` or ``batch_...``; ``None`` if ``value`` is not one."""
    if not value.startswith(prefix):
        return None
    try:
        return uuid.UUID(hex=value[len(prefix) :])
    except ValueError:
        return None


@dataclass(frozen=True, slots=True)
class FileRecord:
    id: uuid.UUID
    tenant: str
    purpose: FilePurpose
    filename: str
    bytes: int
    created_at: datetime
    expires_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class LineError:
    """Why a batch input file was refused, OpenAI's way: a code, a message, the line (1-based)."""

    code: str
    message: str
    line: int | None = None
    param: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "line": self.line, "param": self.param}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LineError:
        return cls(
            code=str(data.get("code") or "invalid_request"),
            message=str(data.get("message") or ""),
            line=data.get("line"),
            param=data.get("param"),
        )


@dataclass(frozen=True, slots=True)
class JobCounts:
    """``completed``: requests that succeeded; ``failed``: those that ended any other way."""

    total: int = 0
    completed: int = 0
    failed: int = 0


@dataclass(frozen=True, slots=True)
class NewJob:
    """A bulk job as ``POST /v1/batches`` creates it, before its file is validated."""

    id: uuid.UUID
    tenant: str
    endpoint: Endpoint
    completion_window: str
    input_file_id: uuid.UUID
    created_at: datetime
    expires_at: datetime
    metadata: dict[str, str] | None = None
    webhook_url: str | None = None
    output_expires_after_s: int | None = None


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A bulk job as the API shows it."""

    id: uuid.UUID
    tenant: str
    status: JobStatus
    endpoint: str
    completion_window: str
    input_file_id: uuid.UUID
    output_file_id: uuid.UUID | None
    error_file_id: uuid.UUID | None
    model: str | None
    metadata: dict[str, str] | None
    webhook_url: str | None
    errors: tuple[LineError, ...]
    counts: JobCounts
    created_at: datetime
    expires_at: datetime
    in_progress_at: datetime | None = None
    finalizing_at: datetime | None = None
    completed_at: datetime | None = None
    failed_at: datetime | None = None
    expired_at: datetime | None = None
    cancelling_at: datetime | None = None
    cancelled_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class IngestClaim:
    """A validating job a driver leased: whoever holds ``token`` may ingest it."""

    job_id: uuid.UUID
    tenant: str
    token: uuid.UUID
    endpoint: Endpoint
    input_file_id: uuid.UUID
    ingested_lines: int
    expires_at: datetime
    published_lines: int = 0  # confirmed on the broker; up to ingested_lines, publish again


@dataclass(frozen=True, slots=True)
class JobLine:
    """A finished request of a job, with the line it came from: what output files are made of."""

    line: int
    custom_id: str | None
    record: RequestRecord


@dataclass(frozen=True, slots=True)
class RenderedFiles:
    """A job's output and error files (``None`` when it would be empty) and the counts in them."""

    output: bytes | None
    errors: bytes | None
    counts: JobCounts
