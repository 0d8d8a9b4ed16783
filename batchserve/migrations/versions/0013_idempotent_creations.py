"""idempotent_creations: the Idempotency-Key of each file and batch job created with one

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "idempotent_creations",
        sa.Column("tenant", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("key", sa.String(255), nullable=False),
        sa.Column("fingerprint", sa.String(64), nullable=False),
        sa.Column("object_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("tenant", "kind", "key", name="pk_idempotent_creations"),
    )
    op.create_index("ix_idempotent_creations_created_at", "idempotent_creations", ["created_at"])


def downgrade() -> None:
    op.drop_index("ix_idempotent_creations_created_at", table_name="idempotent_creations")
    op.drop_table("idempotent_creations")
