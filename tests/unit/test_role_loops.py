"""Every long-running role runs its event loop through ``batchserve.core.loops`` (uvloop where
installed, the short GIL switch): the API once ran on the standard loop alone."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

import pytest

from batchserve.cli import roles
from batchserve.core.settings import Settings


def test_the_api_runs_on_the_services_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []

    async def serve_api(*_: Any, **__: Any) -> None:
        ran.append("served")

    def run(main: Coroutine[Any, Any, Any]) -> None:
        ran.append("loops.run")
        main.close()

    monkeypatch.setattr("batchserve.api.main.create_app", lambda settings: object())
    monkeypatch.setattr("batchserve.api.server.serve_api", serve_api)
    monkeypatch.setattr(roles.loops, "run", run)
    roles.run_api(Settings(), "127.0.0.1", 0)
    assert ran == ["loops.run"]
