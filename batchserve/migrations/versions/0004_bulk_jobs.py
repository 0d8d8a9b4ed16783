"""bulk jobs: files, batch jobs, the job columns of requests, job webhooks

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text as sa_text
from sqlalchemy.dialects import postgresql

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")
ACTIVE_JOBS = "status IN ('validating','in_progress','finalizing','cancelling')"
JOB_STATUSES = (
    "status IN ('validating','failed','in_progress','finalizing','completed','expired',"
    "'cancelling','cancelled')"
)


def upgrade() -> None:
    op.create_table(
        "batch_jobs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("endpoint", sa.String(length=64), nullable=False),
        sa.Column("completion_window", sa.String(length=16), nullable=False),
        sa.Column("input_file_id", sa.Uuid(), nullable=False),
        sa.Column("output_file_id", sa.Uuid(), nullable=True),
        sa.Column("error_file_id", sa.Uuid(), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=True),
        sa.Column("metadata", JSON, nullable=True),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("errors", JSON, nullable=True),
        sa.Column("total", sa.Integer(), nullable=False),
        sa.Column("completed", sa.Integer(), nullable=False),
        sa.Column("failed", sa.Integer(), nullable=False),
        sa.Column("ingested_lines", sa.Integer(), nullable=False),
        sa.Column("lease_token", sa.Uuid(), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("in_progress_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finalizing_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("expired_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelling_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancelled_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(JOB_STATUSES, name=op.f("ck_batch_jobs_status")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batch_jobs")),
    )
    op.create_index(
        "ix_batch_jobs_active",
        "batch_jobs",
        ["status", "expires_at"],
        unique=False,
        postgresql_where=sa_text(ACTIVE_JOBS),
        sqlite_where=sa_text(ACTIVE_JOBS),
    )
    op.create_index("ix_batch_jobs_tenant_id", "batch_jobs", ["tenant", "id"], unique=False)
    op.create_table(
        "files",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("purpose", sa.String(length=32), nullable=False),
        sa.Column("filename", sa.String(length=255), nullable=False),
        sa.Column("bytes", sa.BigInteger(), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint("purpose IN ('batch','batch_output')", name=op.f("ck_files_purpose")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_files")),
    )
    op.create_index("ix_files_tenant_id", "files", ["tenant", "id"], unique=False)
    op.add_column("requests", sa.Column("job_id", sa.Uuid(), nullable=True))
    op.add_column("requests", sa.Column("custom_id", sa.String(length=512), nullable=True))
    op.add_column("requests", sa.Column("job_line", sa.Integer(), nullable=True))
    op.create_index(
        "ix_requests_job_id_state",
        "requests",
        ["job_id", "state"],
        unique=False,
        postgresql_where=sa_text("job_id IS NOT NULL"),
        sqlite_where=sa_text("job_id IS NOT NULL"),
    )
    # A delivery's subject is a request or (batch.* events) a job. SQLite alters by copying.
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.add_column(sa.Column("job_id", sa.Uuid(), nullable=True))
        batch.alter_column("request_id", existing_type=sa.Uuid(), nullable=True)
    op.create_index("ix_webhook_deliveries_job_id", "webhook_deliveries", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index("ix_webhook_deliveries_job_id", table_name="webhook_deliveries")
    op.execute("DELETE FROM webhook_deliveries WHERE request_id IS NULL")
    with op.batch_alter_table("webhook_deliveries") as batch:
        batch.alter_column("request_id", existing_type=sa.Uuid(), nullable=False)
        batch.drop_column("job_id")
    op.drop_index(
        "ix_requests_job_id_state",
        table_name="requests",
        postgresql_where=sa_text("job_id IS NOT NULL"),
        sqlite_where=sa_text("job_id IS NOT NULL"),
    )
    op.drop_column("requests", "job_line")
    op.drop_column("requests", "custom_id")
    op.drop_column("requests", "job_id")
    op.drop_index("ix_files_tenant_id", table_name="files")
    op.drop_table("files")
    op.drop_index("ix_batch_jobs_tenant_id", table_name="batch_jobs")
    op.drop_index(
        "ix_batch_jobs_active",
        table_name="batch_jobs",
        postgresql_where=sa_text(ACTIVE_JOBS),
        sqlite_where=sa_text(ACTIVE_JOBS),
    )
    op.drop_table("batch_jobs")
