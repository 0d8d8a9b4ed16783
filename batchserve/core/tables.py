"""ORM tables. Only the job store writes them."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any, cast

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    Uuid,
)
from sqlalchemy import text as sa_text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

JSONType = JSON().with_variant(JSONB(), "postgresql")

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

REQUEST_STATES = "'queued','running','succeeded','failed','cancelled','expired'"


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)


def _ts(nullable: bool = True) -> Any:
    return mapped_column(DateTime(timezone=True), nullable=nullable)


class Request(Base):
    """One client request, from admission to its single terminal state."""

    __tablename__ = "requests"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    idempotency_key: Mapped[str | None] = mapped_column(String(255))
    fingerprint: Mapped[str | None] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(128))
    lane: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))
    input: Mapped[str | None] = mapped_column(Text)
    messages: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    params: Mapped[dict[str, Any]] = mapped_column(JSONType)
    request_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSONType)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    # Admission's estimate of the work: prompt tokens and the most it may generate.
    est_prompt_tokens: Mapped[int] = mapped_column(Integer)
    max_tokens: Mapped[int] = mapped_column(Integer)
    deadline: Mapped[datetime] = _ts(nullable=False)
    # Dispatches so far; failures charged to this request (the attempt budget counts these).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    # Requests requeued after a crash only share batches within their group, so a culprit
    # can be cornered by halving.
    isolation_group: Mapped[str | None] = mapped_column(String(80))
    output: Mapped[str | None] = mapped_column(Text)
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    completion_tokens: Mapped[int | None] = mapped_column(Integer)
    queued_ms: Mapped[float | None] = mapped_column(Float)
    batch_wait_ms: Mapped[float | None] = mapped_column(Float)
    model_ms: Mapped[float | None] = mapped_column(Float)
    total_ms: Mapped[float | None] = mapped_column(Float)
    # From acceptance until the first token was made (a batch model: its whole answer).
    ttft_ms: Mapped[float | None] = mapped_column(Float)
    created_at: Mapped[datetime] = _ts(nullable=False)
    published_at: Mapped[datetime | None] = _ts()
    finished_at: Mapped[datetime | None] = _ts()
    # A request of a bulk job: the job, the caller's custom_id, and its line in the input file.
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    custom_id: Mapped[str | None] = mapped_column(String(512))
    job_line: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        UniqueConstraint("tenant", "idempotency_key"),
        CheckConstraint(f"state IN ({REQUEST_STATES})", name="state"),
        CheckConstraint("lane IN ('interactive','bulk')", name="lane"),
        Index("ix_requests_tenant_id", "tenant", "id"),
        Index("ix_requests_state_deadline", "state", "deadline"),
        Index("ix_requests_batch_id", "batch_id"),
        # Progress counts and "is every request of the job finished?" read only this index.
        Index(
            "ix_requests_job_id_state",
            "job_id",
            "state",
            postgresql_where=sa_text("job_id IS NOT NULL"),
            sqlite_where=sa_text("job_id IS NOT NULL"),
        ),
        # The learned sequence time of an engine model reads its latest finished requests.
        Index(
            "ix_requests_model_finished",
            "model",
            "finished_at",
            postgresql_where=sa_text("state = 'succeeded'"),
            sqlite_where=sa_text("state = 'succeeded'"),
        ),
        # Finished requests by age: the retention prune reads only this index.
        Index(
            "ix_requests_finished_at",
            "finished_at",
            postgresql_where=sa_text("finished_at IS NOT NULL"),
            sqlite_where=sa_text("finished_at IS NOT NULL"),
        ),
        Index(
            "ix_requests_unpublished",
            "created_at",
            postgresql_where=sa_text("published_at IS NULL AND state = 'queued'"),
            sqlite_where=sa_text("published_at IS NULL AND state = 'queued'"),
        ),
    )


class Batch(Base):
    """One dispatch of a group of requests to a worker."""

    __tablename__ = "batches"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    model: Mapped[str] = mapped_column(String(128))
    size: Mapped[int] = mapped_column(Integer)
    # Times a worker started this batch; a second start means the first one died.
    attempt: Mapped[int] = mapped_column(Integer, default=0)
    worker: Mapped[str | None] = mapped_column(String(255))
    isolation_group: Mapped[str | None] = mapped_column(String(80))
    estimated_ms: Mapped[float | None] = mapped_column(Float)
    prompt_tokens: Mapped[int | None] = mapped_column(Integer)
    max_new_tokens: Mapped[int | None] = mapped_column(Integer)
    generated_tokens: Mapped[int | None] = mapped_column(Integer)
    model_ms: Mapped[float | None] = mapped_column(Float)
    dispatched_at: Mapped[datetime] = _ts(nullable=False)
    started_at: Mapped[datetime | None] = _ts()
    finished_at: Mapped[datetime | None] = _ts()
    lease_expires_at: Mapped[datetime] = _ts(nullable=False)
    outcome: Mapped[str | None] = mapped_column(String(16))

    __table_args__ = (
        Index("ix_batches_model_dispatched_at", "model", "dispatched_at"),
        Index("ix_batches_worker_started_at", "worker", "started_at"),  # crash attribution
        Index(
            "ix_batches_open_lease",
            "lease_expires_at",
            postgresql_where=sa_text("outcome IS NULL"),
            sqlite_where=sa_text("outcome IS NULL"),
        ),
    )


class RequestEvent(Base):
    """Every terminal transition, appended in the transaction that makes it.

    A request has exactly one row here in a correct world; the chaos suite counts them to prove
    that nothing was answered twice. It is also the request's audit trail.
    """

    __tablename__ = "request_events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    request_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    state: Mapped[str] = mapped_column(String(16))
    batch_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    at: Mapped[datetime] = _ts(nullable=False)

    __table_args__ = (Index("ix_request_events_request_id", "request_id"),)


DELIVERY_STATUSES = "'pending','delivered','failed'"


class WebhookDelivery(Base):
    """One event to one webhook URL: the outbox row, written with the terminal transition.

    ``id`` is the ``webhook-id`` the receiver sees, the same on every attempt. A relay claims due
    rows under a lease; whoever holds ``lease_token`` may send, so a duplicate task or a worker
    that died mid-send never leaves a row stuck or sent twice by two live holders.
    """

    __tablename__ = "webhook_deliveries"

    id: Mapped[str] = mapped_column(String(40), primary_key=True)
    # The subject: a request, or (for ``batch.*`` events) a bulk job.
    request_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    tenant: Mapped[str] = mapped_column(String(64))
    url: Mapped[str] = mapped_column(Text)
    event_type: Mapped[str] = mapped_column(String(32))
    status: Mapped[str] = mapped_column(String(16))
    # Attempts ever made, and those in the current run of the retry schedule (a redelivery
    # starts a new run).
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    run_attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime | None] = _ts()
    lease_token: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    lease_expires_at: Mapped[datetime | None] = _ts()
    created_at: Mapped[datetime] = _ts(nullable=False)
    finished_at: Mapped[datetime | None] = _ts()
    # Why a failed delivery failed (attempts spent, 410, endpoint disabled, URL refused).
    error: Mapped[str | None] = mapped_column(Text)

    __table_args__ = (
        CheckConstraint(f"status IN ({DELIVERY_STATUSES})", name="status"),
        Index("ix_webhook_deliveries_request_id", "request_id"),
        Index("ix_webhook_deliveries_job_id", "job_id"),
        Index(
            "ix_webhook_deliveries_due",
            "next_attempt_at",
            postgresql_where=sa_text("status = 'pending'"),
            sqlite_where=sa_text("status = 'pending'"),
        ),
    )


class WebhookAttempt(Base):
    """One HTTP attempt of a delivery: when, what came back, how long it took."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    delivery_id: Mapped[str] = mapped_column(String(40))
    number: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = _ts(nullable=False)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float | None] = mapped_column(Float)
    # The address actually connected to, after the SSRF check.
    address: Mapped[str | None] = mapped_column(String(64))

    __table_args__ = (Index("ix_webhook_attempts_delivery_id", "delivery_id", "number"),)


