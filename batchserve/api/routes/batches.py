"""``/v1/batches``: bulk jobs in OpenAI's Batch format, run on capacity interactive traffic
leaves free. ``POST`` answers ``validating`` at once; the job driver (``batchserve
maintenance``) validates the file, persists and queues its requests, and writes the output."""

from __future__ import annotations

import uuid
from datetime import timedelta
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from batchserve.api.batch_schemas import CreateBatch, batch_object, openai_list, window_s
from batchserve.api.deps import Caller, IdempotencyKey, Services, Tenant, get_caller
from batchserve.api.openai_errors import OpenAIRoute
from batchserve.api.responses import JSON
from batchserve.api.submission import check_idempotency_key, check_webhook_url, fingerprint
from batchserve.core.bulk import (
    FILE_PREFIX,
    JOB_PREFIX,
    Endpoint,
    FilePurpose,
    NewJob,
    parse_public_id,
)
from batchserve.core.domain import JobChanged
from batchserve.core.errors import InvalidInput, NotFound
from batchserve.core.ids import uuid7
from batchserve.core.store.creations import CreationKey

router = APIRouter(
    prefix="/v1/batches",
    tags=["batches"],
    route_class=OpenAIRoute,
    dependencies=[Depends(get_caller)],
)


@router.post("")
async def create_batch(
    body: CreateBatch, services: Services, caller: Caller, idempotency_key: IdempotencyKey = None
) -> JSON:
    """Create a bulk job from an uploaded JSONL file; it starts ``validating``. A retry with the
    same ``Idempotency-Key`` (and body) gets the job the first call created, as it is now."""
    key = check_idempotency_key(idempotency_key)
    tenant = caller.name
    await services.quotas.check_bulk(caller, 0)  # at the limit already: refuse now
    endpoints = [e.value for e in Endpoint]
    if body.endpoint not in endpoints:
        raise InvalidInput(
            f"endpoint must be one of {', '.join(endpoints)}", field="endpoint", limit=endpoints
        )
    seconds = window_s(body.completion_window, services.settings)
    file_id = parse_public_id(body.input_file_id, FILE_PREFIX)
    store = services.adapters.store
    record = await store.get_file(file_id, tenant, now=services.clock()) if file_id else None
    if record is None:
        raise NotFound(f"no file {body.input_file_id}")
    if record.purpose is not FilePurpose.BATCH:
        raise InvalidInput(
            "input_file_id must name a file uploaded with purpose 'batch'", field="input_file_id"
        )
    webhook_url = check_webhook_url(body.webhook_url)
    if webhook_url is not None:
        await services.url_guard.check_submission(webhook_url)
    now = services.now()
    job = await store.create_job(
        NewJob(
            id=uuid7(),
            tenant=tenant,
            endpoint=Endpoint(body.endpoint),
            completion_window=body.completion_window,
            input_file_id=record.id,
            created_at=now,
            expires_at=now + timedelta(seconds=seconds),
            metadata=body.metadata,
            webhook_url=webhook_url,
            output_expires_after_s=(
                body.output_expires_after.seconds
                if body.output_expires_after
                else services.settings.file_retention_s or None
            ),
        ),
        idempotency=None if key is None else CreationKey(key, fingerprint(body)),
    )
    await services.adapters.events.publish(JobChanged(job.id.hex, job.status.value))
    return JSON(batch_object(job))


@router.get("/{batch_id}")
async def get_batch(batch_id: str, services: Services, tenant: Tenant) -> JSON:
    """A job's status, timestamps, request counts and, once it ended, its files."""
    job = await services.adapters.store.get_job(_job_uuid(batch_id), tenant)
    if job is None:
        raise NotFound(f"no batch {batch_id}")
    return JSON(batch_object(job))


@router.post("/{batch_id}/cancel")
async def cancel_batch(batch_id: str, services: Services, tenant: Tenant) -> JSON:
    """Cancel a job: it goes ``cancelling``, its unfinished requests are cancelled, then it
    ends ``cancelled`` with the results it has."""
    job = await services.adapters.store.cancel_job(_job_uuid(batch_id), tenant, services.clock())
    await services.adapters.events.publish(JobChanged(job.id.hex, job.status.value))
    return JSON(batch_object(job))


@router.get("")
async def list_batches(
    services: Services,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
    after: Annotated[str | None, Query(description="The last id of the previous page")] = None,
) -> JSON:
    """The caller's jobs, newest first, a page at a time."""
    before = _job_uuid(after) if after else None
    jobs = await services.adapters.store.list_jobs(tenant, limit=limit + 1, before=before)
    page = [batch_object(j) for j in jobs[:limit]]
    return JSON(openai_list(page, has_more=len(jobs) > limit))


def _job_uuid(batch_id: str) -> uuid.UUID:
    parsed = parse_public_id(batch_id, JOB_PREFIX)
    if parsed is None:
        raise NotFound(f"no batch {batch_id}")
    return parsed
