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

from batchserve.api.batch_schemas import WINDOW, window_spellings
from batchserve.api.openai_errors import ERROR_FORMAT
from batchserve.core.settings import Settings

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


def install(app: FastAPI, settings: Settings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = _document(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


def _document(app: FastAPI, settings: Settings) -> dict[str, Any]:
    document = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        routes=app.routes,
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    _window_choices(schemas, settings)
    _upload_expiry(document, schemas)
    schemas["Problem"] = PROBLEM_SCHEMA
    schemas["OpenAIError"] = OPENAI_ERROR_SCHEMA
    for path, operations in document.get("paths", {}).items():
        if not path.startswith("/v1"):
            continue
        for operation in operations.values():
            _settings_limits(operation, settings)
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
    _links(document, window=f"{settings.batch_max_window_s:.0f}s")
    return document


# What a created resource's id leads to (OpenAPI links): generated clients and stateful
# testers (schemathesis follows them: create -> get -> cancel) see how the routes connect.
# (method, path, status) -> {link name: (method, path, {parameter or "$body.field": source})}
_ID = "$response.body#/id"
LINKS: dict[tuple[str, str, str], dict[str, tuple[str, str, dict[str, str]]]] = {
    ("post", "/v1/requests", "202"): {
        "GetRequest": ("get", "/v1/requests/{request_id}", {"request_id": _ID}),
        "StreamRequest": ("get", "/v1/requests/{request_id}/stream", {"request_id": _ID}),
        "CancelRequest": ("post", "/v1/requests/{request_id}/cancel", {"request_id": _ID}),
        "ListDeliveries": ("get", "/v1/requests/{request_id}/deliveries", {"request_id": _ID}),
    },
    ("post", "/v1/files", "200"): {
        "GetFile": ("get", "/v1/files/{file_id}", {"file_id": _ID}),
        "GetFileContent": ("get", "/v1/files/{file_id}/content", {"file_id": _ID}),
        "DeleteFile": ("delete", "/v1/files/{file_id}", {"file_id": _ID}),
        "CreateBatch": (
            "post",
            "/v1/batches",
            {
                "$body.input_file_id": _ID,
                "$body.endpoint": "/v1/chat/completions",
                "$body.completion_window": "$window",
            },
        ),
    },
    ("post", "/v1/batches", "200"): {
        "GetBatch": ("get", "/v1/batches/{batch_id}", {"batch_id": _ID}),
        "CancelBatch": ("post", "/v1/batches/{batch_id}/cancel", {"batch_id": _ID}),
    },
}


def _upload_expiry(document: dict[str, Any], schemas: dict[str, Any]) -> None:
    """An upload's ``expires_after[anchor]`` only beside ``expires_after[seconds]`` (seconds
    alone anchor at ``created_at``, the one anchor)."""
    body = document["paths"]["/v1/files"]["post"]["requestBody"]["content"]
    ref = body["multipart/form-data"]["schema"]["$ref"].rsplit("/", 1)[1]
    schemas[ref]["dependentRequired"] = {"expires_after[anchor]": ["expires_after[seconds]"]}


def _links(document: dict[str, Any], *, window: str) -> None:
    """``$window``: a completion window the settings allow."""
    paths = document.get("paths", {})
    for (method, path, status), links in LINKS.items():
        response = paths[path][method]["responses"][status]
        response["links"] = {}
        for name, (to_method, to_path, sources) in links.items():
            link: dict[str, Any] = {"operationId": paths[to_path][to_method]["operationId"]}
            parameters = {k: v for k, v in sources.items() if not k.startswith("$body.")}
            body = {
                k.removeprefix("$body."): window if v == "$window" else v
                for k, v in sources.items()
                if k.startswith("$body.")
            }
            if parameters:
                link["parameters"] = parameters
            if body:
                link["requestBody"] = body
            response["links"][name] = link


# The API refuses a URL holding a NUL character (Postgres text cannot store one).
NO_NUL = r"^[^\x00]*$"


def _settings_limits(operation: dict[str, Any], settings: Settings) -> None:
    """Limits the deployment's settings choose, stated where the routes enforce them; and
    no NUL in any path or query string."""
    for parameter in operation.get("parameters", ()):
        schema = parameter.setdefault("schema", {})
        if parameter.get("name") == "wait" and parameter.get("in") == "query":
            schema["maximum"] = settings.max_wait_s
        if parameter.get("in") in ("path", "query"):
            for branch in schema.get("anyOf", [schema]):
                if branch.get("type") == "string" and "format" not in branch:
                    branch.setdefault("pattern", NO_NUL)


def _window_choices(schemas: dict[str, Any], settings: Settings) -> None:
    """``completion_window``: each spelling of the one window allowed (OpenAI's ``24h`` by
    default), or the form and the range where the settings allow several."""
    window = schemas.get("CreateBatch", {}).get("properties", {}).get("completion_window")
    if window is None:
        return
    lo, hi = settings.batch_min_window_s, settings.batch_max_window_s
    spellings = window_spellings(lo) if lo == hi else []
    if spellings:
        window["enum"] = spellings
    else:
        window["pattern"] = WINDOW.pattern
        window["description"] = f"from {lo:g} s to {hi:g} s, e.g. '24h'"