class WebhookSecret(Base):
    """A tenant's signing secret, encrypted at rest, and the one it replaced (during the grace)."""

    __tablename__ = "webhook_secrets"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    secret_enc: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = _ts(nullable=False)
    previous_enc: Mapped[str | None] = mapped_column(Text)
    previous_expires_at: Mapped[datetime | None] = _ts()


class WebhookEndpoint(Base):
    """A (tenant, URL) that answered 410 Gone: nothing is sent to it until it is re-enabled."""

    __tablename__ = "webhook_endpoints"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    # URLs can be long; the key is their SHA-256 (hex).
    url_sha256: Mapped[str] = mapped_column(String(64), primary_key=True)
    url: Mapped[str] = mapped_column(Text)
    disabled_at: Mapped[datetime | None] = _ts()
    disabled_reason: Mapped[str | None] = mapped_column(Text)


FILE_PURPOSES = "'batch','batch_output'"


class File(Base):
    """An uploaded batch input file, or a job's generated output or error file."""

    __tablename__ = "files"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    purpose: Mapped[str] = mapped_column(String(32))
    filename: Mapped[str] = mapped_column(String(255))
    size_bytes: Mapped[int] = mapped_column("bytes", BigInteger)
    # The whole file: Postgres bytea (TOASTed, compressed), bounded by BATCHSERVE_MAX_FILE_BYTES.
    content: Mapped[bytes] = mapped_column(LargeBinary)
    created_at: Mapped[datetime] = _ts(nullable=False)
    # OpenAI's expires_after: hidden from then on, deleted by maintenance. Null: never.
    expires_at: Mapped[datetime | None] = _ts()

    __table_args__ = (
        CheckConstraint(f"purpose IN ({FILE_PURPOSES})", name="purpose"),
        Index("ix_files_tenant_id", "tenant", "id"),
        Index(
            "ix_files_expires_at",
            "expires_at",
            postgresql_where=sa_text("expires_at IS NOT NULL"),
            sqlite_where=sa_text("expires_at IS NOT NULL"),
        ),
    )


