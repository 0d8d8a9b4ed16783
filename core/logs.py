"""Structured logs: ``event key=value ...`` lines, or JSON lines with ``--log-format json``.

Every line is one event name and its fields. Fields come from three places: ``key=value``
pairs in the message, ``extra={...}`` of the call, and the context bound with :func:`bind`
(the request, batch, attempt, model and tenant being worked on), so that ``grep <request_id>``
over every process's log shows that request's whole history.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import re
import sys
from collections.abc import Iterator
from typing import Any

import orjson

_PAIR = re.compile(r"(\w+)=(\S+)")
_ONLY_PAIRS = re.compile(r"(?:\w+=\S+\s*)*")

# The fields a log line may carry besides its message, from ``extra=`` or the bound context.
CONTEXT_FIELDS = (
    "request_id",
    "request_ids",
    "batch_id",
    "attempt",
    "model",
    "lane",
    "tenant",
    "worker",
    "delivery_id",
)

_context: contextvars.ContextVar[dict[str, Any] | None] = contextvars.ContextVar(
    "batchserve_log_context", default=None
)


@contextlib.contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every log line of this context (this task, this thread) until exit.

    Tasks created inside inherit the fields, as asyncio copies the context into each task.
    """
    current = _context.get() or {}
    token = _context.set({**current, **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _context.reset(token)


def annotate(**fields: Any) -> None:
    """Add ``fields`` to every log line for the rest of this context: use it only in a task
    of its own (a batch's), where the context ends with the task."""
    current = _context.get() or {}
    _context.set({**current, **{k: v for k, v in fields.items() if v is not None}})


def bound() -> dict[str, Any]:
    """The fields bound in this context."""
    return dict(_context.get() or {})


def _fields(record: logging.LogRecord) -> dict[str, Any]:
    fields = dict(_context.get() or {})
    for key in CONTEXT_FIELDS:
        value = record.__dict__.get(key)
        if value is not None:
            fields[key] = value
    return fields


def _json_value(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_value(v) for v in value]
    return str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per line: the event name, the key=value fields as keys, and context."""

    def __init__(self, role: str) -> None:
        super().__init__()
        self.role = role

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        event, _, rest = message.partition(" ")
        data: dict[str, Any] = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "role": self.role,
            "pid": os.getpid(),
            "logger": record.name,
            "event": event,
        }
        for key, value in _PAIR.findall(rest):
            data.setdefault(key, _number(value))
        for key, value in _fields(record).items():
            data.setdefault(key, _json_value(value))
        if isinstance(data.get("request_ids"), str):  # a list, for jq and friends
            data["request_ids"] = data["request_ids"].split(",")
        if rest and not _ONLY_PAIRS.fullmatch(rest.strip()):  # free text besides the fields
            data["message"] = message
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data).decode()


class TextFormatter(logging.Formatter):
    """``time LEVEL role[pid] event key=value ...``, with the bound context appended."""

    def __init__(self, role: str) -> None:
        super().__init__(f"%(asctime)s %(levelname)s {role}[%(process)d] %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        message = record.getMessage()
        extra = [
            f"{key}={_text_value(value)}"
            for key, value in _fields(record).items()
            if f"{key}=" not in message
        ]
        if not extra:
            return line
        head, newline, tail = line.partition("\n")  # keep a traceback below the fields
        return f"{head} {' '.join(extra)}{newline}{tail}"


def _text_value(value: Any) -> str:
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(str(v) for v in value)
    return str(value)


def _number(value: str) -> Any:
    """``attempt=2`` becomes 2 in JSON; ids and names stay strings."""
    if value.isdigit() and len(value) < 16:
        return int(value)
    return value


def setup_logging(role: str, *, fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(role))
    else:
        handler.setFormatter(TextFormatter(role))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiormq", "aio_pika", "celery", "kombu", "amqp", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
