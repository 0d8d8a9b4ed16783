"""What became of the processes a test started, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
from pathlib import Path


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``: what it started, and what they did."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rpartition(")")[2].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    wanted = {pid}
    while wanted:
        children = {child for child, parent in parents.items() if parent in wanted}
        wanted = children - found
        found |= children
    return found


def ended(pid: int) -> bool:
    """No such process, or only its exit status left to collect."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def running(pids: set[int]) -> list[int]:
    return sorted(p for p in pids if not ended(p))
