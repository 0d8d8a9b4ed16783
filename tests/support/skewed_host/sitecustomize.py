"""A host whose wall clock is ``BATCHSERVE_TEST_CLOCK_SKEW_S`` seconds off: Python imports this
module at start-up when its folder is on ``PYTHONPATH`` (tests/chaos/test_clock_skew.py).

It does what libfaketime's ``FAKETIME=+5`` does to a process's wall clock (``time.time``,
``time.time_ns``: every wall-clock read batchserve makes), and nothing to its monotonic clock,
like a real host whose clock is off. Debian's libfaketime (0.9.10) cannot run these processes:
with its monotonic clock faked, Python's timed waits (``threading.Event.wait``) never return;
with ``FAKETIME_DONT_FAKE_MONOTONIC=1``, ``time.sleep`` fails with EINVAL.
"""

import os
import time

_skew_s = float(os.environ.get("BATCHSERVE_TEST_CLOCK_SKEW_S") or 0.0)
if _skew_s:
    _time, _time_ns = time.time, time.time_ns
    _skew_ns = int(_skew_s * 1e9)

    def _skewed() -> float:
        return _time() + _skew_s

    def _skewed_ns() -> int:
        return _time_ns() + _skew_ns

    time.time = _skewed
    time.time_ns = _skewed_ns
