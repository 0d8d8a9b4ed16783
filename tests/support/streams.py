"""What a client of a request's stream ends with: the text of its ``delta`` events, started
over at each ``reset``."""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol


class AnEvent(Protocol):
    @property
    def event(self) -> str: ...

    @property
    def data(self) -> dict[str, Any]: ...


def assembled(events: Iterable[AnEvent], start: str = "") -> str:
    text = start
    for event in events:
        if event.event == "reset":
            text = ""
        elif event.event == "delta":
            text += event.data["text"]
    return text


@dataclass
class Event:
    id: str
    event: str
    data: dict[str, Any]


def sse_events(lines: Iterable[str]) -> Iterator[Event]:
    """Server-Sent Events from a response's lines (comments, the pings, skipped)."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line:
            if "data" in fields:
                data = json.loads(fields["data"])
                yield Event(fields.get("id", ""), fields.get("event", ""), data)
            fields = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        fields[name] = value.removeprefix(" ")
