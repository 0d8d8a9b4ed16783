"""``/v1/chat/completions`` and ``/v1/completions``: OpenAI's endpoints, run through the same
durable pipeline as ``/v1/requests`` (admission, Postgres, broker, batcher, worker) and
answered once the request is finished, or with ``stream: true`` as it generates.

A caller that goes away (closes the connection) cancels its request, streamed or not: nobody
is left to read the answer, so it should not keep a slot.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Coroutine
from typing import Any

import anyio
import orjson
from fastapi import APIRouter, Depends, Request
from fastapi.responses import Response
from sse_starlette.sse import EventSourceResponse, ServerSentEvent

from batchserve.api.deps import Caller, IdempotencyKey, Services, get_caller
from batchserve.api.embeddings import (
    EmbeddingBody,
    build_embedding_command,
    embedding_model,
    embedding_response,
)
from batchserve.api.intake import admit
from batchserve.api.openai_errors import OpenAIRoute
from batchserve.api.openai_schemas import (
    ChatBody,
    CompletionBody,
    OpenAIBody,
    chat_completion,
    text_completion,
)
from batchserve.api.openai_stream import DONE, ChunkFormat, chunks
from batchserve.api.polling import long_poll, wait_from
from batchserve.api.responses import JSON
from batchserve.api.schemas import SubmitRequest
from batchserve.api.services import ApiServices
from batchserve.api.statuses import error_body, failure_of, status_of
from batchserve.api.streams import PING_S
from batchserve.api.submission import build_command, exact_prompt_tokens
from batchserve.core.domain import RequestRecord, RequestState, SubmitCommand
from batchserve.core.errors import BatchserveError, WaitTimedOut
from batchserve.core.logs import get_logger
from batchserve.core.store import TenantRow

log = get_logger("batchserve.api")

router = APIRouter(
    prefix="/v1", tags=["openai"], route_class=OpenAIRoute, dependencies=[Depends(get_caller)]
)

# The wait outlasts the request's own deadline a little, so a request that runs to its deadline
# is answered with how it ended rather than with the wait's timeout.
WAIT_GRACE_S = 2.0
# On SIGTERM an OpenAI stream may run on this long (less than the API's 10 s graceful
# shutdown): it cannot be resumed elsewhere, so what can finish does. A native stream ends at
# once: its client resumes on another replica.
STREAM_DRAIN_S = 8.0
STREAMED: dict[int | str, dict[str, Any]] = {
    200: {
        "description": "The completion; with stream=true, Server-Sent Events of chunks",
        "content": {"application/json": {}, "text/event-stream": {}},
    }
}


@router.post("/chat/completions", responses=STREAMED)
async def create_chat_completion(
    body: ChatBody,
    services: Services,
    caller: Caller,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """A chat completion, OpenAI's way: submit, wait for the batch it rides, answer (or
    stream it, with ``stream: true``). A retry with the same ``Idempotency-Key`` gets the
    first request's answer; it never runs twice."""
    submit = body.to_submit(timeout_s=services.settings.openai_timeout_s, can_stream=True)
    command = await _command(services, caller, submit, idempotency_key)
    if body.stream:
        record = await _submit(services, caller, command)
        return _stream(services, caller, record, _format(body, chat=True))
    return JSON(chat_completion(await _submit_and_answer(services, caller, command, request)))


