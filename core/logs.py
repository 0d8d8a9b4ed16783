"""Structured logs: ``event key=value ...`` lines, or JSON lines with ``--log-format json``."""

from __future__ import annotations

import logging
import os
import re
import sys
from typing import Any

import orjson

_PAIR = re.compile(r"(\w+)=(\S+)")


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
            data.setdefault(key, value)
        if rest and not _PAIR.fullmatch(rest.strip()):
            data["message"] = message
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return orjson.dumps(data).decode()


def setup_logging(role: str, *, fmt: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter(role))
    else:
        handler.setFormatter(
            logging.Formatter(f"%(asctime)s %(levelname)s {role}[%(process)d] %(message)s")
        )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("aiormq", "aio_pika", "celery", "kombu", "amqp", "httpx", "uvicorn.access"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
