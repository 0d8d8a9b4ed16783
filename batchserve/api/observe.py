"""Counting refused submissions by reason, whichever layer refused them.

A submission can be refused by the body-size guard, by validation, by admission (quotas, the
backlog bound, a deadline it cannot meet) or by an unreachable database; each answers a
problem document whose ``code`` names the reason. This middleware reads that code, so the
count needs no hook in each of those layers.
"""

from __future__ import annotations

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchserve.core.ids import uuid7
from batchserve.core.logs import bind
from batchserve.core.metrics import metrics

# Where a client submits work; a refusal there is a rejection.
SUBMIT_PATHS = frozenset({"/v1/requests", "/v1/chat/completions", "/v1/completions", "/v1/batches"})
# Statuses that refuse a submission (a failure after acceptance, 500 or 504, is no refusal).
REFUSALS = frozenset({400, 401, 403, 404, 409, 413, 415, 422, 429, 503})


class RejectionCounter:
    """Counts ``batchserve_rejections_total{reason}`` for refused submissions."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope.get("method") != "POST"
            or scope.get("path") not in SUBMIT_PATHS
        ):
            await self.app(scope, receive, send)
            return
        status = 0
        body = bytearray()

        async def watching(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            elif message["type"] == "http.response.body" and status in REFUSALS:
                body.extend(message.get("body", b""))
                if not message.get("more_body", False):
                    metrics().rejections.labels(_reason(status, bytes(body))).inc()
            await send(message)

        await self.app(scope, receive, watching)


def _reason(status: int, body: bytes) -> str:
    """The problem's ``code`` (or, on the OpenAI routes, ``error.code``), else the status."""
    try:
        document = orjson.loads(body)
    except orjson.JSONDecodeError:
        return str(status)
    if isinstance(document, dict):
        code = document.get("code")
        error = document.get("error")
        if code is None and isinstance(error, dict):
            code = error.get("code") or error.get("type")
        if isinstance(code, str) and code:
            return code[:64]
    return str(status)


class RequestIdHeader:
    """Every answer carries ``x-request-id``: a fresh id per HTTP request (OpenAI's clients
    show it in their errors), bound to the log lines written while serving it, so a support
    question that quotes it finds them."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"req_{uuid7().hex}"

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        with bind(http_request=request_id):
            await self.app(scope, receive, stamped)