JOB_STATUSES = (
    "'validating','failed','in_progress','finalizing','completed','expired','cancelling',"
    "'cancelled'"
)

ACTIVE_JOBS = "status IN ('validating','in_progress','finalizing','cancelling')"


class BatchJob(Base):
    """A bulk job in the OpenAI Batch format: its input file, window, status and timestamps.

    ``total``, ``completed`` and ``failed`` are frozen when the job ends; until then they are
    counted from its requests. Ingest is leased (``lease_token``), and ``ingested_lines`` says how
    far it got, so a driver that dies mid-ingest is taken over where it stopped;
    ``published_lines``, how many of those are confirmed on the broker (the rest are published
    again by whoever takes over).
    """

    __tablename__ = "batch_jobs"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16))
    endpoint: Mapped[str] = mapped_column(String(64))
    completion_window: Mapped[str] = mapped_column(String(16))
    input_file_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    output_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    error_file_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    model: Mapped[str | None] = mapped_column(String(128))
    job_metadata: Mapped[dict[str, str] | None] = mapped_column("metadata", JSONType)
    webhook_url: Mapped[str | None] = mapped_column(Text)
    errors: Mapped[list[dict[str, Any]] | None] = mapped_column(JSONType)
    total: Mapped[int] = mapped_column(Integer, default=0)
    completed: Mapped[int] = mapped_column(Integer, default=0)
    failed: Mapped[int] = mapped_column(Integer, default=0)
    ingested_lines: Mapped[int] = mapped_column(Integer, default=0)
    published_lines: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    lease_token: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    lease_expires_at: Mapped[datetime | None] = _ts()
    created_at: Mapped[datetime] = _ts(nullable=False)
    expires_at: Mapped[datetime] = _ts(nullable=False)
    in_progress_at: Mapped[datetime | None] = _ts()
    finalizing_at: Mapped[datetime | None] = _ts()
    completed_at: Mapped[datetime | None] = _ts()
    failed_at: Mapped[datetime | None] = _ts()
    expired_at: Mapped[datetime | None] = _ts()
    cancelling_at: Mapped[datetime | None] = _ts()
    cancelled_at: Mapped[datetime | None] = _ts()
    # OpenAI's output_expires_after: the output and error files expire this long after they
    # are written. Null: never.
    output_expires_after_s: Mapped[int | None] = mapped_column(Integer)

    __table_args__ = (
        CheckConstraint(f"status IN ({JOB_STATUSES})", name="status"),
        Index("ix_batch_jobs_tenant_id", "tenant", "id"),
        Index(
            "ix_batch_jobs_active",
            "status",
            "expires_at",
            postgresql_where=sa_text(ACTIVE_JOBS),
            sqlite_where=sa_text(ACTIVE_JOBS),
        ),
    )


# Typed handles for Core statements (the declarative classes type ``__table__`` loosely).
class Tenant(Base):
    """A caller of the API: its fair-share weight and its quotas (NULL: the deployment default)."""

    __tablename__ = "tenants"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    weight: Mapped[float] = mapped_column(Float, default=1.0)
    max_queued: Mapped[int | None] = mapped_column(Integer)
    rate_per_s: Mapped[float | None] = mapped_column(Float)
    burst: Mapped[int | None] = mapped_column(Integer)
    max_bulk_in_flight: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = _ts(nullable=False)

    __table_args__ = (CheckConstraint("weight > 0", name="weight"),)


class ApiKey(Base):
    """An API key: its public id and the SHA-256 of the whole key, never the key itself."""

    __tablename__ = "api_keys"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64))
    key_sha256: Mapped[str] = mapped_column(String(64))
    name: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = _ts(nullable=False)
    revoked_at: Mapped[datetime | None] = _ts()

    __table_args__ = (Index("ix_api_keys_tenant", "tenant"),)


class IdempotentCreation(Base):
    """The Idempotency-Key of a file or batch job created with one: a retry gets that object."""

    __tablename__ = "idempotent_creations"

    tenant: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(16), primary_key=True)  # file, batch
    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(64))
    object_id: Mapped[uuid.UUID] = mapped_column(Uuid)
    created_at: Mapped[datetime] = _ts(nullable=False)

    __table_args__ = (Index("ix_idempotent_creations_created_at", "created_at"),)


requests_table = cast(Table, Request.__table__)
batches_table = cast(Table, Batch.__table__)
events_table = cast(Table, RequestEvent.__table__)
deliveries_table = cast(Table, WebhookDelivery.__table__)
attempts_table = cast(Table, WebhookAttempt.__table__)
secrets_table = cast(Table, WebhookSecret.__table__)
endpoints_table = cast(Table, WebhookEndpoint.__table__)
files_table = cast(Table, File.__table__)
jobs_table = cast(Table, BatchJob.__table__)
tenants_table = cast(Table, Tenant.__table__)
keys_table = cast(Table, ApiKey.__table__)
creations_table = cast(Table, IdempotentCreation.__table__)
