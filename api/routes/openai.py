"""``/v1/chat/completions`` and ``/v1/completions``: OpenAI's synchronous endpoints, run through
the same durable pipeline as ``/v1/requests`` (admission, Postgres, broker, batcher, worker)
and answered once the request is finished."""

from __future__ import annotations

import contextlib

from fastapi import APIRouter, Depends

from api.deps import Caller, Services, get_caller
from api.gate import admit
from api.openai_errors import OpenAIRoute, failure_of
from api.openai_schemas import ChatBody, CompletionBody, chat_completion, text_completion
from api.polling import long_poll
from api.responses import JSON
from api.schemas import SubmitRequest
from api.submission import build_command, exact_prompt_tokens
from core.domain import RequestRecord, RequestState, utcnow
from core.errors import BatchserveError, WaitTimedOut
from core.store import TenantRow

router = APIRouter(
    prefix="/v1", tags=["openai"], route_class=OpenAIRoute, dependencies=[Depends(get_caller)]
)

# The wait outlasts the request's own deadline a little, so a request that runs to its deadline
# is answered with how it ended rather than with the wait's timeout.
WAIT_GRACE_S = 2.0


@router.post("/chat/completions")
async def create_chat_completion(body: ChatBody, services: Services, caller: Caller) -> JSON:
    """A chat completion, OpenAI's way: submit, wait for the batch it rides, answer."""
    submit = body.to_submit(timeout_s=services.settings.openai_timeout_s)
    record = await _run(services, caller, submit)
    return JSON(chat_completion(record))


@router.post("/completions")
async def create_completion(body: CompletionBody, services: Services, caller: Caller) -> JSON:
    """A text completion, OpenAI's way."""
    submit = body.to_submit(timeout_s=services.settings.openai_timeout_s)
    record = await _run(services, caller, submit)
    return JSON(text_completion(record))


async def _run(services: Services, caller: TenantRow, submit: SubmitRequest) -> RequestRecord:
    """Admit the request and wait for its terminal state; raise how it failed, if it did."""
    now = utcnow()
    command = build_command(
        submit,
        tenant=caller.name,
        idempotency_key=None,
        registry=services.adapters.registry,
        settings=services.settings,
        now=now,
        prompt_tokens=await exact_prompt_tokens(services, submit),
    )
    admission = await admit(services, caller, command)
    wait_s = services.settings.openai_timeout_s + WAIT_GRACE_S
    tenant = caller.name
    record = await long_poll(services, admission.record, tenant, wait_s, "terminal")
    if not record.state.terminal:
        # Nobody is waiting for it any more: don't let it take a slot.
        with contextlib.suppress(BatchserveError):
            await services.adapters.store.cancel(record.id, tenant)
        raise WaitTimedOut(f"the request did not finish within {wait_s:.0f} s")
    if record.state is not RequestState.SUCCEEDED:
        raise failure_of(record)
    return record
