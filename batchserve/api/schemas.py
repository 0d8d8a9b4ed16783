"""Request and response bodies of the ``/v1`` API."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StringConstraints,
    WithJsonSchema,
    model_validator,
)
from pydantic import Strict as StrictMode

from batchserve.core.domain import AttemptRecord, DeliveryRecord, RequestRecord
from batchserve.core.ssrf import WEBHOOK_URL_PATTERN

MAX_STOP_SEQUENCES = 4
MAX_MESSAGES = 256
MAX_TOKENS = 32_768
# The largest seed every JSON client carries exactly (JavaScript's Number.MAX_SAFE_INTEGER).
MAX_SEED = 2**53 - 1


def _integral(value: Any) -> Any:
    """JSON has one number type: ``10.0`` is the integer 10 (JSON Schema agrees); ``10.5``,
    ``"10"`` and ``true`` are not integers."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value


# An integer, strictly: a string or a bool is refused, an integral float taken. Constraints
# go inside the Annotated, before the validator, or the document loses them.
JsonInt = Annotated[int, StrictMode(), BeforeValidator(_integral)]
MaxTokens = Annotated[int, StrictMode(), Field(ge=1, le=MAX_TOKENS), BeforeValidator(_integral)]
Seed = Annotated[int, StrictMode(), Field(ge=0, le=MAX_SEED), BeforeValidator(_integral)]
MAX_METADATA_KEYS = 16

WebhookUrl = Annotated[
    str,
    StringConstraints(min_length=1, max_length=2048),
    Field(
        json_schema_extra={
            "pattern": WEBHOOK_URL_PATTERN,
            "description": (
                "http(s) URL whose host (an IP or a DNS name) is a public address: checked at "
                "submission and again at delivery"
            ),
        }
    ),
]
StopText = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetaKey = Annotated[str, StringConstraints(min_length=1, max_length=64)]
MetaValue = Annotated[str, StringConstraints(max_length=512)]


class Strict(BaseModel):
    """An input body: unknown fields refused; its numbers and booleans are typed strictly
    (``JsonInt``, ``StrictFloat``: ``"10"`` is not a number, ``true`` is not an integer)."""

    model_config = ConfigDict(extra="forbid", strict=False)


class ChatMessage(Strict):
    role: Literal["system", "user", "assistant"]
    content: Annotated[str, StringConstraints(max_length=200_000)]


MAX_LOGIT_BIAS = 300  # OpenAI's limit on logit_bias entries
MAX_TOP_K = 1000
TokenId = Annotated[str, StringConstraints(pattern=r"^[0-9]{1,9}$")]
Bias = Annotated[float, StrictMode(), Field(ge=-100.0, le=100.0)]
Penalty = Annotated[float, StrictMode(), Field(ge=-2.0, le=2.0)]


LogitBias = Annotated[
    dict[TokenId, Bias],
    Field(max_length=MAX_LOGIT_BIAS),
    # Every key a token id: no other key is valid (the document says so, not only the code).
    WithJsonSchema(
        {
            "type": "object",
            "maxProperties": MAX_LOGIT_BIAS,
            "propertyNames": {"pattern": "^[0-9]{1,9}$"},
            "additionalProperties": {"type": "number", "minimum": -100, "maximum": 100},
        }
    ),
]


