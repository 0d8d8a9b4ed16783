"""batch_jobs.published_lines: how many of a job's lines are confirmed on the broker

A job's requests are written already marked published, and the job records how far the
confirmed publishing got (one row updated per chunk instead of every request): a driver that
takes over an ingest republishes the lines between ``published_lines`` and ``ingested_lines``.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("batch_jobs") as batch:
        batch.add_column(
            sa.Column("published_lines", sa.Integer(), nullable=False, server_default="0")
        )
    # Jobs ingested before: their requests were marked published one by one.
    op.execute("UPDATE batch_jobs SET published_lines = ingested_lines")


def downgrade() -> None:
    with op.batch_alter_table("batch_jobs") as batch:
        batch.drop_column("published_lines")
