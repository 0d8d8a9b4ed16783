"""Turning a validated body into a submit command: model limits, deadline, fingerprint."""

from __future__ import annotations

import hashlib
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from pydantic import BaseModel

from batchserve.api.schemas import (
    EXTENDED_DEFAULTS,
    GenerationParams,
    ResponseFormat,
    SubmitRequest,
)
from batchserve.core.domain import Lane, SubmitCommand
from batchserve.core.errors import ContextLengthExceeded, InvalidInput, ModelNotFound
from batchserve.core.ids import uuid7
from batchserve.core.settings import Settings
from batchserve.core.ssrf import parse_webhook_url
from batchserve.models.plugins import is_embedding, plugin_for
from batchserve.models.registry import ModelSpec, Registry
from batchserve.models.tokens import estimate_tokens

MAX_IDEMPOTENCY_KEY = 255


def fingerprint(body: BaseModel) -> str:
    """The body as sent (unset defaults left out), canonical: key order and spacing don't count."""
    sent = body.model_dump(mode="json", exclude_unset=True)
    canonical = orjson.dumps(sent, option=orjson.OPT_SORT_KEYS)
    return hashlib.sha256(canonical).hexdigest()


def resolve_model(registry: Registry, name: str) -> ModelSpec:
    spec = registry.get(name)
    if spec is None:
        raise ModelNotFound(
            f"no model named {name!r}; GET /v1/models lists the models served here", field="model"
        )
    return spec


def estimate_prompt_tokens(body: SubmitRequest) -> int:
    """A cheap admission-time estimate (about 4 characters a token); workers count exactly."""
    messages = [m.model_dump() for m in body.messages] if body.messages is not None else None
    return estimate_tokens(body.input, messages)


def _refuse_nul(body: SubmitRequest) -> None:
    """Text is stored in Postgres, which cannot hold NUL characters: refuse them by name."""
    if body.input is not None and "\x00" in body.input:
        _nul("input")
    for i, message in enumerate(body.messages or ()):
        if "\x00" in message.content:
            _nul(f"messages.{i}.content")
    for key, value in (body.metadata or {}).items():
        if "\x00" in key or "\x00" in value:
            _nul(f"metadata.{key}")
    for stop in body.params.stop_list() or ():
        if "\x00" in stop:
            _nul("params.stop")
    if body.webhook_url is not None and "\x00" in body.webhook_url:
        _nul("webhook_url")


def _nul(field: str) -> None:
    raise InvalidInput(f"{field} contains a NUL character", field=field)


def check_context(
    spec: ModelSpec, body: SubmitRequest, prompt_tokens: int, max_tokens: int
) -> None:
    """Refuse a prompt that, with the tokens asked for, cannot fit the model's context."""
    need = prompt_tokens + max_tokens
    if need > spec.context_length:
        field = "input" if body.input is not None else "messages"
        asked = "max_tokens is" if body.params.max_tokens is not None else "at least"
        raise ContextLengthExceeded(
            f"the prompt has {prompt_tokens} tokens and {asked} {max_tokens} must follow: "
            f"together more than the {spec.context_length}-token context of {spec.name}",
            field=field,
            limit={"context_length": spec.context_length, "prompt_tokens": prompt_tokens},
        )


def default_max_tokens(spec: ModelSpec, prompt_tokens: int) -> int:
    """``max_tokens`` where the caller gives none (as OpenAI and vLLM do): the model's
    ``max_new_tokens``, bounded by the context left after the prompt (one token at least: a
    prompt that fills the context is refused by its exact count)."""
    return max(1, min(spec.max_new_tokens, spec.context_length - prompt_tokens))


def extended_params(spec: ModelSpec, params: GenerationParams, max_tokens: int) -> dict[str, Any]:
    """The request's generation fields past the basic ones, where they change anything; each
    refused, by name, where the model's backend cannot honour it."""
    chosen: dict[str, Any] = {}
    for name, default in EXTENDED_DEFAULTS.items():
        value = getattr(params, name)
        if value is None or value == default:
            continue
        if isinstance(value, ResponseFormat):
            value = value.stored()
            if value is None:  # {"type": "text"}: what every model does
                continue
            check_response_format(value)
        if name not in plugin_for(spec).sampling:
            raise InvalidInput(
                f"params.{name} is not supported by {spec.name} (backend {spec.backend})",
                field=f"params.{name}",
            )
        chosen[name] = value
    if params.min_tokens > max_tokens:
        raise InvalidInput(
            f"params.min_tokens ({params.min_tokens}) is more than max_tokens ({max_tokens})",
            field="params.min_tokens",
            limit={"le": max_tokens},
        )
    return chosen


def check_response_format(response_format: dict[str, Any]) -> None:
    """Refuse a format whose grammar cannot be built (a schema llguidance does not take),
    naming the schema, rather than fail the request on a worker."""
    from llguidance import LLMatcher

    from batchserve.models.formats import grammar_of

    field = "params.response_format"
    if response_format["type"] == "json_schema":  # with its json_schema (ResponseFormat)
        field = "params.response_format.json_schema.schema"
    try:
        grammar = grammar_of(response_format)
        error = LLMatcher.validate_grammar(grammar) if grammar is not None else ""
    except (ValueError, TypeError) as failure:
        error = str(failure)
    if error:
        raise InvalidInput(f"the schema cannot be decoded under: {error}", field=field)


