"""The OpenAI request and response shapes of ``/v1/chat/completions`` and ``/v1/completions``,
and their translation to and from batchserve's own request (so the same limits apply).

Every field is honoured or refused with a 400 naming it; none is dropped. The fields OpenAI
defines that batchserve does not implement are taken only at the value that changes nothing
(``store: false``, ``tool_choice: "none"``, ...: :data:`INERT`), and an unknown field is
refused.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictStr,
    ValidationError,
)

from batchserve.api.schemas import (
    EXTENDED_DEFAULTS,
    MAX_MESSAGES,
    GenerationParams,
    JsonInt,
    SubmitRequest,
)
from batchserve.core.domain import RequestRecord, to_epoch
from batchserve.core.errors import InvalidInput


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool | None = None


def documented(default: Any = ..., **limits: Any) -> Any:
    """A field whose ``limits`` (JSON Schema keywords) the document states and the code that
    translates or refuses the request checks."""
    return Field(default, json_schema_extra=limits)


_NOT_LIMITS = ("title", "default", "type")


def checked_as(model: type[BaseModel], field: str, default: Any = ...) -> Any:
    """A field the translated request checks as ``model.field``: the document states that
    field's limits, taken from its JSON Schema (less its title, default and type; the models
    it refers to written out, as this document does not hold them)."""
    schema = model.model_json_schema()
    native = _inline(schema["properties"][field], schema.get("$defs", {}))
    return documented(default, **{k: v for k, v in native.items() if k not in _NOT_LIMITS})


def _inline(schema: Any, defs: dict[str, Any]) -> Any:
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in schema.items()}
    if isinstance(schema, list):
        return [_inline(item, defs) for item in schema]
    return schema


# The OpenAI fields that are the native request's params of the same name.
PASSED_THROUGH = ("temperature", "top_p", "stop", "seed", "ignore_eos", *EXTENDED_DEFAULTS)

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _absent(value: Any) -> bool:
    return value is None or value == [] or value == {}


# OpenAI's fields that batchserve does not implement, and the values at which they change
# nothing (an SDK or framework may send them so): taken then, refused otherwise.
INERT: dict[str, Any] = {
    "store": lambda v: v in (None, False),
    "service_tier": lambda v: v in (None, "auto", "default"),
    "parallel_tool_calls": lambda v: v is None or isinstance(v, bool),  # no tools: moot
    "tool_choice": lambda v: v in (None, "none", "auto"),
    "functions": _absent,
    "function_call": lambda v: v in (None, "none", "auto"),
    "top_logprobs": lambda v: v in (None, 0),
    "modalities": lambda v: v is None or v in ([], ["text"]),
    "audio": _absent,
    "prediction": _absent,
    "reasoning_effort": _absent,
    "web_search_options": _absent,
    "verbosity": _absent,
    "prompt_cache_key": lambda v: v is None or isinstance(v, str),  # a cache hint
    "safety_identifier": lambda v: v is None or isinstance(v, str),
}


class OpenAIBody(BaseModel):
    """Fields both endpoints share. Limits are checked on the translated request."""

    model_config = ConfigDict(
        extra="forbid",
        # stream_options only beside stream=true (refuse_unsupported refuses it otherwise).
        json_schema_extra={
            "anyOf": [
                {"properties": {"stream_options": {"type": "null"}}},
                {"required": ["stream"], "properties": {"stream": {"const": True}}},
            ]
        },
    )

    # The limits are checked on the translated request (or by refuse_unsupported, which says
    # why), so each refusal names the field as the caller sent it; the document states them
    # here, so a client generated from it never sends what is refused.
    model: str = checked_as(SubmitRequest, "model")
    max_tokens: JsonInt | None = checked_as(GenerationParams, "max_tokens", None)
    max_completion_tokens: JsonInt | None = checked_as(GenerationParams, "max_tokens", None)
    temperature: StrictFloat | None = checked_as(GenerationParams, "temperature", None)
    top_p: StrictFloat | None = checked_as(GenerationParams, "top_p", None)
    stop: str | list[str] | None = checked_as(GenerationParams, "stop", None)
    seed: JsonInt | None = checked_as(GenerationParams, "seed", None)
    ignore_eos: StrictBool | None = None  # vLLM's extension
    top_k: JsonInt | None = checked_as(GenerationParams, "top_k", None)  # vLLM's
    min_p: StrictFloat | None = checked_as(GenerationParams, "min_p", None)  # vLLM's
    presence_penalty: StrictFloat | None = checked_as(GenerationParams, "presence_penalty", None)
    frequency_penalty: StrictFloat | None = checked_as(GenerationParams, "frequency_penalty", None)
    repetition_penalty: StrictFloat | None = checked_as(
        GenerationParams, "repetition_penalty", None
    )  # vLLM's
    logit_bias: dict[str, Any] | None = checked_as(GenerationParams, "logit_bias", None)
    min_tokens: JsonInt | None = checked_as(GenerationParams, "min_tokens", None)  # vLLM's
    response_format: dict[str, Any] | None = checked_as(GenerationParams, "response_format", None)
    # OpenAI's end-user id: kept as the request's metadata ``user``.
    user: StrictStr | None = documented(None, maxLength=512)
    n: JsonInt | None = documented(None, minimum=1, maximum=1)
    # OpenAI's fields taken only at the value that changes nothing (INERT says which).
    store: Any = documented(None, enum=[False, None])
    service_tier: Any = documented(None, enum=["auto", "default", None])
    parallel_tool_calls: Any = documented(None, type=["boolean", "null"])
    tool_choice: Any = documented(None, enum=["none", "auto", None])
    functions: Any = documented(None, type=["array", "null"], maxItems=0)
    function_call: Any = documented(None, enum=["none", "auto", None])
    top_logprobs: Any = documented(None, enum=[0, None])
    modalities: Any = documented(None, type=["array", "null"], items={"enum": ["text"]}, maxItems=1)
    audio: Any = documented(None, type="null")
    prediction: Any = documented(None, type="null")
    reasoning_effort: Any = documented(None, type="null")
    web_search_options: Any = documented(None, type="null")
    verbosity: Any = documented(None, type="null")
    prompt_cache_key: Any = documented(None, type=["string", "null"])
    safety_identifier: Any = documented(None, type=["string", "null"])
    stream: StrictBool | None = None
    stream_options: StreamOptions | None = None
    logprobs: Any = documented(None, enum=[False, None])
    metadata: dict[str, str] | None = checked_as(SubmitRequest, "metadata", None)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    def refuse_unsupported(self, *, can_stream: bool) -> None:
        if self.stream and not can_stream:
            raise InvalidInput(
                "stream=true is not supported in a batch job: its answers go to its output file",
                field="stream",
            )
        if self.stream_options is not None and not self.stream:
            raise InvalidInput(
                "stream_options is only allowed with stream=true", field="stream_options"
            )
        if self.n is not None and self.n != 1:
            raise InvalidInput("only n=1 is supported", field="n", limit={"le": 1})
        if self.logprobs:
            raise InvalidInput("logprobs are not supported", field="logprobs")
        for name, inert in INERT.items():
            if not inert(getattr(self, name)):
                raise InvalidInput(
                    f"{name} is not supported (only at the value that changes nothing)",
                    field=name,
                )

    def params(self) -> dict[str, Any]:
        """The native ``params`` of the fields sent (``max_completion_tokens`` over
        ``max_tokens``)."""
        sent = {name: getattr(self, name) for name in ("max_tokens", *PASSED_THROUGH)}
        sent["max_tokens"] = self.max_completion_tokens or self.max_tokens
        return {name: value for name, value in sent.items() if value is not None}


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra={"required": ["type", "text"]})

    type: str = documented(enum=["text"])
    text: str | None = documented(None, type="string")


class Message(BaseModel):
    """A chat message. The chat templates render a role and a text: a message's name, tool
    calls or audio would be dropped, so they are refused (a null or empty one is taken)."""

    model_config = ConfigDict(extra="forbid")

    role: str = documented(enum=list(ROLES))
    content: str | list[ContentPart] | None = None
    name: Any = documented(None, type="null")
    tool_calls: Any = documented(None, type=["array", "null"], maxItems=0)
    tool_call_id: Any = documented(None, type="null")
    function_call: Any = documented(None, type="null")
    refusal: Any = documented(None, type="null")
    audio: Any = documented(None, type="null")

    def refuse_unsupported(self, index: int) -> None:
        for name in ("name", "tool_calls", "tool_call_id", "function_call", "refusal", "audio"):
            if not _absent(getattr(self, name)):
                raise InvalidInput(
                    f"{name} on a message is not supported (the chat template renders a role "
                    "and a text)",
                    field=f"messages[{index}].{name}",
                )


class ChatBody(OpenAIBody):
    """``POST /v1/chat/completions``."""

    messages: list[Message] = documented(minItems=1, maxItems=MAX_MESSAGES)
    tools: list[Any] | None = documented(None, maxItems=0)

    def to_submit(
        self, *, timeout_s: float | None = None, can_stream: bool = False
    ) -> SubmitRequest:
        """The native request this asks for; ``can_stream``: ``stream`` may be true (the
        synchronous endpoints stream; a batch job's line may not)."""
        self.refuse_unsupported(can_stream=can_stream)
        if self.tools:
            raise InvalidInput("tools are not supported", field="tools")
        for i, message in enumerate(self.messages):
            message.refuse_unsupported(i)
        messages = [
            {"role": _role(m.role, i), "content": _text(m, i)} for i, m in enumerate(self.messages)
        ]
        return _submit(self, {"messages": messages}, timeout_s)


class CompletionBody(OpenAIBody):
    """``POST /v1/completions``."""

    prompt: str | list[str] = documented(
        anyOf=[
            {"type": "string", "minLength": 1},
            {
                "type": "array",
                "items": {"type": "string", "minLength": 1},
                "minItems": 1,
                "maxItems": 1,
            },
        ]
    )
    echo: StrictBool | None = documented(None, enum=[False, None])
    best_of: JsonInt | None = documented(None, minimum=1, maximum=1)
    suffix: str | None = documented(None, maxLength=0)

    def to_submit(
        self, *, timeout_s: float | None = None, can_stream: bool = False
    ) -> SubmitRequest:
        """The native request this asks for; ``can_stream``: ``stream`` may be true (the
        synchronous endpoints stream; a batch job's line may not)."""
        self.refuse_unsupported(can_stream=can_stream)
        if self.echo:
            raise InvalidInput("echo=true is not supported", field="echo")
        if self.best_of is not None and self.best_of != 1:
            raise InvalidInput("only best_of=1 is supported", field="best_of", limit={"le": 1})
        if self.suffix:
            raise InvalidInput("suffix is not supported", field="suffix")
        prompt = self.prompt
        if isinstance(prompt, list):
            if len(prompt) != 1:
                raise InvalidInput(
                    "give one prompt per request (a list of one string at most)", field="prompt"
                )
            prompt = prompt[0]
        return _submit(self, {"input": prompt}, timeout_s)


def _role(role: str, index: int) -> str:
    mapped = ROLES.get(role)
    if mapped is None:
        raise InvalidInput(
            f"role {role!r} is not supported (system, developer, user, assistant)",
            field=f"messages[{index}].role",
        )
    return mapped


def _text(message: Message, index: int) -> str:
    if isinstance(message.content, str):
        return message.content
    if message.content is None:
        return ""
    parts = []
    for part in message.content:
        if part.type != "text" or part.text is None:
            raise InvalidInput(
                f"content parts of type {part.type!r} are not supported (text only)",
                field=f"messages[{index}].content",
            )
        parts.append(part.text)
    return "".join(parts)


def _submit(body: OpenAIBody, prompt: dict[str, Any], timeout_s: float | None) -> SubmitRequest:
    data: dict[str, Any] = {"model": body.model, "params": body.params(), **prompt}
    if body.metadata is not None or body.user is not None:
        user = {"user": body.user} if body.user is not None else {}
        data["metadata"] = {**user, **(body.metadata or {})}
    if timeout_s is not None:
        data["timeout_s"] = timeout_s
    try:
        return SubmitRequest.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        raise InvalidInput(
            str(first.get("msg", "invalid")),
            field=openai_param(tuple(first.get("loc", ())), body),
        ) from error


_NAME = re.compile(r"[A-Za-z_]\w*(\[[A-Za-z_]\w*\])*")


def openai_param(
    loc: tuple[Any, ...], body: OpenAIBody | None = None, *, input_name: str = "prompt"
) -> str:
    """``params.max_tokens`` -> ``max_tokens``, ``messages.0.content`` -> ``messages[0].content``:
    the field as the OpenAI caller named it. ``input_name``: what the endpoint calls the native
    ``input`` (a completion's ``prompt``; embeddings keep ``input``)."""
    parts = [p for p in loc if p not in ("body", "query", "path", "params")]
    if parts and parts[0] == "input":
        parts[0] = input_name
    if parts == ["max_tokens"] and body is not None and body.max_completion_tokens:
        parts = ["max_completion_tokens"]
    name = ""
    for part in parts:
        if isinstance(part, int):
            name += f"[{part}]"
        elif _NAME.fullmatch(str(part)):  # a form field may be `expires_after[seconds]`
            name += f".{part}" if name else str(part)
    return name or "body"


def input_name(path: str) -> str:
    """What an OpenAI route calls its text: embeddings' ``input``, a completion's ``prompt``."""
    return "input" if path.endswith("/embeddings") else "prompt"


def openai_field(field: str, *, input_name: str = "prompt") -> str:
    """A native field name (``params.max_tokens``, ``input``) as the OpenAI caller knows it."""
    field = field.removeprefix("params.")
    return input_name if field == "input" else field


def usage(record: RequestRecord) -> dict[str, int]:
    prompt, completion = record.prompt_tokens or 0, record.completion_tokens or 0
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def finish_reason(record: RequestRecord) -> Literal["stop", "length"]:
    return "length" if record.finish_reason == "length" else "stop"


def chat_completion(record: RequestRecord) -> dict[str, Any]:
    """A succeeded request as OpenAI's ``chat.completion`` object."""
    return {
        "id": f"chatcmpl-{record.id.hex}",
        "object": "chat.completion",
        "created": int(to_epoch(record.created_at)),
        "model": record.model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": record.output or "", "refusal": None},
                "finish_reason": finish_reason(record),
                "logprobs": None,
            }
        ],
        "usage": usage(record),
        "system_fingerprint": None,
    }


def text_completion(record: RequestRecord) -> dict[str, Any]:
    """A succeeded request as OpenAI's ``text_completion`` object."""
    return {
        "id": f"cmpl-{record.id.hex}",
        "object": "text_completion",
        "created": int(to_epoch(record.created_at)),
        "model": record.model,
        "choices": [
            {
                "index": 0,
                "text": record.output or "",
                "finish_reason": finish_reason(record),
                "logprobs": None,
            }
        ],
        "usage": usage(record),
        "system_fingerprint": None,
    }
