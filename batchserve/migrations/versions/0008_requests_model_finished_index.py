"""requests by model and finish time: the learned sequence time of an engine model

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        "ix_requests_model_finished",
        "requests",
        ["model", "finished_at"],
        unique=False,
        postgresql_where=sa.text("state = 'succeeded'"),
        sqlite_where=sa.text("state = 'succeeded'"),
    )


def downgrade() -> None:
    op.drop_index("ix_requests_model_finished", table_name="requests")
