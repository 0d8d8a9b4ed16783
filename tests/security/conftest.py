"""The security tier: what an outside tester tried, each case held by a test (issue 21). The
in-process app and its client are the shared ``app`` and ``client`` fixtures."""

from __future__ import annotations

from fastapi import FastAPI


async def stored_requests(app: FastAPI) -> int:
    return sum((await app.state.services.adapters.store.count_by_state()).values())
