"""Arrival rate, observed: an exponentially weighted count of arrivals. Pure (clock passed in)."""

from __future__ import annotations

import math


class RateMeter:
    """Requests per second over roughly the last ``tau_s`` seconds.

    Each arrival adds ``1/tau_s`` to a value that decays as ``exp(-dt/tau_s)``; for a steady
    Poisson stream of rate ``r`` the value settles at ``r``, and after a change it moves most of
    the way to the new rate within ``tau_s``.
    """

    def __init__(self, tau_s: float = 1.0) -> None:
        if tau_s <= 0:
            raise ValueError("tau_s must be positive")
        self.tau_s = tau_s
        self._value = 0.0
        self._at: float | None = None

    def observe(self, now: float, count: int = 1) -> None:
        self._value = self.rate(now) + count / self.tau_s
        self._at = now

    def rate(self, now: float) -> float:
        if self._at is None:
            return 0.0
        return self._value * math.exp(-max(0.0, now - self._at) / self.tau_s)
