"""Event loops for the service's processes: uvloop where installed, and a short GIL switch.

uvloop runs the same asyncio code with less CPU a callback, which on two shared cores is
latency for everyone. The switch interval matters where an event loop shares its process with a
thread that blocks (the batcher's broker hand-over thread, a worker's model thread): Python lets
a running thread keep the GIL for up to the interval (5 ms by default) while the other one has
its answer ready, and in a batch's hand-over those milliseconds are the idle gap. At 0.5 ms the
measured gap fell by about 2 ms a batch (docs/benchmarks.md); a switch costs microseconds.

The API allocates and frees objects for every request. At CPython's default threshold (700
tracked objects allocated and not yet freed) its collector ran hundreds of times a step of
single submits, now and then a full pass over every object imported: :func:`tune_gc` freezes
what start-up made, so no pass traverses it again, and collects the youngest generation only
once 10,000 objects are outstanding. What reference counting frees never counts, so cyclic
garbage and growth alone bring a collection (docs/frontdoor.md, "The API's garbage
collector").
"""

from __future__ import annotations

import asyncio
import gc
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

SWITCH_INTERVAL_S = 0.0005
GC_YOUNG_THRESHOLD = 10_000


def tune_gc() -> None:
    """Freeze the objects made so far (imports, the app) out of every collection, and collect
    the youngest generation at ``GC_YOUNG_THRESHOLD`` outstanding objects instead of 700."""
    gc.collect()  # start-up's garbage goes now, not into the frozen set
    gc.freeze()
    _, middle, oldest = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, oldest)


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
