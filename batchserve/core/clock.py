"""One clock for the whole deployment: Postgres's.

Times that one host writes and another compares cross hosts: a batch's lease (the worker
writes its expiry, maintenance reaps it), a slot's liveness (the worker announces it until a
time, the batcher counts it while that time is ahead), a request's deadline and its publish mark
(the API writes them, maintenance acts on them). On each host's own ``time.time()`` a skew of a
few seconds reaps live batches or hides live slots. So every process that talks to Postgres
reads its wall time from :func:`deployment_time`: Postgres's ``clock_timestamp()``, sampled at
start and every ``resync_s``. A host within ``tolerance_s`` (50 ms) of it, give or take half the
sample's round trip, keeps its own clock: NTP holds hosts closer than a sample can tell, and
every process of one host then reads the very same time (a process's stages, timed against
another's, never run backwards). A host further off is corrected: Postgres's time, carried
forward on the host's monotonic clock between samples (immune to its wall clock's steps), with
an error of half the round trip of the best of three samples.

The embedded mode (one process, SQLite) has one host: it keeps the local clock. Code under test
injects its own clock wherever it takes one (``clock=``), so stepped tests are unaffected.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Protocol

from batchserve.core.logs import get_logger

log = get_logger("batchserve.clock")

# |server - local| past which a sync logs the host's skew (it is corrected either way).
SKEW_WORTH_LOGGING_S = 0.5


class Reference(Protocol):
    def samples(
        self, monotonic: Callable[[], float], count: int
    ) -> list[tuple[float, float, float]]:
        """``count`` readings of the reference's time: ``(midpoint, server_s, round_trip_s)``,
        the local monotonic time halfway through the reading's round trip, the reference's
        time in seconds since the epoch, and the round trip's length."""
        ...


class DeploymentClock:
    def __init__(
        self,
        *,
        local: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        resync_s: float = 60.0,
        tolerance_s: float = 0.05,
        on_offset: Callable[[float], None] = lambda _offset: None,
    ) -> None:
        self._on_offset = on_offset
        self._local = local
        self._monotonic = monotonic
        self.resync_s = resync_s
        self.tolerance_s = tolerance_s
        self._reference: Reference | None = None
        self._base: tuple[float, float] | None = None  # (server_s, monotonic_s) at one sample
        self._synced_at = float("-inf")
        self._syncing = threading.Lock()
        self.offset_s = 0.0  # the reference's time less this host's, at the last sync

    def __call__(self) -> float:
        now = self._monotonic()
        if now - self._synced_at > self.resync_s and self._reference is not None:
            self._resync_soon()
        base = self._base
        if base is None:
            return self._local()
        return base[0] + (now - base[1])

    def follow(self, reference: Reference) -> bool:
        """Take ``reference`` as the deployment's clock, and sync with it now (blocking).
        Whether it answered (if not, the local clock serves until it does)."""
        self._reference = reference
        return self.sync()

    def forget(self) -> None:
        """Back to the local clock (the embedded mode; tests)."""
        self._reference = None
        self._base = None
        self.offset_s = 0.0

    def sync(self) -> bool:
        reference = self._reference
        if reference is None:
            return False
        with self._syncing:
            self._synced_at = self._monotonic()  # a failed attempt waits a period too
            try:
                readings = reference.samples(self._monotonic, 3)
            except Exception as error:  # an unreachable server: keep the last base
                log.warning("clock_sync_failed", error=f"{type(error).__name__}: {error}")
                return False
            if not readings:
                return False
            # The reading with the shortest round trip has the smallest error.
            midpoint, server_s, trip_s = min(readings, key=lambda r: r[2])
            local_then = self._local() - (self._monotonic() - midpoint)
            offset = server_s - local_then
            # Within the tolerance (and what the round trip leaves unknown) the host's own
            # clock serves: NTP keeps hosts closer than a sample can tell, and every process of
            # one host then reads the very same time.
            near = abs(offset) <= self.tolerance_s + trip_s / 2
            self._base = None if near else (server_s, midpoint)
            if abs(offset) > SKEW_WORTH_LOGGING_S and abs(offset - self.offset_s) > 0.1:
                log.warning("clock_skew", offset_s=round(offset, 3), note="corrected")
            self.offset_s = offset
            self._on_offset(offset)
            return True

    def _resync_soon(self) -> None:
        if self._syncing.locked():
            return
        self._synced_at = self._monotonic()
        threading.Thread(target=self.sync, name="clock-sync", daemon=True).start()


class PostgresTime:
    """Postgres's ``clock_timestamp()``, over a connection of its own for each sync."""

    def __init__(self, url: str) -> None:
        from sqlalchemy.engine import make_url

        parsed = make_url(url)
        self._dsn = parsed.set(drivername="postgresql").render_as_string(hide_password=False)

    def samples(
        self, monotonic: Callable[[], float], count: int
    ) -> list[tuple[float, float, float]]:
        import psycopg

        found = []
        with psycopg.connect(self._dsn, connect_timeout=5, autocommit=True) as conn:
            for _ in range(count):
                before = monotonic()
                row = conn.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
                after = monotonic()
                assert row is not None
                found.append(((before + after) / 2.0, float(row[0]), after - before))
        return found


def _export_offset(offset_s: float) -> None:
    from batchserve.core.metrics import metrics

    metrics().clock_offset.set(offset_s)


_clock = DeploymentClock(on_offset=_export_offset)


def deployment_clock() -> DeploymentClock:
    return _clock


def deployment_time() -> float:
    """Now, in seconds since the epoch, on the deployment's clock."""
    return _clock()


def follow_database(url: str) -> None:
    """Every role that talks to Postgres calls this once at start (SQLite: the local clock)."""
    if url.startswith("postgresql"):
        _clock.follow(PostgresTime(url))
