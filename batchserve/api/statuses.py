"""The HTTP status and the OpenAI error body of each domain error: plain data, no web framework,
so the roles that write answers outside the API (bulk job output files, webhooks) share them."""

from __future__ import annotations

from typing import Any

from batchserve.core.domain import ErrorCode, RequestRecord, RequestState
from batchserve.core.errors import (
    AlreadyExists,
    BatchserveError,
    IdempotencyConflict,
    IdempotencyInProgress,
    InvalidInput,
    InvalidTransition,
    ModelNotFound,
    NotFound,
    Overloaded,
    QuotaExceeded,
    RequestFailed,
    Unauthorized,
    Unavailable,
    WaitTimedOut,
)

STATUS_BY_ERROR: list[tuple[type[BatchserveError], int]] = [
    (Unauthorized, 401),
    (ModelNotFound, 404),
    (NotFound, 404),
    (InvalidInput, 422),
    (IdempotencyConflict, 422),
    (IdempotencyInProgress, 409),
    (InvalidTransition, 409),
    (AlreadyExists, 409),
    (QuotaExceeded, 429),
    (Overloaded, 503),
    (Unavailable, 503),
]


def status_for(error: BatchserveError) -> int:
    for kind, status in STATUS_BY_ERROR:
        if isinstance(error, kind):
            return status
    return 500


# OpenAI's error types by status.
TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "invalid_request_error",
    405: "invalid_request_error",
    409: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
    429: "rate_limit_error",
}
CLIENT_FAULTS = (ErrorCode.CONTEXT_LENGTH_EXCEEDED.value,)


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
