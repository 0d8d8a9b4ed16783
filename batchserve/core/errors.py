"""The one exception hierarchy. HTTP status codes are chosen only in ``api/``."""

from __future__ import annotations

from typing import Any


class BatchserveError(Exception):
    """Base of every error batchserve raises on purpose."""

    code = "internal_error"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class InvalidInput(BatchserveError):
    """The caller sent something we refuse; ``field`` names it, ``limit`` says the bound."""

    code = "invalid_input"

    def __init__(self, message: str, *, field: str, limit: Any = None) -> None:
        super().__init__(message, field=field, limit=limit)
        self.field = field
        self.limit = limit


class UnsafeWebhookUrl(InvalidInput):
    """A webhook URL batchserve refuses to call: a bad scheme or userinfo, or a host that
    resolves to an address inside a private network (the SSRF guard)."""

    code = "unsafe_webhook_url"

    def __init__(self, message: str, field: str = "webhook_url") -> None:
        super().__init__(message, field=field)


class ContextLengthExceeded(InvalidInput):
    """The prompt and the tokens asked for do not fit the model's context."""

    code = "context_length_exceeded"


class Unauthorized(BatchserveError):
    """No API key, or one that is unknown, malformed or revoked."""

    code = "unauthorized"


class NotFound(BatchserveError):
    code = "not_found"


class ModelNotFound(NotFound):
    code = "model_not_found"


class IdempotencyConflict(BatchserveError):
    """Same Idempotency-Key with a different body."""

    code = "idempotency_key_reused"


class IdempotencyInProgress(BatchserveError):
    """Same Idempotency-Key while the first request is still being admitted."""

    code = "idempotency_key_in_use"


class InvalidTransition(BatchserveError):
    """A state change the request's current state does not allow (e.g. cancel a finished one)."""

    code = "invalid_state"


class AlreadyExists(BatchserveError):
    """Creating something that exists already (e.g. a second webhook secret: rotate instead)."""

    code = "already_exists"


class Overloaded(BatchserveError):
    """The service cannot take this now; ``retry_after_s`` says when to try again."""

    code = "overloaded"

    def __init__(self, message: str, *, retry_after_s: float, **details: Any) -> None:
        super().__init__(message, retry_after_s=retry_after_s, **details)
        self.retry_after_s = retry_after_s


class DeadlineUnmeetable(Overloaded):
    """The backlog ahead means this request would finish after its deadline."""

    code = "deadline_unmeetable"


class QuotaExceeded(Overloaded):
    """The caller is over one of its own limits (rate, queued requests)."""

    code = "quota_exceeded"


class Unavailable(BatchserveError):
    """A backing server (database, broker, cache) is unreachable."""

    code = "unavailable"

    def __init__(self, message: str, *, component: str) -> None:
        super().__init__(message, component=component)
        self.component = component


class RequestFailed(BatchserveError):
    """A request a caller waited for ended without an answer (``error_code`` says why)."""

    code = "request_failed"

    def __init__(self, message: str, *, error_code: str | None, state: str) -> None:
        super().__init__(message, error_code=error_code, state=state)
        self.error_code = error_code
        self.state = state


class WaitTimedOut(BatchserveError):
    """A synchronous call's request did not finish in the time the call may wait."""

    code = "timeout"
