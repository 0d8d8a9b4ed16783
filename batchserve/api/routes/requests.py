"""``/v1/requests``: submit, read (with long-poll), stream, cancel, list."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Annotated, Literal

import orjson
from fastapi import APIRouter, Depends, Header, Query
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from batchserve.api.deps import Caller, IdempotencyKey, Services, Tenant, get_caller
from batchserve.api.intake import admit
from batchserve.api.lean import LeanRoute
from batchserve.api.polling import read_or_wait, read_request
from batchserve.api.responses import JSON
from batchserve.api.schemas import RequestList, RequestOut, SubmitRequest, dump
from batchserve.api.services import ApiServices
from batchserve.api.streams import EVENT_ID_PATTERN, PING_S, follow, parse_event_id
from batchserve.api.submission import build_command, exact_prompt_tokens
from batchserve.core.domain import RequestRecord, RequestState
from batchserve.core.errors import InvalidInput

router = APIRouter(
    prefix="/v1/requests",
    tags=["requests"],
    route_class=LeanRoute,
    dependencies=[Depends(get_caller)],
)


@router.post(
    "",
    status_code=202,
    response_model=RequestOut,
    responses={202: {"description": "Accepted; poll the Location for the result"}},
)
async def submit_request(
    body: SubmitRequest,
    services: Services,
    caller: Caller,
    idempotency_key: IdempotencyKey = None,
) -> JSON:
    """Accept a request for batched inference and answer at once with its id."""
    now = services.now()
    command = build_command(
        body,
        tenant=caller.name,
        idempotency_key=idempotency_key,
        registry=services.adapters.registry,
        settings=services.settings,
        now=now,
        prompt_tokens=await exact_prompt_tokens(services, body),
    )
    if command.webhook_url is not None:
        await services.url_guard.check_submission(command.webhook_url)
    admission = await admit(services, caller, command)
    return _accepted(services, admission.record, replayed=admission.replayed)


def _out(services: ApiServices, record: RequestRecord) -> RequestOut:
    return RequestOut.of(record, retention_s=services.settings.request_retention_s)


def _accepted(services: ApiServices, record: RequestRecord, *, replayed: bool) -> JSON:
    headers = {"Location": f"/v1/requests/{record.id}"}
    if replayed:
        headers["Idempotent-Replayed"] = "true"
    return JSON(dump(_out(services, record)), status_code=202, headers=headers)


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
    if wait > 0:
        record = await read_or_wait(services, request_id, tenant, wait, until)
    else:
        record = await read_request(services, request_id, tenant)
    return JSON(dump(_out(services, record)))


@router.get(
    "/{request_id}/stream",
    responses={
        200: {
            "description": "Server-Sent Events: state, delta and reset",
            "content": {"text/event-stream": {}},
        }
    },
)
async def stream_request(
    request_id: uuid.UUID,
    services: Services,
    tenant: Tenant,
    last_event_id: Annotated[
        str, Header(alias="Last-Event-ID", json_schema_extra={"pattern": EVENT_ID_PATTERN})
    ] = "",
) -> EventSourceResponse:
    """The request's state changes and token deltas as Server-Sent Events, until it ends.

    ``state`` events carry ``status`` (the last one, terminal, the whole request), ``delta``
    events ``text`` to append, and ``reset`` says to drop the text so far (the request runs
    again after its worker was lost). Every event has an id: reconnecting with
    ``Last-Event-ID``, to any API replica, continues right after it. A stream that disconnects
    cancels nothing."""
    resume = parse_event_id(last_event_id)
    record = await read_request(services, request_id, tenant)

    async def events() -> AsyncIterator[ServerSentEvent]:
        async for event in follow(services, record, tenant, resume):
            yield ServerSentEvent(
                data=orjson.dumps(event.data).decode(), event=event.event, id=str(event.id)
            )

    return EventSourceResponse(events(), ping=PING_S)


@router.post("/{request_id}/cancel", response_model=RequestOut)
async def cancel_request(request_id: uuid.UUID, services: Services, tenant: Tenant) -> JSON:
    """Cancel a queued or running request. A queued one never runs; a running one's result is
    discarded. Cancelling a finished request answers 409."""
    record = await services.adapters.store.cancel(request_id, tenant)
    return JSON(dump(_out(services, record)))


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
        data=[_out(services, r) for r in page],
        has_more=has_more,
        next_cursor=str(page[-1].id) if has_more and page else None,
    )
    return JSON(dump(body))
