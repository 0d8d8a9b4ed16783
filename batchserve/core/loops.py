"""Event loops for the service's processes: uvloop where installed, and a short GIL switch.

uvloop runs the same asyncio code with less CPU a callback, which on two shared cores is
latency for everyone. The switch interval matters where an event loop shares its process with a
thread that blocks (the batcher's broker hand-over thread, a worker's model thread): Python lets
a running thread keep the GIL for up to the interval (5 ms by default) while the other one has
its answer ready, and in a batch's hand-over those milliseconds are the idle gap. At 0.5 ms the
measured gap fell by about 2 ms a batch (docs/benchmarks.md); a switch costs microseconds.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

SWITCH_INTERVAL_S = 0.0005


def tune_threads() -> None:
    sys.setswitchinterval(SWITCH_INTERVAL_S)


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on uvloop when it is installed, with :func:`tune_threads`, the garbage
    collector's pauses timed (``batchserve_gc_pause_seconds``)."""
    from batchserve.core.metrics import watch_gc

    tune_threads()
    watch_gc()
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency where it builds
        return asyncio.run(main)
    return uvloop.run(main)


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A new loop (uvloop when installed) for a thread of its own, with :func:`tune_threads`."""
    tune_threads()
    try:
        import uvloop
    except ImportError:  # pragma: no cover
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()
