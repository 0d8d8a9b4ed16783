"""The job store: the only code that changes request and batch state.

Every write is conditional on the current state, and every result write on the batch that
carries it, so a late, stale or duplicate attempt can never complete a request twice or revive
one that was cancelled or expired. After each commit the store reports what changed through
``on_change`` (long-polls wake on it, the batcher frees slots on it).
"""

from __future__ import annotations

from batchserve.core.store.base import (
    Admission,
    BatchStart,
    ClaimedRequest,
    ExpiredLease,
    ItemOutcome,
    OnChange,
    Reaped,
    advisory_key,
)
from batchserve.core.store.batches import BatchVerbs
from batchserve.core.store.due import Due, DueVerbs
from batchserve.core.store.files import FileVerbs
from batchserve.core.store.ingest import IngestVerbs
from batchserve.core.store.requests import RequestVerbs
from batchserve.core.store.secrets import SecretRow, SecretVerbs
from batchserve.core.store.settle import ActiveJob, Render, SettleVerbs
from batchserve.core.store.tenants import KeyRow, TenantRow, TenantVerbs
from batchserve.core.store.webhooks import WebhookVerbs


class JobStore(
    RequestVerbs,
    BatchVerbs,
    WebhookVerbs,
    SecretVerbs,
    FileVerbs,
    IngestVerbs,
    SettleVerbs,
    TenantVerbs,
    DueVerbs,
):
    """State changes of requests, batches, webhook deliveries, files and bulk jobs, on Postgres
    or SQLite."""


__all__ = [
    "ActiveJob",
    "Admission",
    "BatchStart",
    "ClaimedRequest",
    "Due",
    "ExpiredLease",
    "ItemOutcome",
    "JobStore",
    "KeyRow",
    "OnChange",
    "Reaped",
    "Render",
    "SecretRow",
    "TenantRow",
    "advisory_key",
]
