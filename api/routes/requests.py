"""``/v1/requests``: submit, read (with long-poll), cancel, list."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query

from api.deadlines import refuse_if_hopeless
from api.deps import Services, Tenant
from api.responses import JSON
from api.schemas import RequestList, RequestOut, SubmitRequest, dump
from api.submission import build_command
from core.domain import RequestRecord, RequestState, SubmitCommand, to_epoch, utcnow
from core.errors import DeadlineUnmeetable, InvalidInput, NotFound

router = APIRouter(prefix="/v1/requests", tags=["requests"])

IdempotencyKey = Annotated[str | None, Header(alias="Idempotency-Key")]


@router.post(
    "",
    status_code=202,
    response_model=RequestOut,
    responses={202: {"description": "Accepted; poll the Location for the result"}},
)
async def submit_request(
    body: SubmitRequest,
    services: Services,
    tenant: Tenant,
    idempotency_key: IdempotencyKey = None,
) -> JSON:
    """Accept a request for batched inference and answer at once with its id."""
    now = utcnow()
    command = build_command(
        body,
        tenant=tenant,
        idempotency_key=idempotency_key,
        registry=services.adapters.registry,
        settings=services.settings,
        now=now,
    )
    if command.webhook_url is not None:
        await services.url_guard.check_submission(command.webhook_url)
    try:
        await refuse_if_hopeless(services.adapters.loadboard, command, to_epoch(now))
    except DeadlineUnmeetable:
        # A retry of a request we already accepted gets its original answer, not a refusal.
        original = await _original(services, command)
        if original is None:
            raise
        return _accepted(original, replayed=True)
    admission = await services.admitter.submit(command)
    return _accepted(admission.record, replayed=admission.replayed)


async def _original(services: Services, command: SubmitCommand) -> RequestRecord | None:
    if command.idempotency_key is None:
        return None
    store = services.adapters.store
    original = await store.get_by_idempotency_key(command.tenant, command.idempotency_key)
    if original is None or original.fingerprint != command.fingerprint:
        return None
    return original


def _accepted(record: RequestRecord, *, replayed: bool) -> JSON:
    headers = {"Location": f"/v1/requests/{record.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSON(dump(RequestOut.of(record)), status_code=202, headers=headers)


@router.get("/{request_id}", response_model=RequestOut)
async def get_request(
    request_id: uuid.UUID,
    services: Services,
    tenant: Tenant,
    wait: Annotated[float, Query(ge=0, description="Long-poll up to this many seconds")] = 0,
    until: Annotated[
        Literal["terminal", "change"],
        Query(description="With wait: return at a terminal state (default) or at any change"),
    ] = "terminal",
) -> JSON:
    """A request's state and, once finished, its result."""
    if wait > services.settings.max_wait_s:
        raise InvalidInput(
            f"wait must be at most {services.settings.max_wait_s:.0f} seconds",
            field="wait",
            limit={"le": services.settings.max_wait_s},
        )
    record = await _read(services, request_id, tenant)
    if wait > 0 and not record.state.terminal:
        record = await _long_poll(services, record, tenant, wait, until)
    return JSON(dump(RequestOut.of(record)))


@router.post("/{request_id}/cancel", response_model=RequestOut)
async def cancel_request(request_id: uuid.UUID, services: Services, tenant: Tenant) -> JSON:
    """Cancel a queued or running request. A queued one never runs; a running one's result is
    discarded. Cancelling a finished request answers 409."""
    record = await services.adapters.store.cancel(request_id, tenant)
    return JSON(dump(RequestOut.of(record)))


@router.get("", response_model=RequestList)
async def list_requests(
    services: Services,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=1000)] = 50,
    after: Annotated[
        uuid.UUID | None, Query(description="Cursor: next_cursor of the last page")
    ] = None,
    status: RequestState | None = None,
    model: Annotated[str | None, Query(max_length=128)] = None,
) -> JSON:
    """The caller's requests, newest first, a page at a time."""
    records = await services.adapters.store.list_requests(
        tenant, limit=limit + 1, before=after, state=status, model=model
    )
    page = records[:limit]
    has_more = len(records) > limit
    body = RequestList(
        data=[RequestOut.of(r) for r in page],
        has_more=has_more,
        next_cursor=str(page[-1].id) if has_more and page else None,
    )
    return JSON(dump(body))


async def _read(services: Services, request_id: uuid.UUID, tenant: str) -> RequestRecord:
    record = await services.adapters.store.get(request_id, tenant)
    if record is None:
        raise NotFound(f"no request {request_id}")
    return record


async def _long_poll(
    services: Services, first: RequestRecord, tenant: str, wait_s: float, until: str
) -> RequestRecord:
    """Wait for a notification that the request changed, re-reading Postgres on each."""
    waiters = services.waiters
    give_up_at = time.monotonic() + wait_s
    record = first
    with waiters.watch(str(first.id)) as changed:
        # Read again once subscribed, so a change between the first read and now is not missed.
        record = await _read(services, first.id, tenant)
        while not _done(record, first, until):
            remaining = give_up_at - time.monotonic()
            if remaining <= 0:
                break
            poll_s = waiters.poll_s
            timeout = remaining if poll_s is None else min(remaining, poll_s)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), timeout=timeout)
            changed.clear()
            record = await _read(services, first.id, tenant)
    return record


def _done(record: RequestRecord, first: RequestRecord, until: str) -> bool:
    if record.state.terminal:
        return True
    return until == "change" and record.state is not first.state
