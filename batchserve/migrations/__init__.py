"""Alembic migrations; ``batchserve migrate`` runs them."""
