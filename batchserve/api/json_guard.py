"""JSON bodies checked before a route sees them, each refusal naming what was wrong.

FastAPI parses a JSON body with :func:`json.loads`, which keeps the last of duplicate keys (a
body that says two things is read as one of them), and answers a generic "error parsing the
body" for text that is not UTF-8, for nesting past the parser's recursion limit and for an
integer of more digits than Python converts. Here each of those is a 400 that says which
rule the body broke and the limit; the route then parses the same bytes as before.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchserve.api.openai_errors import openai_error
from batchserve.api.problems import problem

MAX_DEPTH = 64  # arrays and objects inside each other; the deepest request body nests 6
_BODY_METHODS = {"POST", "PUT", "PATCH"}


class BadJson(ValueError):
    def __init__(self, code: str, detail: str, limit: dict[str, Any] | None = None) -> None:
        super().__init__(detail)
        self.code, self.detail, self.limit = code, detail, limit


def check_json(body: bytes, max_depth: int = MAX_DEPTH) -> None:
    """Raise :class:`BadJson` unless ``body`` is UTF-8 JSON with no duplicate keys, at most
    ``max_depth`` levels deep and integers Python can read."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise BadJson(
            "invalid_encoding", f"the body is not valid UTF-8 (byte {exc.start}: {exc.reason})"
        ) from None
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates)
    except BadJson:
        raise
    except RecursionError:  # deeper than the parser goes: past max_depth too
        raise _too_deep(max_depth) from None
    except json.JSONDecodeError as exc:
        raise BadJson(
            "malformed_json",
            f"the body is not valid JSON: {exc.msg} (line {exc.lineno} column {exc.colno})",
        ) from None
    except ValueError as exc:  # int("9" * 5000): Python's digit limit
        if "digits" not in str(exc):
            raise BadJson("malformed_json", f"the body is not valid JSON: {exc}") from None
        digits = sys.get_int_max_str_digits()
        raise BadJson(
            "number_too_long",
            f"a number in the body has more than {digits} digits",
            {"max_digits": digits},
        ) from None
    if _depth_over(value, max_depth):
        raise _too_deep(max_depth)


def _too_deep(max_depth: int) -> BadJson:
    return BadJson(
        "too_deep",
        f"the body nests arrays and objects deeper than {max_depth} levels",
        {"max_depth": max_depth},
    )


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BadJson("duplicate_key", f"the key {key!r} appears more than once in an object")
        out[key] = value
    return out


def _depth_over(value: Any, max_depth: int) -> bool:
    level: list[Any] = [value]
    for _ in range(max_depth):
        level = [
            child
            for node in level
            if isinstance(node, dict | list)
            for child in (node.values() if isinstance(node, dict) else node)
        ]
        if not level:
            return False
    return any(isinstance(node, dict | list) for node in level)


def _is_json(scope: Scope) -> bool:
    for name, value in scope.get("headers", ()):
        if name == b"content-type":
            media = value.split(b";", 1)[0].strip().lower()
            return media == b"application/json" or media.endswith(b"+json")
    return True  # FastAPI reads a body without a content type as JSON


class JsonBodyGuard:
    """Reads a JSON request's body whole (the size limit outside it bounds it), checks it
    with :func:`check_json` and hands the route the same bytes, or answers 400."""

    def __init__(self, app: ASGIApp, openai_paths: tuple[str, ...]) -> None:
        self.app = app
        self.openai_paths = openai_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in _BODY_METHODS or not _is_json(scope):
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client left: let the route hear it
                await self.app(scope, _replay([message], receive), send)
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        if body:
            try:
                check_json(body)
            except BadJson as bad:
                await self._refuse(scope, bad)(scope, receive, send)
                return
        request: Message = {"type": "http.request", "body": body, "more_body": False}
        await self.app(scope, _replay([request], receive), send)

    def _refuse(self, scope: Scope, bad: BadJson) -> Response:
        path = scope.get("path", "")
        if path.startswith(self.openai_paths):
            return openai_error(400, bad.detail, code=bad.code, param=None)
        return problem(400, bad.code, bad.detail, instance=path, field="body", limit=bad.limit)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    async def replayed() -> Message:
        return messages.pop(0) if messages else await receive()

    return replayed
