"""A stopping role closes its clients; one whose close hangs is left behind, named."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from batchserve.core import wiring
from batchserve.core.settings import Settings


async def test_a_client_whose_close_hangs_is_left_behind_and_the_rest_are_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The events client's close never returns: ``close`` still returns within about
    ``CLOSE_S``, logs which client it left, and closes the clients after it."""
    settings = Settings(
        home=tmp_path, database_url=None, broker_url=None, redis_url=None, auth="disabled"
    )
    adapters = wiring.connect(settings)
    closed: list[str] = []
    warned: list[dict[str, Any]] = []

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def joins_close() -> None:
        closed.append("joins")

    monkeypatch.setattr(adapters.events, "close", hangs)
    monkeypatch.setattr(adapters.joins, "close", joins_close)
    monkeypatch.setattr(wiring, "CLOSE_S", 0.2)
    monkeypatch.setattr(wiring.log, "warning", lambda event, **f: warned.append({event: f}))
    started = time.monotonic()
    await adapters.close()
    assert time.monotonic() - started < 2.0
    assert warned == [{"close_timed_out": {"client": hangs.__qualname__}}]
    assert closed == ["joins"]
