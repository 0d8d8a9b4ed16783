"""The OpenAPI document, with the error responses the API really sends.

FastAPI documents only a ``422 application/json`` validation error. batchserve answers errors
as ``application/problem+json`` (RFC 9457) on its native routes and as OpenAI's
``{"error": {...}}`` on the OpenAI-compatible ones, with more statuses than 422; this declares
them all, so generated clients and schema checkers (schemathesis runs in the suite) see the
truth.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from batchserve.api.openai_errors import ERROR_FORMAT

PROBLEM_SCHEMA: dict[str, Any] = {
    "title": "Problem",
    "type": "object",
    "description": "RFC 9457 problem details; extra members name the field, limit or estimate",
    "required": ["type", "title", "status", "detail", "code"],
    "properties": {
        "type": {"type": "string"},
        "title": {"type": "string"},
        "status": {"type": "integer"},
        "detail": {"type": "string"},
        "code": {"type": "string"},
        "instance": {"type": "string"},
        "field": {"type": "string"},
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string"}, "message": {"type": "string"}},
            },
        },
    },
    "additionalProperties": True,
}
OPENAI_ERROR_SCHEMA: dict[str, Any] = {
    "title": "OpenAIError",
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "null"]},
            },
        }
    },
}
ERRORS = {
    "400": "Malformed request",
    "401": "No valid API key",
    "404": "No such resource (or another tenant's)",
    "409": "Conflict with the resource's state",
    "413": "Body over the size limit",
    "422": "Invalid input: the field and the limit are named",
    "429": "Over a quota of the caller (Retry-After)",
    "503": "Overloaded or a backing server unavailable (Retry-After)",
}
OPENAI_ERRORS = {**ERRORS, "400": "Invalid request", "500": "The request failed", "504": "Timeout"}
del OPENAI_ERRORS["422"]


def install(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI) -> dict[str, Any]:
    document = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        routes=app.routes,
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    schemas["Problem"] = PROBLEM_SCHEMA
    schemas["OpenAIError"] = OPENAI_ERROR_SCHEMA
    for path, operations in document.get("paths", {}).items():
        if not path.startswith("/v1"):
            continue
        for operation in operations.values():
            openai = operation.pop(ERROR_FORMAT, None) == "openai"
            responses = operation.setdefault("responses", {})
            responses.pop("422", None)
            errors = OPENAI_ERRORS if openai else ERRORS
            media = "application/json" if openai else "application/problem+json"
            ref = "#/components/schemas/" + ("OpenAIError" if openai else "Problem")
            for status, description in errors.items():
                responses.setdefault(
                    status,
                    {"description": description, "content": {media: {"schema": {"$ref": ref}}}},
                )
    return document
