"""What a client of a request's stream ends with: the text of its ``delta`` events, started
over at each ``reset``."""

from __future__ import annotations

from collections.abc import Iterable
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
