"""The ``batchserve`` command."""
