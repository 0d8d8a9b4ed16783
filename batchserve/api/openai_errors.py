"""Errors on the OpenAI-compatible routes: ``{"error": {"message", "type", "param", "code"}}``.

These routes answer the way OpenAI's API does, so its client libraries raise their usual
exceptions (``BadRequestError``, ``NotFoundError``, ``RateLimitError``...). The status codes
follow the native mapping in ``api.problems`` except where OpenAI's differ: bad input is 400
(not 422), and a request that ended without an answer maps by how it ended.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchserve.api.lean import LeanRoute
from batchserve.api.openai_schemas import input_name, openai_field, openai_param
from batchserve.api.responses import JSON
from batchserve.api.statuses import error_body, status_of
from batchserve.core.errors import (
    BatchserveError,
    InvalidInput,
    ModelNotFound,
    Overloaded,
    RequestFailed,
    Unauthorized,
    Unavailable,
    WaitTimedOut,
)
from batchserve.core.logs import get_logger

log = get_logger("batchserve.api")

ERROR_FORMAT = "x-batchserve-error-format"
# The routes that answer in OpenAI's shape (their bodies' size and JSON refusals too).
OPENAI_PATHS = ("/v1/batches", "/v1/files", "/v1/chat/", "/v1/completions", "/v1/embeddings")
# Where OpenAI's clients call: a path batchserve does not serve there (``/v1/responses``), or a
# method it does not take, is answered in OpenAI's shape too, so the SDK shows the message.
OPENAI_CLIENT_PATHS = (
    *OPENAI_PATHS,
    "/v1/responses",
    "/v1/moderations",
    "/v1/images",
    "/v1/audio",
    "/v1/assistants",
    "/v1/threads",
    "/v1/vector_stores",
    "/v1/fine_tuning",
    "/v1/uploads",
)


def openai_error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSON:
    return JSON(error_body(status, message, code, param), status_code=status, headers=headers)


def error_response(error: BatchserveError, *, input_name: str = "prompt") -> JSON:
    status = status_of(error)
    headers: dict[str, str] = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    if isinstance(error, Unavailable):
        headers["Retry-After"] = "1"
    if isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="batchserve"'
    param = None
    if isinstance(error, InvalidInput):
        param = openai_field(error.field, input_name=input_name)
    if isinstance(error, ModelNotFound):
        param = "model"
    code = error.code
    if isinstance(error, Unauthorized):
        code = "invalid_api_key"
    if isinstance(error, RequestFailed):
        code = error.error_code or error.state
        # The request ended (failed, expired, cancelled): a retry gets the same end (replayed
        # with its Idempotency-Key) or runs it again; OpenAI's SDKs retry a 409 or a 5xx
        # unless told not to.
        headers["x-should-retry"] = "false"
    if status >= 500 and not isinstance(error, RequestFailed | WaitTimedOut | Unavailable):
        log.error("unhandled_domain_error", error=error)
    return openai_error(status, error.message, code=code, param=param, headers=headers or None)


def validation_response(error: RequestValidationError, *, input_name: str = "prompt") -> JSON:
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":
        return openai_error(400, "the body is not valid JSON", code="invalid_json")
    loc = tuple(first.get("loc", ()))
    param = openai_param(loc, input_name=input_name)
    if first.get("type") == "missing":
        message = f"missing required parameter: {param!r}"
    else:
        message = f"invalid value for {param!r}: {first.get('msg', 'invalid')}"
    return openai_error(400, message, code="invalid_value", param=param)


class OpenAIRoute(LeanRoute):
    """A route whose errors leave in OpenAI's shape instead of problem+json."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # Read (and removed) by api.openapi, which documents the error responses.
        self.openapi_extra = {**(self.openapi_extra or {}), ERROR_FORMAT: "openai"}

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def route(request: Request) -> Response:
            try:
                return await handler(request)
            except RequestValidationError as error:
                return validation_response(error, input_name=input_name(request.url.path))
            except BatchserveError as error:
                return error_response(error, input_name=input_name(request.url.path))
            except StarletteHTTPException as error:
                return openai_error(error.status_code, str(error.detail))

        return route
