"""batches by worker and start: which batch a dead worker was running

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_batches_worker_started_at", "batches", ["worker", "started_at"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_batches_worker_started_at", table_name="batches")
