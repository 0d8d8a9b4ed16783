"""The deployment's one clock (core/clock.py): Postgres's time carried on the local monotonic
clock, with a fake reference and fake local clocks."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

from batchserve.core.clock import DeploymentClock


class Host:
    """A host whose wall clock is ``skew_s`` off the reference's, and a monotonic clock."""

    def __init__(self, skew_s: float) -> None:
        self.true_s = 1_000_000.0
        self.skew_s = skew_s
        self.mono_s = 50.0

    def wall(self) -> float:
        return self.true_s + self.skew_s

    def monotonic(self) -> float:
        return self.mono_s

    def advance(self, seconds: float) -> None:
        self.true_s += seconds
        self.mono_s += seconds


class Reference:
    """The server's true time; each reading takes ``trips`` (out and back, split evenly)."""

    def __init__(self, host: Host, trips: list[float]) -> None:
        self.host = host
        self.trips = trips
        self.calls = 0
        self.down = False

    def samples(
        self, monotonic: Callable[[], float], count: int
    ) -> list[tuple[float, float, float]]:
        self.calls += 1
        if self.down:
            raise OSError("connection refused")
        found = []
        for trip in self.trips[:count]:
            before = monotonic()
            self.host.advance(trip / 2)
            server = self.host.true_s
            self.host.advance(trip / 2)
            after = monotonic()
            found.append(((before + after) / 2, server, after - before))
        return found


@pytest.mark.parametrize("skew_s", [-5.0, 5.0, 0.2])
def test_a_skewed_host_reads_the_reference_time(skew_s: float) -> None:
    """A host 5 s off reads the reference's time to within half its best round trip, and
    keeps it as time goes by."""
    host = Host(skew_s)
    exported: list[float] = []
    clock = DeploymentClock(local=host.wall, monotonic=host.monotonic, on_offset=exported.append)
    assert clock() == host.wall()  # no reference yet: the local clock
    assert clock.follow(Reference(host, [0.040, 0.002, 0.030]))
    assert clock() == pytest.approx(host.true_s, abs=0.001)
    assert clock.offset_s == pytest.approx(-skew_s, abs=0.001)
    assert exported == [clock.offset_s]  # batchserve_clock_offset_seconds
    host.advance(30.0)
    assert clock() == pytest.approx(host.true_s, abs=0.001)


def test_a_host_within_the_tolerance_keeps_its_own_clock() -> None:
    """20 ms off with a 10 ms round trip: within 50 ms, the host's own time is served (every
    process of the host then reads the same), and the offset is still reported."""
    host = Host(-0.020)
    exported: list[float] = []
    clock = DeploymentClock(local=host.wall, monotonic=host.monotonic, on_offset=exported.append)
    assert clock.follow(Reference(host, [0.010]))
    assert clock() == host.wall()
    assert exported == [pytest.approx(0.020, abs=0.001)]


def test_it_survives_a_step_of_the_local_wall_clock() -> None:
    """An NTP step of a corrected host's wall clock between syncs changes nothing: time is
    carried on the monotonic clock."""
    host = Host(3.0)
    clock = DeploymentClock(local=host.wall, monotonic=host.monotonic)
    clock.follow(Reference(host, [0.001]))
    host.skew_s = 7.0
    host.advance(1.0)
    assert clock() == pytest.approx(host.true_s, abs=0.001)


def test_it_resyncs_each_period_and_keeps_its_base_when_the_reference_is_down() -> None:
    host = Host(3.0)
    clock = DeploymentClock(local=host.wall, monotonic=host.monotonic, resync_s=60.0)
    reference = Reference(host, [0.001])
    clock.follow(reference)
    host.advance(30.0)
    clock()
    assert reference.calls == 1
    reference.down = True
    host.advance(31.0)
    assert not clock.sync()  # down: the last base still serves
    assert clock() == pytest.approx(host.true_s, abs=0.001)
    reference.down = False
    host.advance(61.0)
    clock()  # due: a sync starts in a thread of its own
    for _ in range(100):
        if reference.calls >= 3:
            break
        time.sleep(0.01)
    assert reference.calls == 3


def test_forget_returns_to_the_local_clock() -> None:
    host = Host(2.0)
    clock = DeploymentClock(local=host.wall, monotonic=host.monotonic)
    clock.follow(Reference(host, [0.001]))
    clock.forget()
    assert clock() == host.wall() and clock.offset_s == 0.0
