"""Processes by pid."""

from __future__ import annotations

import os


def alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (a zombie does too, until its parent reaps it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
