"""Validation of a batch input file (OpenAI Batch JSONL), line by line, into requests.

Each line is ``{"custom_id", "method": "POST", "url": <the job's endpoint>, "body"}``; the body
is checked exactly as the synchronous endpoint checks it (same schema, same limits, same model
registry). A file with any bad line is refused whole, each error naming its line (1-based).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from pydantic import ValidationError

from batchserve.api.embeddings import EmbeddingBody, build_embedding_command
from batchserve.api.openai_schemas import (
    ChatBody,
    CompletionBody,
    input_name,
    openai_field,
    openai_param,
)
from batchserve.api.submission import build_command
from batchserve.core.bulk import Endpoint, IngestClaim, LineError
from batchserve.core.domain import Lane, SubmitCommand
from batchserve.core.errors import InvalidInput, ModelNotFound
from batchserve.core.ids import job_request_id
from batchserve.core.settings import Settings
from batchserve.models.registry import Registry

MAX_ERRORS = 100  # reported per file; the rest are left unsaid
MAX_CUSTOM_ID = 512


@dataclass(frozen=True, slots=True)
class ValidatedFile:
    """The requests of a valid file, in line order, and its model when there is only one."""

    commands: list[SubmitCommand]
    model: str | None


class _Refused(Exception):
    def __init__(self, code: str, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.error = (code, message, param)


def validate_file(
    content: bytes,
    *,
    claim: IngestClaim,
    registry: Registry,
    settings: Settings,
    now: datetime,
) -> ValidatedFile | list[LineError]:
    """The file's requests, or why it is refused (at most ``MAX_ERRORS`` errors)."""
    validation = FileValidation(content, claim=claim, registry=registry, settings=settings, now=now)
    commands: list[SubmitCommand] = []
    while not validation.done:
        commands += validation.next_chunk(len(content) + 1)
    if validation.errors:
        return validation.errors
    return ValidatedFile(commands, validation.model)


class FileValidation:
    """A batch input file checked a chunk of lines at a time, so that the job driver can write
    the requests of one chunk while it checks the next.

    Once a line is refused no more requests are returned: the file is refused whole, and the
    rest of it is only read for more errors (up to ``MAX_ERRORS``).
    """

    def __init__(
        self,
        content: bytes,
        *,
        claim: IngestClaim,
        registry: Registry,
        settings: Settings,
        now: datetime,
    ) -> None:
        self._claim = claim
        self._registry = registry
        self._settings = settings
        self._now = now
        self._seen: set[str] = set()
        self._models: set[str] = set()
        self.errors: list[LineError] = []
        self.count = 0  # requests found valid so far
        self.done = False
        self._lines: list[bytes] = []
        if len(content) > settings.max_file_bytes:
            self.errors.append(LineError("file_too_large", f"over {settings.max_file_bytes} bytes"))
            self.done = True
        else:
            self._lines = content.split(b"\n")
        self._at = 0  # the next line's index

    @property
    def lines(self) -> int:
        """Non-blank lines in the file: the requests it holds if it is valid."""
        return sum(1 for line in self._lines if line.strip())

    @property
    def model(self) -> str | None:
        """The model every request names, if they all name the same one."""
        return next(iter(self._models)) if len(self._models) == 1 else None

    def next_chunk(self, size: int) -> list[SubmitCommand]:
        """Up to ``size`` more requests, in line order; fewer once the file is through (then
        :attr:`done`), none once any line was refused."""
        chunk: list[SubmitCommand] = []
        limit = self._settings.batch_max_requests
        while self._at < len(self._lines) and len(chunk) < size:
            number, line = self._at + 1, self._lines[self._at]
            self._at += 1
            if not line.strip():
                continue
            if self.count + len(self.errors) >= limit:
                self.errors.append(LineError("too_many_requests", f"over {limit} requests", number))
                self._at = len(self._lines)
                break
            try:
                command = _line(
                    line,
                    number,
                    self._claim,
                    self._registry,
                    self._settings,
                    self._now,
                    self._seen,
                    self.count,
                )
            except _Refused as refused:
                code, message, param = refused.error
                self.errors.append(LineError(code, message, number, param))
                if len(self.errors) >= MAX_ERRORS:
                    self._at = len(self._lines)
                continue
            self.count += 1
            self._models.add(command.model)
            if not self.errors:
                chunk.append(command)
        if self._at >= len(self._lines):
            self.done = True
            if not self.count and not self.errors:
                self.errors.append(LineError("empty_file", "the file has no requests"))
        return [] if self.errors else chunk