def resolve_deadline(body: SubmitRequest, settings: Settings, now: datetime) -> datetime:
    if body.deadline is not None:
        deadline = body.deadline if body.deadline.tzinfo else body.deadline.replace(tzinfo=UTC)
        if deadline <= now:
            raise InvalidInput("the deadline is in the past", field="deadline")
        if deadline - now > timedelta(seconds=settings.max_timeout_s):
            raise InvalidInput(
                f"the deadline is more than {settings.max_timeout_s:.0f} s away",
                field="deadline",
                limit={"max_s": settings.max_timeout_s},
            )
        return deadline
    return deadline_in(body.timeout_s, settings, now)


def deadline_in(timeout_s: float | None, settings: Settings, now: datetime) -> datetime:
    """``timeout_s`` (the default where ``None``) from ``now``, within the longest allowed."""
    if timeout_s is None:
        timeout_s = settings.default_timeout_s
    if timeout_s > settings.max_timeout_s:
        raise InvalidInput(
            f"timeout_s must be at most {settings.max_timeout_s:.0f}",
            field="timeout_s",
            limit={"le": settings.max_timeout_s},
        )
    return now + timedelta(seconds=timeout_s)


def check_idempotency_key(key: str | None) -> str | None:
    if key is None:
        return None
    if not key or len(key) > MAX_IDEMPOTENCY_KEY or not key.isprintable():
        raise InvalidInput(
            f"Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} printable characters",
            field="Idempotency-Key",
            limit={"max_length": MAX_IDEMPOTENCY_KEY},
        )
    return key


def check_webhook_url(url: str | None) -> str | None:
    """The URL's form (scheme, no userinfo); where it leads is checked by the SSRF guard."""
    if url is None:
        return None
    parse_webhook_url(url)
    return url


def build_command(
    body: SubmitRequest,
    *,
    tenant: str,
    idempotency_key: str | None,
    registry: Registry,
    settings: Settings,
    now: datetime,
    prompt_tokens: int | None = None,
    request_id: uuid.UUID | None = None,
    deadline: datetime | None = None,
    **fields: Any,
) -> SubmitCommand:
    """``prompt_tokens``: the exact count when the caller has the model's tokenizer.
    ``request_id``, ``deadline`` and the other ``fields`` of the command, where the caller
    sets them (a bulk job's lines)."""
    if body.input is None and body.messages is None:
        raise InvalidInput("give one of `input` (text) and `messages` (chat)", field="input")
    if body.input is not None and body.messages is not None:
        raise InvalidInput("give only one of `input` and `messages`", field="messages")
    if body.timeout_s is not None and body.deadline is not None:
        raise InvalidInput("give at most one of `timeout_s` and `deadline`", field="deadline")
    spec = resolve_model(registry, body.model)
    if is_embedding(spec):
        raise InvalidInput(
            f"{spec.name} is an embedding model: it embeds text (POST /v1/embeddings) and "
            "generates none",
            field="model",
        )
    _refuse_nul(body)
    params = body.params
    if params.max_tokens is not None and params.max_tokens > spec.max_new_tokens:
        raise InvalidInput(
            f"params.max_tokens must be at most {spec.max_new_tokens} for {spec.name}",
            field="params.max_tokens",
            limit={"le": spec.max_new_tokens},
        )
    total_chars = len(body.input or "") + sum(len(m.content) for m in body.messages or [])
    if total_chars > settings.max_input_chars:
        field = "input" if body.input is not None else "messages"
        raise InvalidInput(
            f"{field} is longer than {settings.max_input_chars} characters",
            field=field,
            limit={"max_chars": settings.max_input_chars},
        )
    exact = prompt_tokens is not None
    if prompt_tokens is None:
        prompt_tokens = estimate_prompt_tokens(body)
    max_tokens = (
        params.max_tokens
        if params.max_tokens is not None
        else default_max_tokens(spec, prompt_tokens)
    )
    if exact:
        check_context(spec, body, prompt_tokens, max_tokens)
    return SubmitCommand(
        id=request_id or uuid7(),
        tenant=tenant,
        model=spec.name,
        lane=fields.pop("lane", None) or Lane(body.lane),
        input=body.input,
        messages=[m.model_dump() for m in body.messages] if body.messages is not None else None,
        params={
            "max_tokens": max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": params.stop_list(),
            "seed": params.seed,
            **({"ignore_eos": True} if params.ignore_eos else {}),
            **extended_params(spec, params, max_tokens),
        },
        created_at=now,
        deadline=deadline or resolve_deadline(body, settings, now),
        prompt_tokens=prompt_tokens,
        max_tokens=max_tokens,
        idempotency_key=check_idempotency_key(idempotency_key),
        # Only a replay under the same key compares bodies.
        fingerprint=fingerprint(body) if idempotency_key is not None else None,
        webhook_url=check_webhook_url(body.webhook_url),
        metadata=body.metadata,
        **fields,
    )


async def exact_prompt_tokens(services: Any, body: SubmitRequest) -> int | None:
    """The prompt's exact token count when the API holds the model's tokenizer, else ``None``."""
    spec = services.adapters.registry.get(body.model)
    counter = services.prompt_counter
    if (
        spec is None
        or is_embedding(spec)  # refused by build_command: it generates nothing
        or not counter.exact(spec.name)
        or (body.input is None) == (body.messages is None)
    ):
        return None
    messages = [m.model_dump() for m in body.messages] if body.messages is not None else None
    try:
        tokens: int = await counter.count(spec, body.input, messages)
    except ValueError as error:  # a model whose tokenizer has no chat template
        raise InvalidInput(
            f"{spec.name} cannot take messages: {error}", field="messages"
        ) from error
    return tokens
