"""``/v1/embeddings``: OpenAI's request and response, and the request batchserve runs for it.

One call is one request, whatever the number of its texts: it is admitted, persisted, batched
and answered once, like a completion (an ``Idempotency-Key`` retry gets the first answer). Its
texts travel in ``params["input"]``; the batcher counts its cost in tokens (it generates none);
the worker writes OpenAI's ``data`` list in the encoding the call asked for
(``batchserve/models/embedding.py``), and the answer sends it as it is.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, StrictStr

from batchserve.api.openai_schemas import documented
from batchserve.api.schemas import JsonInt
from batchserve.api.submission import (
    check_idempotency_key,
    deadline_in,
    fingerprint,
    resolve_model,
)
from batchserve.core.domain import Lane, RequestRecord, SubmitCommand
from batchserve.core.errors import ContextLengthExceeded, InvalidInput
from batchserve.core.ids import uuid7
from batchserve.core.settings import Settings
from batchserve.models.embedding import dimensions_of
from batchserve.models.plugins import is_embedding
from batchserve.models.registry import ModelSpec, Registry
from batchserve.models.tokens import estimate_tokens

# OpenAI's limit on the texts of one call.
MAX_EMBEDDING_INPUTS = 2048


class EmbeddingBody(BaseModel):
    """``POST /v1/embeddings``. Every field is honoured or refused: an unknown one is a 400
    naming it."""

    model_config = ConfigDict(extra="forbid")

    model: StrictStr = documented(minLength=1, maxLength=128)
    input: StrictStr | list[StrictStr] | list[JsonInt] | list[list[JsonInt]] = documented(
        anyOf=[
            {"type": "string", "minLength": 1},
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "maxItems": MAX_EMBEDDING_INPUTS,
            },
        ]
    )
    encoding_format: Literal["float", "base64"] = "float"
    # Only the model's own size: its vectors cannot be shortened (not a Matryoshka model).
    dimensions: JsonInt | None = documented(None, minimum=1)
    # OpenAI's end-user id: kept with the request as its metadata ``user``.
    user: StrictStr | None = Field(None, max_length=256)

    def texts(self) -> list[str]:
        """The texts to embed; token arrays and empty texts are refused by name."""
        texts = [self.input] if isinstance(self.input, str) else self.input
        if not texts:
            raise InvalidInput("input must hold at least one text", field="input")
        if len(texts) > MAX_EMBEDDING_INPUTS:
            raise InvalidInput(
                f"input may hold at most {MAX_EMBEDDING_INPUTS} texts",
                field="input",
                limit={"max_items": MAX_EMBEDDING_INPUTS},
            )
        strings: list[str] = []
        for index, text in enumerate(texts):
            field = "input" if isinstance(self.input, str) else f"input[{index}]"
            if not isinstance(text, str):
                raise InvalidInput(
                    "token arrays are not supported: send the texts (a client that tokenizes "
                    "for OpenAI's models, such as LangChain's OpenAIEmbeddings, needs "
                    "check_embedding_ctx_length=False)",
                    field=field,
                )
            if not text:
                raise InvalidInput("an input text may not be empty", field=field)
            if "\x00" in text:
                raise InvalidInput(f"{field} contains a NUL character", field=field)
            strings.append(text)
        return strings


def embedding_model(registry: Registry, name: str) -> ModelSpec:
    spec = resolve_model(registry, name)
    if not is_embedding(spec):
        raise InvalidInput(
            f"{spec.name} generates text and does not embed it; GET /v1/models lists the "
            "embedding models (those whose capabilities include embeddings)",
            field="model",
        )
    return spec


def build_embedding_command(
    body: EmbeddingBody,
    *,
    tenant: str,
    idempotency_key: str | None,
    registry: Registry,
    settings: Settings,
    now: datetime,
    token_counts: list[int] | None,
    timeout_s: float | None = None,
    request_id: Any = None,
    deadline: datetime | None = None,
    **fields: Any,
) -> SubmitCommand:
    """The request one embeddings call asks for. ``token_counts``: each text's exact count,
    where the API holds the model's tokenizer (a text longer than the model takes is refused
    here; otherwise the worker refuses it)."""
    spec = embedding_model(registry, body.model)
    texts = body.texts()
    if body.dimensions is not None:
        native = dimensions_of(spec)
        if body.dimensions != native:
            raise InvalidInput(
                f"{spec.name} gives vectors of {native} dimensions only; it cannot shorten them"
                if native is not None
                else f"the registry does not say the size of {spec.name}'s vectors",
                field="dimensions",
                limit={"dimensions": native},
            )
    chars = sum(len(t) for t in texts)
    if chars > settings.max_input_chars:
        raise InvalidInput(
            f"input is longer than {settings.max_input_chars} characters",
            field="input",
            limit={"max_chars": settings.max_input_chars},
        )
    if token_counts is not None:
        for index, count in enumerate(token_counts):
            if count > spec.context_length:
                field = "input" if isinstance(body.input, str) else f"input[{index}]"
                raise ContextLengthExceeded(
                    f"{field} has {count} tokens, more than the {spec.context_length} "
                    f"{spec.name} takes",
                    field=field,
                    limit={"context_length": spec.context_length, "prompt_tokens": count},
                )
        prompt_tokens = sum(token_counts)
    else:
        prompt_tokens = sum(estimate_tokens(t, None) for t in texts)
    return SubmitCommand(
        id=request_id or uuid7(),
        tenant=tenant,
        model=spec.name,
        lane=fields.pop("lane", None) or Lane.INTERACTIVE,
        input=None,
        messages=None,
        params={"input": texts, "encoding_format": body.encoding_format},
        created_at=now,
        deadline=deadline or deadline_in(timeout_s, settings, now),
        prompt_tokens=prompt_tokens,
        max_tokens=0,  # an encoder generates nothing: its batch costs its prompt tokens
        idempotency_key=check_idempotency_key(idempotency_key),
        fingerprint=fingerprint(body) if idempotency_key is not None else None,
        metadata={"user": body.user} if body.user is not None else None,
        **fields,
    )


def embedding_response(record: RequestRecord) -> bytes:
    """A succeeded embedding request as OpenAI's ``list`` of ``embedding`` objects: the worker
    wrote the ``data`` list in the encoding the call asked for, and it goes out as it is."""
    usage = {"prompt_tokens": record.prompt_tokens or 0, "total_tokens": record.prompt_tokens or 0}
    return b"".join(
        (
            b'{"object":"list","data":',
            (record.output or "[]").encode(),
            b',"model":',
            orjson.dumps(record.model),
            b',"usage":',
            orjson.dumps(usage),
            b"}",
        )
    )
