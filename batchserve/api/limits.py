"""Body size limit, enforced before a byte is parsed (413 problem+json)."""

from __future__ import annotations

import contextlib

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from batchserve.api.openai_errors import OPENAI_PATHS, openai_error
from batchserve.api.problems import problem


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    """Refuses bodies over ``max_bytes``: by ``Content-Length`` at once, or while streaming."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, overrides: dict[str, int] | None = None
    ) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.overrides = overrides or {}  # exact path -> its own limit (file uploads)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if _has_nul(scope):
            path, detail = scope.get("path", ""), "the URL contains a NUL character"
            response = (
                openai_error(400, detail, code="invalid_value", param="url")
                if path.startswith(OPENAI_PATHS)
                else problem(400, "invalid_input", detail, instance=path, field="url")
            )
            await response(scope, receive, send)
            return
        max_bytes = self.overrides.get(scope.get("path", ""), self.max_bytes)
        for name, value in scope.get("headers", ()):
            if name == b"content-length" and value.isdigit() and int(value) > max_bytes:
                await self._refuse(scope, receive, send, max_bytes)
                return
        received = 0
        exceeded = False
        answered = False

        async def limited() -> Message:
            nonlocal received, exceeded
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > max_bytes:
                    exceeded = True
                    raise BodyTooLarge
            return message

        async def guarded(message: Message) -> None:
            nonlocal answered
            if exceeded:
                return  # the route's answer to a body it could not read: the 413 goes instead
            answered = answered or message["type"] == "http.response.start"
            await send(message)

        # A route may catch the error while parsing (FastAPI answers a generic 400 then), so
        # the refusal is decided by what was read, not by where the exception ended up.
        with contextlib.suppress(BodyTooLarge):
            await self.app(scope, limited, guarded)
        if exceeded and not answered:
            await self._refuse(scope, receive, send, max_bytes)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, max_bytes: int) -> None:
        response = problem(
            413,
            "body_too_large",
            f"the request body is larger than {max_bytes} bytes",
            instance=scope.get("path"),
            field="body",
            limit={"max_bytes": max_bytes},
        )
        await response(scope, receive, send)


def _has_nul(scope: Scope) -> bool:
    """A NUL in the path or query string: nothing batchserve stores or looks up can hold one."""
    query = scope.get("query_string", b"").lower()
    return "\x00" in scope.get("path", "") or b"%00" in query or b"\x00" in query
