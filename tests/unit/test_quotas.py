"""Admission control counts the checks still committing: a burst checked in one instant cannot
pass a bound that each of its requests, alone, would see as far off."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from batchserve.api import quotas as quotas_module
from batchserve.api.quotas import UNSEEN_S, Quotas, Reservation
from batchserve.core.domain import Lane
from batchserve.core.errors import Overloaded, QuotaExceeded
from batchserve.core.loadboard import LoadSnapshot, MemoryLoadBoard
from batchserve.core.ratelimit import MemoryRateLimiter
from batchserve.core.settings import Settings
from batchserve.core.store import TenantRow
from tests.support.stepped import command

MODEL = "echo"


class _NoStore:
    """The refresher is not started: the quotas never read the store here."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the store was used: {name}")


def _snapshot(at: float) -> LoadSnapshot:
    return LoadSnapshot(
        model=MODEL,
        at=at,
        slots=1,
        slot_free_at=(at,),
        pending_interactive=0,
        pending_bulk=0,
        queued_interactive=0,
        queued_bulk=0,
        batch_s=0.1,
        max_batch_size=32,  # 320/s: with max_queue_s 1, a backlog of 320
        max_batch_delay_s=0.01,
        arrival_rate=0.0,
    )


async def _quotas(board: MemoryLoadBoard | None = None, **settings: Any) -> Quotas:
    if board is None:
        board = MemoryLoadBoard()
        await board.publish(_snapshot(time.time()))
    options = {"max_queue_s": 1.0, "min_backlog": 50, "tenant_max_queued": 1_000_000}
    return Quotas(
        Settings(**{**options, **settings}),
        _NoStore(),  # type: ignore[arg-type]
        MemoryRateLimiter(),
        board,
    )


async def _burst(quotas: Quotas, tenant: TenantRow, count: int) -> list[Reservation | Exception]:
    async def one(n: int) -> Reservation | Exception:
        try:
            return await quotas.check(
                tenant, command(f"burst {n}", model=MODEL, now=time.time()), time.time()
            )
        except (Overloaded, QuotaExceeded) as refused:
            return refused

    return await asyncio.gather(*(one(n) for n in range(count)))


async def test_a_burst_checked_at_once_is_held_to_the_backlog_bound() -> None:
    quotas = await _quotas()
    tenant = TenantRow("t1")
    outcomes = await _burst(quotas, tenant, 2000)
    passed = [o for o in outcomes if isinstance(o, Reservation)]
    refused = [o for o in outcomes if isinstance(o, Overloaded)]
    assert len(passed) == 320 and len(refused) == 1680
    assert refused[0].details["limit_name"] == "max_backlog"
    # Admitted ones stay counted (until the batcher's snapshot shows them); released ones free
    # their place at once.
    for reservation in passed[:300]:
        quotas.admitted(reservation)
    for reservation in passed[300:]:
        quotas.release(reservation)
    again = await _burst(quotas, tenant, 100)
    assert sum(isinstance(o, Reservation) for o in again) == 20


async def test_a_silent_load_board_still_holds_a_burst_to_the_capacity_last_seen(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batcher's snapshot went stale (it restarts, or a read of Redis timed out under the
    burst itself): what this process admitted lately is held to the bound of the capacity it
    last saw. A model never heard of is admitted as before (each tenant's quota bounds it)."""
    # The burst is checked within UNSEEN_S of the admission, however slow the machine: the
    # quotas' monotonic clock stands still (wall time runs as ever).
    still = time.monotonic()
    monkeypatch.setattr(
        quotas_module, "time", SimpleNamespace(time=time.time, monotonic=lambda: still)
    )
    board = MemoryLoadBoard()
    await board.publish(_snapshot(time.time()))
    quotas = await _quotas(board)
    tenant = TenantRow("t1")
    quotas.admitted(
        await quotas.check(tenant, command("seen", model=MODEL, now=time.time()), time.time())
    )
    await board.publish(_snapshot(time.time() - 60.0))  # no word for a minute
    outcomes = await _burst(quotas, tenant, 2000)
    passed = [o for o in outcomes if isinstance(o, Reservation)]
    assert len(passed) == 319  # 320 of capacity, one admitted lately
    refused = [o for o in outcomes if isinstance(o, Overloaded)]
    assert refused and refused[0].details["limit_name"] == "max_backlog"
    never_heard = await _quotas(MemoryLoadBoard())
    assert all(isinstance(o, Reservation) for o in await _burst(never_heard, tenant, 2000))
    readme = " ".join((Path(__file__).resolve().parents[2] / "README.md").read_text().split())
    assert UNSEEN_S == 1.5
    assert f"admitted in the last {UNSEEN_S:g} s against the capacity it last saw" in readme


async def test_a_burst_is_held_to_the_tenants_unfinished_requests() -> None:
    quotas = await _quotas()
    tenant = TenantRow("t1", max_queued=100)
    outcomes = await _burst(quotas, tenant, 500)
    passed = [o for o in outcomes if isinstance(o, Reservation)]
    assert len(passed) == 100
    assert {o.details["limit_name"] for o in outcomes if isinstance(o, QuotaExceeded)} == {
        "max_queued"
    }
    for reservation in passed:
        quotas.release(reservation)
    assert all(isinstance(o, Reservation) for o in await _burst(quotas, tenant, 100))


@pytest.mark.parametrize("settle", ["admitted", "release"])
async def test_a_bulk_request_reserves_nothing(settle: str) -> None:
    quotas = await _quotas()
    bulk = dataclasses.replace(command("a line", model=MODEL, now=time.time()), lane=Lane.BULK)
    reservation = await quotas.check(TenantRow("t1"), bulk, time.time())
    getattr(quotas, settle)(reservation)
    assert reservation == Reservation()
