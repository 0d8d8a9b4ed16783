"""batch_jobs.output_expires_after_s: OpenAI's output_expires_after, for the files a job writes

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("batch_jobs", sa.Column("output_expires_after_s", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("batch_jobs", "output_expires_after_s")