class JsonSchemaFormat(Strict):
    """OpenAI's ``response_format.json_schema``: the schema the answer must follow."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    name: Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_-]{1,64}$")]
    description: str | None = None
    # ``schema`` shadows a BaseModel attribute: the field has another name, the JSON this one.
    json_schema: dict[str, Any] = Field(default_factory=dict, alias="schema")
    # Honoured either way: the grammar admits only what the schema does.
    strict: StrictBool | None = None


class ResponseFormat(Strict):
    """OpenAI's ``response_format``: plain text, any JSON object, or JSON of a schema, decoded
    under a grammar (the transformers engine: llguidance; vLLM: its structured outputs)."""

    model_config = ConfigDict(
        extra="forbid",
        # json_schema with type json_schema, and only then.
        json_schema_extra={
            "anyOf": [
                {
                    "properties": {
                        "type": {"enum": ["text", "json_object"]},
                        "json_schema": {"type": "null"},
                    }
                },
                {
                    "properties": {
                        "type": {"const": "json_schema"},
                        "json_schema": {"type": "object"},
                    },
                    "required": ["json_schema"],
                },
            ]
        },
    )

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given with type json_schema, and only then")
        return self

    def stored(self) -> dict[str, Any] | None:
        """What the request keeps (``None`` for plain text)."""
        if self.type == "text":
            return None
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)


# The generation fields past the basic ones: a backend honours them or the request is refused
# (``BackendPlugin.sampling``), with each one's value that changes nothing.
EXTENDED_DEFAULTS: dict[str, Any] = {
    "top_k": 0,
    "min_p": 0.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "logit_bias": None,
    "min_tokens": 0,
    "response_format": None,
}


class GenerationParams(Strict):
    # None: the model's max_new_tokens, bounded by the context left after the prompt.
    max_tokens: MaxTokens | None = Field(
        default=None,
        description="Tokens to generate at most. Default: the model's max_new_tokens, bounded "
        "by the context left after the prompt.",
    )
    temperature: StrictFloat = Field(default=1.0, ge=0.0, le=2.0)
    top_p: StrictFloat = Field(default=1.0, gt=0.0, le=1.0)
    stop: Annotated[list[StopText], Field(max_length=MAX_STOP_SEQUENCES)] | StopText | None = None
    seed: Seed | None = None
    # Generate all of max_tokens even past an end-of-sequence token (vLLM's parameter; load
    # tests use it for answers of a known length).
    ignore_eos: StrictBool = False
    # Sampling: the most likely k tokens only (0: all); tokens at least min_p times as likely
    # as the most likely one.
    top_k: JsonInt = Field(default=0, ge=0, le=MAX_TOP_K)
    min_p: StrictFloat = Field(default=0.0, ge=0.0, le=1.0)
    # OpenAI's: minus presence once, frequency per time, for each token generated so far.
    presence_penalty: Penalty = 0.0
    frequency_penalty: Penalty = 0.0
    # vLLM's (and transformers'): a token already in the prompt or the answer has its logit
    # divided by this (multiplied, if negative).
    repetition_penalty: StrictFloat = Field(default=1.0, gt=0.0, le=2.0)
    # Token id (a string, as OpenAI's JSON has it) -> added to its logit.
    logit_bias: LogitBias | None = None
    # No end of sequence before this many tokens (vLLM's parameter).
    min_tokens: JsonInt = Field(default=0, ge=0, le=MAX_TOKENS)
    response_format: ResponseFormat | None = None

    def stop_list(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)


class SubmitRequest(Strict):
    """``POST /v1/requests``: exactly one of ``input`` and ``messages`` (checked at admission,
    so the problem names the field; the document says so with a ``oneOf``)."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "oneOf": [
                {"required": ["input"], "properties": {"input": {"type": "string"}}},
                {"required": ["messages"], "properties": {"messages": {"type": "array"}}},
            ],
            # At most one of timeout_s and deadline.
            "anyOf": [
                {"properties": {"timeout_s": {"type": "null"}}},
                {"properties": {"deadline": {"type": "null"}}},
            ],
        },
    )

    model: Annotated[str, StringConstraints(min_length=1, max_length=128)]
    input: Annotated[str, StringConstraints(min_length=1)] | None = None
    messages: Annotated[list[ChatMessage], Field(min_length=1, max_length=MAX_MESSAGES)] | None = (
        None
    )
    params: GenerationParams = Field(default_factory=GenerationParams)
    timeout_s: StrictFloat | None = Field(default=None, gt=0)
    deadline: datetime | None = None
    webhook_url: WebhookUrl | None = None
    lane: Literal["interactive", "bulk"] = "interactive"
    metadata: Annotated[dict[MetaKey, MetaValue], Field(max_length=MAX_METADATA_KEYS)] | None = None


class Output(BaseModel):
    text: str
    finish_reason: str | None


class ErrorInfo(BaseModel):
    code: str
    message: str | None


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class TimingsOut(BaseModel):
    queued_ms: float
    batch_wait_ms: float
    model_ms: float
    total_ms: float
    # Acceptance to the first token (to the whole answer for a model that makes it at once).
    ttft_ms: float | None = None


