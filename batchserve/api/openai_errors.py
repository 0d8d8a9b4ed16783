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
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException as StarletteHTTPException

from batchserve.api.openai_schemas import openai_field, openai_param
from batchserve.api.problems import status_for
from batchserve.api.responses import JSON
from batchserve.core.domain import ErrorCode, RequestRecord, RequestState
from batchserve.core.errors import (
    BatchserveError,
    IdempotencyConflict,
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
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    409: "invalid_request_error",
}
TYPES |= {413: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error"}
CLIENT_FAULTS = (ErrorCode.CONTEXT_LENGTH_EXCEEDED.value,)


def openai_error(
    status: int,
    message: str,
    *,
    code: str | None = None,
    param: str | None = None,
    headers: dict[str, str] | None = None,
) -> JSON:
    return JSON(error_body(status, message, code, param), status_code=status, headers=headers)


def error_body(status: int, message: str, code: str | None, param: str | None) -> dict[str, Any]:
    type_ = TYPES.get(status, "server_error")
    return {"error": {"message": message, "type": type_, "param": param, "code": code}}


def status_of(error: BatchserveError) -> int:
    """The HTTP status of a domain error on an OpenAI route."""
    if isinstance(error, InvalidInput | IdempotencyConflict):
        return 400
    if isinstance(error, RequestFailed):
        if error.state == RequestState.EXPIRED.value:
            return 504
        if error.state == RequestState.CANCELLED.value:
            return 409
        return 400 if error.error_code in CLIENT_FAULTS else 500
    if isinstance(error, WaitTimedOut):
        return 504
    return status_for(error)


def failure_of(record: RequestRecord) -> RequestFailed:
    """Why a finished request has no answer, as the error a synchronous caller gets."""
    message = record.error_message or f"the request {record.state.value}"
    return RequestFailed(message, error_code=record.error_code, state=record.state.value)


def error_response(error: BatchserveError) -> JSON:
    status = status_of(error)
    headers: dict[str, str] = {}
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
    if isinstance(error, Unavailable):
        headers["Retry-After"] = "1"
    if isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="batchserve"'
    param = openai_field(error.field) if isinstance(error, InvalidInput) else None
    if isinstance(error, ModelNotFound):
        param = "model"
    code = error.code
    if isinstance(error, Unauthorized):
        code = "invalid_api_key"
    if isinstance(error, RequestFailed):
        code = error.error_code or error.state
    if status >= 500 and not isinstance(error, RequestFailed | WaitTimedOut | Unavailable):
        log.error("unhandled_domain_error", error=error)
    return openai_error(status, error.message, code=code, param=param, headers=headers or None)


def validation_response(error: RequestValidationError) -> JSON:
    first = error.errors()[0] if error.errors() else {}
    if first.get("type") == "json_invalid":
        return openai_error(400, "the body is not valid JSON", code="invalid_json")
    loc = tuple(first.get("loc", ()))
    param = openai_param(loc)
    if first.get("type") == "missing":
        message = f"missing required parameter: {param!r}"
    else:
        message = f"invalid value for {param!r}: {first.get('msg', 'invalid')}"
    return openai_error(400, message, code="invalid_value", param=param)


class OpenAIRoute(APIRoute):
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
                return validation_response(error)
            except BatchserveError as error:
                return error_response(error)
            except StarletteHTTPException as error:
                return openai_error(error.status_code, str(error.detail))

        return route
