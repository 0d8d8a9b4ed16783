"""What an API process let in since the batcher's snapshot, as deadline admission counts it."""

from __future__ import annotations

from batchserve.api.deadlines import RecentAdmissions
from batchserve.core.domain import Lane


def test_interactive_queue_behind_interactive_only_and_bulk_behind_both() -> None:
    recent = RecentAdmissions()
    for at in (1.0, 2.0, 3.0):
        recent.add("m", Lane.INTERACTIVE, at)
    recent.add("m", Lane.BULK, 2.5)
    recent.add("other", Lane.INTERACTIVE, 2.0)
    assert recent.ahead("m", Lane.INTERACTIVE, since=0.0) == 3
    assert recent.ahead("m", Lane.BULK, since=0.0) == 4


def test_what_the_snapshot_counted_is_dropped_and_a_refused_one_discarded() -> None:
    recent = RecentAdmissions()
    for at in (3.0, 1.0, 2.0):  # out of order: kept sorted
        recent.add("m", Lane.INTERACTIVE, at)
    assert recent.ahead("m", Lane.INTERACTIVE, since=2.0) == 2  # 2.0 and 3.0: not yet counted
    recent.discard("m", Lane.INTERACTIVE, 3.0)
    recent.discard("m", Lane.INTERACTIVE, 9.0)  # never added: nothing happens
    assert recent.ahead("m", Lane.INTERACTIVE, since=2.0) == 1
    assert recent.ahead("m", Lane.INTERACTIVE, since=5.0) == 0
