"""initial schema: requests and batches

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy import text as sa_text
from sqlalchemy.dialects import postgresql

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "batches",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker", sa.String(length=255), nullable=True),
        sa.Column("isolation_group", sa.String(length=80), nullable=True),
        sa.Column("estimated_ms", sa.Float(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("max_new_tokens", sa.Integer(), nullable=True),
        sa.Column("generated_tokens", sa.Integer(), nullable=True),
        sa.Column("model_ms", sa.Float(), nullable=True),
        sa.Column("dispatched_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_batches")),
    )
    op.create_index(
        "ix_batches_model_dispatched_at", "batches", ["model", "dispatched_at"], unique=False
    )
    op.create_index(
        "ix_batches_open_lease",
        "batches",
        ["lease_expires_at"],
        unique=False,
        postgresql_where=sa_text("outcome IS NULL"),
        sqlite_where=sa_text("outcome IS NULL"),
    )
    op.create_table(
        "requests",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant", sa.String(length=64), nullable=False),
        sa.Column("idempotency_key", sa.String(length=255), nullable=True),
        sa.Column("fingerprint", sa.String(length=64), nullable=True),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("lane", sa.String(length=16), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("input", sa.Text(), nullable=True),
        sa.Column(
            "messages",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column(
            "params",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("webhook_url", sa.Text(), nullable=True),
        sa.Column("est_prompt_tokens", sa.Integer(), nullable=False),
        sa.Column("max_tokens", sa.Integer(), nullable=False),
        sa.Column("deadline", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("failures", sa.Integer(), nullable=False),
        sa.Column("batch_id", sa.Uuid(), nullable=True),
        sa.Column("isolation_group", sa.String(length=80), nullable=True),
        sa.Column("output", sa.Text(), nullable=True),
        sa.Column("finish_reason", sa.String(length=32), nullable=True),
        sa.Column("error_code", sa.String(length=64), nullable=True),
        sa.Column("error_message", sa.Text(), nullable=True),
        sa.Column("prompt_tokens", sa.Integer(), nullable=True),
        sa.Column("completion_tokens", sa.Integer(), nullable=True),
        sa.Column("queued_ms", sa.Float(), nullable=True),
        sa.Column("batch_wait_ms", sa.Float(), nullable=True),
        sa.Column("model_ms", sa.Float(), nullable=True),
        sa.Column("total_ms", sa.Float(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("published_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("lane IN ('interactive','bulk')", name=op.f("ck_requests_lane")),
        sa.CheckConstraint(
            "state IN ('queued','running','succeeded','failed','cancelled','expired')",
            name=op.f("ck_requests_state"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_requests")),
        sa.UniqueConstraint(
            "tenant", "idempotency_key", name=op.f("uq_requests_tenant_idempotency_key")
        ),
    )
    op.create_index("ix_requests_batch_id", "requests", ["batch_id"], unique=False)
    op.create_index("ix_requests_state_deadline", "requests", ["state", "deadline"], unique=False)
    op.create_index("ix_requests_tenant_id", "requests", ["tenant", "id"], unique=False)
    op.create_index(
        "ix_requests_unpublished",
        "requests",
        ["created_at"],
        unique=False,
        postgresql_where=sa_text("published_at IS NULL AND state = 'queued'"),
        sqlite_where=sa_text("published_at IS NULL AND state = 'queued'"),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_requests_unpublished",
        table_name="requests",
        postgresql_where=sa_text("published_at IS NULL AND state = 'queued'"),
        sqlite_where=sa_text("published_at IS NULL AND state = 'queued'"),
    )
    op.drop_index("ix_requests_tenant_id", table_name="requests")
    op.drop_index("ix_requests_state_deadline", table_name="requests")
    op.drop_index("ix_requests_batch_id", table_name="requests")
    op.drop_table("requests")
    op.drop_index(
        "ix_batches_open_lease",
        table_name="batches",
        postgresql_where=sa_text("outcome IS NULL"),
        sqlite_where=sa_text("outcome IS NULL"),
    )
    op.drop_index("ix_batches_model_dispatched_at", table_name="batches")
    op.drop_table("batches")
