"""What the waiters remember of the requests their process admitted: a request is known not to
have ended only while every announcement since its admission has been heard."""

from __future__ import annotations

import asyncio

from batchserve.api.waiters import Waiters
from batchserve.core.domain import RequestState, StateChange
from batchserve.core.events import MemoryEventBus


async def started(**kwargs: float) -> tuple[Waiters, MemoryEventBus]:
    bus = MemoryEventBus()
    waiters = Waiters(bus, **kwargs)  # type: ignore[arg-type]
    waiters.start()
    return waiters, bus


async def test_an_admitted_request_is_unfinished_until_its_end_is_announced() -> None:
    waiters, bus = await started()
    waiters.expect("r1", "acme")
    assert waiters.unfinished("r1", "acme")
    assert not waiters.unfinished("r1", "other")  # another tenant's caller reads (and 404s)
    assert not waiters.unfinished("r2", "acme")  # admitted elsewhere: read
    await bus.publish(StateChange(("r1",), RequestState.RUNNING))
    assert waiters.unfinished("r1", "acme")  # started, not ended
    await bus.publish(StateChange(("r0", "r1"), RequestState.SUCCEEDED))
    assert not waiters.unfinished("r1", "acme")


async def test_a_reconnect_forgets_every_admission() -> None:
    """Announcements may have been lost while the subscription was down."""
    waiters, _ = await started()
    waiters.expect("r1", "acme")
    waiters._wake_all()  # what the subscription calls on every (re)connect
    assert not waiters.unfinished("r1", "acme")


async def test_an_unhealthy_subscription_knows_nothing() -> None:
    waiters, _ = await started()
    waiters.expect("r1", "acme")
    assert waiters._subscription is not None
    waiters._subscription.healthy = False
    assert not waiters.unfinished("r1", "acme")


async def test_admissions_are_forgotten_after_remember_s_or_past_remember_max() -> None:
    waiters, _ = await started(remember_s=0.05, remember_max=3)
    waiters.expect("old", "acme")
    await asyncio.sleep(0.06)
    assert not waiters.unfinished("old", "acme")
    for name in ("a", "b", "c", "d"):
        waiters.expect(name, "acme")
    assert [waiters.unfinished(n, "acme") for n in "abcd"] == [False, True, True, True]
    waiters.forget("d")  # a refused admission
    assert not waiters.unfinished("d", "acme")


def test_the_readme_states_how_long_an_admission_is_remembered() -> None:
    from pathlib import Path

    from batchserve.api.waiters import REMEMBER_S

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert f"within {REMEMBER_S:g} s of it and with no end of it announced since" in readme