def _line(
    raw: bytes,
    number: int,
    claim: IngestClaim,
    registry: Registry,
    settings: Settings,
    now: datetime,
    seen: set[str],
    index: int,
) -> SubmitCommand:
    if len(raw) > settings.batch_max_line_bytes:
        raise _Refused("line_too_large", f"the line is over {settings.batch_max_line_bytes} bytes")
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as error:
        raise _Refused("invalid_json_line", f"the line is not valid JSON: {error}") from error
    if not isinstance(data, dict):
        raise _Refused("invalid_json_line", "the line is not a JSON object")
    custom_id = _custom_id(data, seen)
    if data.get("method") != "POST":
        raise _Refused("invalid_method", "method must be POST", "method")
    if data.get("url") != claim.endpoint.value:
        message = f"url must be the batch's endpoint, {claim.endpoint.value}"
        raise _Refused("invalid_url", message, "url")
    body = data.get("body")
    if not isinstance(body, dict):
        raise _Refused("invalid_request", "body must be a JSON object", "body")
    command = _command(body, registry, settings, now, claim, custom_id, index, number)
    seen.add(custom_id)
    return command


def _custom_id(data: dict[str, Any], seen: set[str]) -> str:
    custom_id = data.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id:
        raise _Refused("invalid_custom_id", "custom_id must be a non-empty string", "custom_id")
    if "\x00" in custom_id:
        raise _Refused(
            "invalid_custom_id", "custom_id must not contain NUL characters", "custom_id"
        )
    if len(custom_id) > MAX_CUSTOM_ID:
        message = f"custom_id is longer than {MAX_CUSTOM_ID} characters"
        raise _Refused("invalid_custom_id", message, "custom_id")
    if custom_id in seen:
        message = f"custom_id {custom_id!r} appears on an earlier line"
        raise _Refused("duplicate_custom_id", message, "custom_id")
    return custom_id


def _command(
    body: dict[str, Any],
    registry: Registry,
    settings: Settings,
    now: datetime,
    claim: IngestClaim,
    custom_id: str,
    index: int,
    line: int,
) -> SubmitCommand:
    # What every line's request shares: its job, its lane, its deadline (the job's window).
    line_fields: dict[str, Any] = {
        "tenant": claim.tenant,
        "idempotency_key": None,
        "registry": registry,
        "settings": settings,
        "now": now,
        "request_id": job_request_id(claim.job_id, index),
        "deadline": claim.expires_at,
        "lane": Lane.BULK,
        "job_id": claim.job_id,
        "custom_id": custom_id,
        "job_line": line,
    }
    try:
        if claim.endpoint is Endpoint.EMBEDDINGS:
            # token_counts=None: the worker refuses a text too long for the model.
            embedding = EmbeddingBody.model_validate(body)
            return build_embedding_command(embedding, token_counts=None, **line_fields)
        schema = ChatBody if claim.endpoint is Endpoint.CHAT else CompletionBody
        return build_command(schema.model_validate(body).to_submit(), **line_fields)
    except ValidationError as error:
        first = error.errors()[0]
        loc = tuple(first.get("loc", ()))
        param = "body." + openai_param(loc, input_name=input_name(claim.endpoint.value))
        raise _Refused("invalid_request", f"{param}: {first.get('msg')}", param) from error
    except ModelNotFound as error:
        raise _Refused("model_not_found", error.message, "body.model") from error
    except InvalidInput as error:
        param = "body." + openai_field(error.field, input_name=input_name(claim.endpoint.value))
        raise _Refused("invalid_request", f"{param}: {error.message}", param) from error
