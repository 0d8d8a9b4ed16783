"""The API's shutdown ends even when a part of it does not stop."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from batchserve.api.services import ApiServices
from batchserve.core.settings import Settings
from batchserve.models.registry import parse_registry
from batchserve.models.tokens import PromptCounter


class Stops:
    def __init__(self) -> None:
        self.stopped = False

    async def stop(self) -> None:
        self.stopped = True

    async def close(self) -> None:
        self.stopped = True


class SwallowsItsCancel:
    """A stop that never returns and swallows the first cancellation (as redis-py's pub/sub
    can), until ``release`` is set."""

    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def stop(self) -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await self.release.wait()


async def test_a_part_that_never_stops_is_left_behind_and_the_rest_still_stops() -> None:
    admitter, quotas, adapters, keyring = Stops(), Stops(), Stops(), Stops()
    waiters = SwallowsItsCancel()
    # Only the parts that stop are real here; the others are never touched by stop().
    parts: dict[str, Any] = {
        "adapters": adapters,
        "admitter": admitter,
        "waiters": waiters,
        "quotas": quotas,
        "webhook_secrets": None,
        "url_guard": None,
        "prompt_counter": PromptCounter(parse_registry("")),
        "keyring": keyring,
    }
    services = ApiServices(Settings(), **parts)
    started = time.monotonic()
    await services.stop(step_s=0.2)
    assert time.monotonic() - started < 2.0  # the waiters' 0.2 s, not forever
    assert admitter.stopped and quotas.stopped and adapters.stopped and keyring.stopped
    waiters.release.set()