@router.post("/completions", responses=STREAMED)
async def create_completion(
    body: CompletionBody,
    services: Services,
    caller: Caller,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """A text completion, OpenAI's way (``Idempotency-Key`` as for chat)."""
    submit = body.to_submit(timeout_s=services.settings.openai_timeout_s, can_stream=True)
    command = await _command(services, caller, submit, idempotency_key)
    if body.stream:
        record = await _submit(services, caller, command)
        return _stream(services, caller, record, _format(body, chat=False))
    return JSON(text_completion(await _submit_and_answer(services, caller, command, request)))


@router.post("/embeddings")
async def create_embeddings(
    body: EmbeddingBody,
    services: Services,
    caller: Caller,
    request: Request,
    idempotency_key: IdempotencyKey = None,
) -> Response:
    """Embeddings, OpenAI's way: one request for all of the call's texts, batched with other
    calls' by the tokens they hold (``Idempotency-Key`` as for chat)."""
    spec = embedding_model(services.adapters.registry, body.model)
    command = build_embedding_command(
        body,
        tenant=caller.name,
        idempotency_key=idempotency_key,
        registry=services.adapters.registry,
        settings=services.settings,
        now=services.now(),
        token_counts=await services.prompt_counter.count_texts(spec, body.texts()),
        timeout_s=services.settings.openai_timeout_s,
    )
    record = await _submit_and_answer(services, caller, command, request)
    return Response(embedding_response(record), media_type="application/json")


def _format(body: OpenAIBody, *, chat: bool) -> ChunkFormat:
    return ChunkFormat(chat=chat, include_usage=body.include_usage)


async def _command(
    services: ApiServices, caller: TenantRow, submit: SubmitRequest, idempotency_key: str | None
) -> SubmitCommand:
    return build_command(
        submit,
        tenant=caller.name,
        idempotency_key=idempotency_key,
        registry=services.adapters.registry,
        settings=services.settings,
        now=services.now(),
        prompt_tokens=await exact_prompt_tokens(services, submit),
    )


async def _submit(
    services: ApiServices, caller: TenantRow, command: SubmitCommand
) -> RequestRecord:
    return (await admit(services, caller, command)).record


async def _submit_and_answer(
    services: ApiServices, caller: TenantRow, command: SubmitCommand, request: Request
) -> RequestRecord:
    """Admit the request and wait for its terminal state; raise how it failed, if it did.

    Watched before it is admitted, so its end cannot come unheard and the only read is the
    one its end triggers (a watch begun after admission had to read once more to be sure)."""
    with services.waiters.watch(str(command.id), terminal_only=True) as changed:
        record = await _submit(services, caller, command)
        if record.id == command.id:
            waiting = wait_from(services, record, caller.name, _wait_s(services), changed)
        else:  # a retry with the Idempotency-Key of an earlier request: that one's answer
            waiting = long_poll(services, record, caller.name, _wait_s(services), "terminal")
        return await _answer(services, caller, record, request, waiting)


def _wait_s(services: ApiServices) -> float:
    return services.settings.openai_timeout_s + WAIT_GRACE_S


async def _answer(
    services: ApiServices,
    caller: TenantRow,
    record: RequestRecord,
    request: Request,
    waiting: Coroutine[Any, Any, RequestRecord],
) -> RequestRecord:
    """Await ``waiting`` (the request's terminal state); raise how it failed, if it did."""
    wait_s = _wait_s(services)
    tenant = caller.name
    done = await _unless_gone(request, waiting)
    if done is None:
        await _cancel(services, record, tenant, "client_disconnected")
        raise WaitTimedOut("the client went away")  # nobody reads this answer
    if not done.state.terminal:
        # Nobody is waiting for it any more: don't let it take a slot.
        await _cancel(services, done, tenant, "wait_timed_out")
        raise WaitTimedOut(f"the request did not finish within {wait_s:.0f} s")
    if done.state is not RequestState.SUCCEEDED:
        raise failure_of(done)
    return done


def _stream(
    services: ApiServices, caller: TenantRow, record: RequestRecord, form: ChunkFormat
) -> EventSourceResponse:
    tenant = caller.name

    async def events() -> AsyncIterator[ServerSentEvent]:
        finished = False
        try:
            async for data in chunks(services, record, tenant, form):
                yield ServerSentEvent(data=data)
            finished = True
        except BatchserveError as error:  # the database went away mid-stream
            log.warning("openai_stream_failed", request_id=record.id, error=error)
            body = error_body(status_of(error), error.message, error.code, None)
            yield ServerSentEvent(data=orjson.dumps(body).decode())
            yield ServerSentEvent(data=DONE)
            finished = True  # the request goes on; its result can be read
        finally:
            if not finished:  # the client went away mid-stream (or the API is stopping)
                with anyio.CancelScope(shield=True):
                    await _cancel(services, record, tenant, "stream_ended")

    return EventSourceResponse(events(), ping=PING_S, shutdown_grace_period=STREAM_DRAIN_S)


async def _unless_gone(request: Request, waiting: Awaitable[RequestRecord]) -> RequestRecord | None:
    """``waiting``'s result, or ``None`` if the client disconnects first."""
    wait = asyncio.ensure_future(waiting)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait({wait, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (wait, gone):
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
    return wait.result() if wait.done() and not wait.cancelled() else None


async def _disconnected(request: Request) -> None:
    # The body has been read: what the server receives next is the disconnect.
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _cancel(services: ApiServices, record: RequestRecord, tenant: str, why: str) -> None:
    with contextlib.suppress(BatchserveError):
        await services.adapters.store.cancel(record.id, tenant)
        log.info("openai_request_cancelled", request_id=record.id, reason=why)
