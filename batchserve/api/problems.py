"""RFC 9457 problem details: every error leaves the API as ``application/problem+json``.

HTTP status codes are chosen here and nowhere else.
"""

from __future__ import annotations

import math
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match

from batchserve.api.openai_errors import OPENAI_CLIENT_PATHS, openai_error
from batchserve.api.responses import JSON
from batchserve.api.statuses import status_for
from batchserve.core.errors import (
    BatchserveError,
    InvalidInput,
    ModelNotFound,
    Overloaded,
    Unauthorized,
    Unavailable,
)
from batchserve.core.logs import get_logger

log = get_logger("batchserve.api")

PROBLEM_JSON = "application/problem+json"

TITLES = {
    400: "Bad request",
    401: "Unauthorized",
    404: "Not found",
    405: "Method not allowed",
    409: "Conflict",
    413: "Request body too large",
    415: "Unsupported media type",
    422: "Invalid request",
    429: "Too many requests",
    500: "Internal server error",
    503: "Service unavailable",
}


def problem(
    status: int,
    code: str,
    detail: str,
    *,
    instance: str | None = None,
    errors: list[dict[str, Any]] | None = None,
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> Response:
    body: dict[str, Any] = {
        "type": f"urn:batchserve:problem:{code}",
        "title": TITLES.get(status, "Error"),
        "status": status,
        "detail": detail,
        "code": code,
    }
    if instance:
        body["instance"] = instance
    if errors:
        body["errors"] = errors
    body.update({k: v for k, v in extra.items() if v is not None})
    return JSON(body, status_code=status, media_type=PROBLEM_JSON, headers=headers)


def _batchserve_error(request: Request, error: BatchserveError) -> Response:
    status = status_for(error)
    headers: dict[str, str] = {}
    errors = None
    extra: dict[str, Any] = {}
    if isinstance(error, InvalidInput):
        errors = [{"field": error.field, "message": error.message, "limit": error.limit}]
        extra["field"] = error.field
        extra["limit"] = error.limit
    if isinstance(error, ModelNotFound):
        errors = [{"field": "model", "message": error.message}]
        extra["field"] = "model"
    if isinstance(error, Overloaded):
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_s)))
        extra.update(error.details)
    if isinstance(error, Unauthorized):
        headers["WWW-Authenticate"] = 'Bearer realm="batchserve"'
    if isinstance(error, Unavailable):
        headers["Retry-After"] = "1"
        extra["component"] = error.component
    if status == 500:
        log.error("unhandled_domain_error", error=error)
    return problem(
        status,
        error.code,
        error.message,
        instance=request.url.path,
        errors=errors,
        headers=headers or None,
        **extra,
    )


def _field(loc: tuple[Any, ...]) -> str:
    """``params.stop``, ``messages.0.content``: the field path, without pydantic's union tags."""
    parts = [
        str(p)
        for p in loc
        if isinstance(p, int) or (str(p).isidentifier() and p not in ("body", "query", "path"))
    ]
    return ".".join(parts) or "body"


def _limit(ctx: dict[str, Any] | None) -> Any:
    if not ctx:
        return None
    for key in ("max_length", "min_length", "le", "ge", "lt", "gt"):
        if key in ctx:
            return {key: ctx[key]}
    return None


def _validation_error(request: Request, error: RequestValidationError) -> Response:
    raw = error.errors()
    if any(e.get("type") == "json_invalid" for e in raw):
        first = next(e for e in raw if e.get("type") == "json_invalid")
        detail = f"the body is not valid JSON: {first.get('ctx', {}).get('error', 'parse error')}"
        return problem(400, "malformed_json", detail, instance=request.url.path)
    errors: list[dict[str, Any]] = []
    for e in raw:
        field = _field(tuple(e.get("loc", ())))
        if any(seen["field"] == field for seen in errors):
            continue  # one entry per field, not one per branch of a union
        errors.append(
            {"field": field, "message": e.get("msg", "invalid"), "limit": _limit(e.get("ctx"))}
        )
    if errors and errors[0]["field"] == "body" and any(e.get("type") == "missing" for e in raw):
        detail = "a JSON body is required"
    else:
        detail = "; ".join(f"{e['field']}: {e['message']}" for e in errors[:5])
    return problem(
        422,
        "invalid_input",
        detail,
        instance=request.url.path,
        errors=errors,
        field=errors[0]["field"],
    )


def _http_error(request: Request, error: StarletteHTTPException) -> Response:
    code = {404: "not_found", 405: "method_not_allowed", 413: "body_too_large"}.get(
        error.status_code, "http_error"
    )
    headers = dict(error.headers) if error.headers else {}
    if error.status_code == 405:
        headers["Allow"] = allowed_methods(request)
    path = request.url.path
    if path.startswith(OPENAI_CLIENT_PATHS):  # an OpenAI client reads OpenAI's shape
        message = str(error.detail)
        if error.status_code in (404, 405):
            message = f"Invalid URL ({request.method} {path})"
        return openai_error(error.status_code, message, code=code, headers=headers or None)
    return problem(
        error.status_code,
        code,
        str(error.detail),
        instance=request.url.path,
        headers=headers or None,
    )


HTTP_METHODS = ("DELETE", "GET", "HEAD", "OPTIONS", "PATCH", "POST", "PUT")


def allowed_methods(request: Request) -> str:
    """Every method some route takes at this path (Starlette's 405 names only those of the first
    route whose path matched, so ``GET /v1/batches`` beside ``POST /v1/batches`` went unsaid):
    each method a route fully matches, asked of every route."""
    routes = request.app.router.routes
    return ", ".join(
        method
        for method in HTTP_METHODS
        if any(
            route.matches({**request.scope, "method": method})[0] is Match.FULL for route in routes
        )
    )


def _unexpected(request: Request, error: Exception) -> Response:
    log.exception("unhandled_error", path=request.url.path)
    return problem(500, "internal_error", "an unexpected error occurred", instance=request.url.path)


def install(app: FastAPI) -> None:
    app.add_exception_handler(BatchserveError, _batchserve_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, _unexpected)