class RequestOut(BaseModel):
    id: str
    object: Literal["request"] = "request"
    status: str
    model: str
    lane: str
    created_at: datetime
    deadline: datetime
    finished_at: datetime | None
    # When a finished request is deleted (BATCHSERVE_REQUEST_RETENTION_S after it finished).
    expires_at: datetime | None
    attempts: int
    batch_id: str | None
    output: Output | None
    error: ErrorInfo | None
    usage: Usage | None
    timings: TimingsOut | None
    metadata: dict[str, str] | None

    @classmethod
    def of(cls, record: RequestRecord, *, retention_s: float) -> RequestOut:
        """The request as the API shows it; ``retention_s``: how long a finished request is
        kept (``Settings.request_retention_s``)."""
        usage = None
        if record.prompt_tokens is not None and record.completion_tokens is not None:
            usage = Usage(
                prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens,
                total_tokens=record.prompt_tokens + record.completion_tokens,
            )
        timings = None
        if record.timings is not None:
            timings = TimingsOut(
                queued_ms=round(record.timings.queued_ms, 3),
                batch_wait_ms=round(record.timings.batch_wait_ms, 3),
                model_ms=round(record.timings.model_ms, 3),
                total_ms=round(record.timings.total_ms, 3),
                ttft_ms=None
                if record.timings.ttft_ms is None
                else round(record.timings.ttft_ms, 3),
            )
        return cls(
            id=str(record.id),
            status=record.state.value,
            model=record.model,
            lane=record.lane.value,
            created_at=record.created_at,
            deadline=record.deadline,
            finished_at=record.finished_at,
            expires_at=None
            if record.finished_at is None
            else record.finished_at + timedelta(seconds=retention_s),
            attempts=record.attempts,
            batch_id=str(record.batch_id) if record.batch_id else None,
            output=Output(text=record.output, finish_reason=record.finish_reason)
            if record.output is not None
            else None,
            error=ErrorInfo(code=record.error_code, message=record.error_message)
            if record.error_code
            else None,
            usage=usage,
            timings=timings,
            metadata=record.metadata,
        )


class RequestList(BaseModel):
    object: Literal["list"] = "list"
    data: list[RequestOut]
    has_more: bool
    next_cursor: str | None


class ModelOut(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0  # OpenAI's Model object has it; the registry has no creation time
    owned_by: str = "batchserve"
    backend: str
    max_batch_size: int
    max_batch_delay_ms: float | None
    max_batch_tokens: int | None
    context_length: int
    max_new_tokens: int
    policy: str
    description: str
    # ``batch``: a batch runs as a unit; ``engine``: continuous batching, capacity in sequences.
    kind: str = "batch"
    # The routes the model answers: ``["chat", "completions"]`` for a generative model,
    # ``["embeddings"]`` for an encoder (whose vectors have ``dimensions`` numbers).
    capabilities: list[str] = ["chat", "completions"]
    dimensions: int | None = None
    # What the batcher believes a batch (engine models: a sequence) takes now, and where that
    # comes from (``fixed``, ``engine-profile``, ``learned``); null without a live batcher.
    estimate: dict[str, Any] | None = None
    # Live capacity: slots, or an engine model's sequences and KV tokens (total and free).
    capacity: dict[str, Any] | None = None


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelOut]


def dump(model: BaseModel) -> dict[str, Any]:
    return model.model_dump(mode="json")


class AttemptOut(BaseModel):
    number: int
    at: datetime
    status_code: int | None
    error: str | None
    duration_ms: float | None

    @classmethod
    def of(cls, attempt: AttemptRecord) -> AttemptOut:
        return cls(
            number=attempt.number,
            at=attempt.started_at,
            status_code=attempt.status_code,
            error=attempt.error,
            duration_ms=attempt.duration_ms,
        )


class DeliveryOut(BaseModel):
    """A webhook delivery of a request; ``id`` is the ``webhook-id`` header of every attempt."""

    id: str
    object: Literal["webhook_delivery"] = "webhook_delivery"
    event_type: str
    url: str
    status: str
    created_at: datetime
    finished_at: datetime | None
    next_attempt_at: datetime | None
    error: str | None
    attempts: list[AttemptOut]

    @classmethod
    def of(cls, delivery: DeliveryRecord) -> DeliveryOut:
        return cls(
            id=delivery.id,
            event_type=delivery.event_type,
            url=delivery.url,
            status=delivery.status.value,
            created_at=delivery.created_at,
            finished_at=delivery.finished_at,
            next_attempt_at=delivery.next_attempt_at,
            error=delivery.error,
            attempts=[AttemptOut.of(a) for a in delivery.attempt_log],
        )


class DeliveryList(BaseModel):
    object: Literal["list"] = "list"
    data: list[DeliveryOut]


class WebhookSecretOut(BaseModel):
    """A tenant's signing secret: metadata, and the secret itself only when just made."""

    object: Literal["webhook_secret"] = "webhook_secret"
    secret: str | None = None
    created_at: datetime
    previous_expires_at: datetime | None


class EnableEndpoint(Strict):
    url: WebhookUrl


class EndpointOut(BaseModel):
    object: Literal["webhook_endpoint"] = "webhook_endpoint"
    url: str
    enabled: bool
    was_disabled: bool
