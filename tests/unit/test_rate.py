"""The arrival-rate meter settles on the true rate of a steady stream and follows a change."""

from __future__ import annotations

import random

import pytest

from batchserve.batching.rate import RateMeter


def poisson_times(rate: float, start: float, end: float, rng: random.Random) -> list[float]:
    times: list[float] = []
    t = start
    while True:
        t += rng.expovariate(rate)
        if t >= end:
            return times
        times.append(t)


def test_settles_on_a_steady_rate_and_follows_a_step() -> None:
    rng = random.Random(7)
    meter = RateMeter(tau_s=1.0)
    for t in poisson_times(200.0, 0.0, 10.0, rng):
        meter.observe(t)
    assert meter.rate(10.0) == pytest.approx(200.0, rel=0.2)
    for t in poisson_times(50.0, 10.0, 15.0, rng):
        meter.observe(t)
    assert meter.rate(15.0) == pytest.approx(50.0, rel=0.3)


def test_decays_when_nothing_arrives() -> None:
    meter = RateMeter(tau_s=1.0)
    meter.observe(0.0, count=100)
    assert meter.rate(0.0) == pytest.approx(100.0)
    assert meter.rate(5.0) < 1.0
    assert RateMeter().rate(3.0) == 0.0
