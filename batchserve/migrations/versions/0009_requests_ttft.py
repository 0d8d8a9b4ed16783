"""requests.ttft_ms: a request's time to first token, from acceptance

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("ttft_ms", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("requests", "ttft_ms")
