"""Structured logs: ``event key=value ...`` lines, or JSON lines with ``--log-format json``.

Every line is one event name and its typed fields: ``log.info("batch_done", size=32,
model_ms=101.5)``. Fields come from the call and from the context bound with :func:`bind`
(the request, batch, attempt, model and tenant being worked on), so that ``grep <request_id>``
over every process's log shows that request's whole history. Other libraries' stdlib log
records (uvicorn, celery, aio_pika, ...) go through the same renderer, with the same context.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import os
import re
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import orjson
import structlog
from structlog.contextvars import (
    bind_contextvars,
    bound_contextvars,
    get_contextvars,
    merge_contextvars,
)
from structlog.stdlib import BoundLogger, ProcessorFormatter
from structlog.typing import EventDict, Processor, WrappedLogger

# Libraries whose INFO lines are per message or per request: kept at WARNING.
_NOISY = ("aiormq", "aio_pika", "celery", "kombu", "amqp", "httpx", "uvicorn.access")

# A URL's password (``postgresql://user:PASSWORD@host``), masked wherever a line carries one:
# a field, an error's message, a traceback. A password holds no unescaped ``/?#@``.
_URL_PASSWORD = re.compile(r"(?P<head>\w[\w+.-]*://[^:/@\s\"]*:)[^/?#@\s\"]+@")


def get_logger(name: str) -> BoundLogger:
    """The logger of one part of batchserve: ``log.info("event", key=value, ...)``."""
    logger: BoundLogger = structlog.stdlib.get_logger(name)
    return logger


# A bulk job's cancellation ends thousands at once: log lines stay a few kilobytes.
IDS_PER_LINE = 100


def log_request_ids(logger: BoundLogger, event: str, ids: Sequence[str], **fields: Any) -> None:
    """One line for requests that changed together, their ids listed (``request_ids``, in
    chunks of :data:`IDS_PER_LINE`): a request's history is still one grep by its id, and a
    group costs a line, not a line each. ``event`` is a plain name, as every log call's."""
    for at in range(0, len(ids), IDS_PER_LINE):
        chunk = ids[at : at + IDS_PER_LINE]
        logger.info(event, count=len(chunk), request_ids=list(chunk), **fields)


@contextlib.contextmanager
def bind(**fields: Any) -> Iterator[None]:
    """Add ``fields`` to every log line of this context (this task, this thread) until exit.

    Tasks created inside inherit the fields, as asyncio copies the context into each task.
    """
    with bound_contextvars(**_present(fields)):
        yield


def annotate(**fields: Any) -> None:
    """Add ``fields`` to every log line for the rest of this context: use it only in a task
    of its own (a batch's), where the context ends with the task."""
    bind_contextvars(**_present(fields))


def bound() -> dict[str, Any]:
    """The fields bound in this context."""
    return get_contextvars()


def _present(fields: Mapping[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in fields.items() if value is not None}


def _drop_none(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
    """A field that is None is absent, so that the bound context fills it where it can."""
    return _present(event_dict)


# -- rendering ------------------------------------------------------------------------------


def _stamp(role: str) -> Processor:
    """Put the line's head first: time, level, role, pid, logger name, event."""

    def stamp(_: WrappedLogger, __: str, event_dict: EventDict) -> EventDict:
        record: logging.LogRecord = event_dict.pop("_record")
        event_dict.pop("_from_structlog", None)
        head = {
            "ts": record.created,
            "level": record.levelname.lower(),
            "role": role,
            "pid": record.process or os.getpid(),
            "logger": record.name,
            "event": str(event_dict.pop("event", "")),
        }
        return {**head, **{k: v for k, v in event_dict.items() if k not in head}}

    return stamp


def _redacted(line: str) -> str:
    return _URL_PASSWORD.sub(r"\g<head>***@", line) if "@" in line else line


def _json_value(value: Any) -> Any:
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    if isinstance(value, BaseException):
        return _error_text(value)
    if isinstance(value, enum.Enum):
        return _json_value(value.value)
    if isinstance(value, list | tuple | set | frozenset):
        return [_json_value(v) for v in value]
    if isinstance(value, Mapping):
        return {str(k): _json_value(v) for k, v in value.items()}
    return str(value)


def _error_text(error: BaseException) -> str:
    """``ConnectionError: Connection refused by peer``: the type, and the message whole."""
    message = str(error)
    return f"{type(error).__name__}: {message}" if message else type(error).__name__


def _render_json(_: WrappedLogger, __: str, event_dict: EventDict) -> str:
    data = {key: _json_value(value) for key, value in event_dict.items()}
    if "exception" in data:
        data["exc"] = data.pop("exception")
    return _redacted(orjson.dumps(data).decode())


def _render_text(_: WrappedLogger, __: str, event_dict: EventDict) -> str:
    """``time LEVEL role[pid] event key=value ...``, a traceback below the line."""
    fields = dict(event_dict)
    ts = fields.pop("ts")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    head = (
        f"{when},{int(ts % 1 * 1000):03d} {fields.pop('level').upper()} "
        f"{fields.pop('role')}[{fields.pop('pid')}] {fields.pop('event')}"
    )
    fields.pop("logger")
    traceback = fields.pop("exception", None)
    pairs = "".join(f" {key}={_text_value(value)}" for key, value in fields.items())
    return _redacted(f"{head}{pairs}" + (f"\n{traceback}" if traceback else ""))


# Whitespace (re's \s on a str is what str.isspace() tells), a quote or an equals sign.
_NEEDS_QUOTES = re.compile(r'[\s"=]')


def _text_value(value: Any) -> str:
    if isinstance(value, list | tuple | set | frozenset):
        return ",".join(_text_value(v) for v in value)
    if isinstance(value, BaseException):
        value = _error_text(value)
    elif isinstance(value, enum.Enum):
        value = value.value
    text = str(value)
    if not text or _NEEDS_QUOTES.search(text):
        return orjson.dumps(text).decode()  # quoted, so that a value stays one token
    return text


# Run at the call, in the caller's context: the bound fields and the traceback are taken there.
_AT_CALL: list[Processor] = [
    structlog.stdlib.filter_by_level,
    _drop_none,
    merge_contextvars,
    structlog.processors.format_exc_info,
]

structlog.configure(
    processors=[*_AT_CALL, ProcessorFormatter.wrap_for_formatter],
    logger_factory=structlog.stdlib.LoggerFactory(),
    wrapper_class=BoundLogger,
    cache_logger_on_first_use=True,
)


def formatter(role: str, fmt: str = "text") -> logging.Formatter:
    """The formatter of every line of this process, batchserve's and other libraries'."""
    return ProcessorFormatter(
        foreign_pre_chain=[merge_contextvars, structlog.processors.format_exc_info],
        processors=[_stamp(role), _render_json if fmt == "json" else _render_text],
    )


class _Stderr(logging.StreamHandler):
    """Writes to ``sys.stderr`` as it is when a line is written, not as it was at setup: a
    harness that swaps and closes it (pytest's capture) left a handler writing to a closed file
    ("I/O operation on closed file" from a thread logging later)."""

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        pass


def setup_logging(role: str, *, fmt: str = "text", level: str = "INFO") -> None:
    handler = _Stderr()
    handler.setFormatter(formatter(role, fmt))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in _NOISY:
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
