"""Scratch directories a process owns with its forks, swept once all of them are gone.

A role that forks keeps the files its processes share in a temporary directory of its own: a
batch worker's pool writes its metrics there and marks each process ready there, and its
standby processes pass a slot's gate there; several API processes write their metrics there.
The role removes the directory when it stops; killed outright it cannot, and every restart of
a crashing worker would leave one more (a pool's metrics files: 64 KiB a kind a process). So
the directory holds an ``owner`` file its maker locks (``flock``), and the forks inherit the
lock with its descriptor: it lasts while any of them lives. The next role to make a directory
of the same kind on the host sweeps every one whose owner lock nobody holds. A lock, not a
process id: a pid may be reused, or belong to another container sharing the directory.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

from batchserve.core.logs import get_logger

log = get_logger("batchserve.scratch")

OWNER = "owner"

# This process's directories and their owner locks' descriptors, held until it removes them.
_held: dict[Path, int] = {}


def own(directory: Path) -> int:
    """Take ``directory``'s owner lock for this process (its forks inherit it); its descriptor.
    Locked under another name, then renamed: a sweep never finds the owner file unlocked."""
    making = Path(directory) / f"{OWNER}.{os.getpid()}"
    fd = os.open(making, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    making.rename(Path(directory) / OWNER)
    return fd


def fresh(prefix: str) -> Path:
    """A new directory named ``prefix``* in the temporary directory, not owned yet (its
    maker calls :func:`own`), after sweeping those of the same prefix nobody owns any more."""
    parent = Path(tempfile.gettempdir())
    for stale in sweep(parent, prefix):
        log.info("stale_scratch_removed", directory=str(stale))
    return Path(tempfile.mkdtemp(prefix=prefix, dir=parent))


def make(prefix: str) -> Path:
    """A :func:`fresh` directory owned by this process and its forks until :func:`remove`."""
    directory = fresh(prefix)
    _held[directory] = own(directory)
    return directory


def remove(directory: Path) -> None:
    """Remove a directory this process made, and let its owner lock go."""
    shutil.rmtree(directory, ignore_errors=True)
    fd = _held.pop(Path(directory), None)
    if fd is not None:
        os.close(fd)


def sweep(parent: Path, prefix: str) -> list[Path]:
    """Remove the directories under ``parent`` named ``prefix``* whose owner lock is free (their
    maker and all its forks are gone); the removed ones. One without an owner file (being made)
    is left."""
    removed = []
    for directory in sorted(Path(parent).glob(f"{prefix}*")):
        try:
            fd = os.open(directory / OWNER, os.O_RDWR)
        except OSError:
            continue
        try:
            if not try_lock(fd):
                continue
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
        finally:
            os.close(fd)
    return removed


def try_lock(fd: int) -> bool:
    """Take ``fd``'s exclusive lock if nobody holds it; False if somebody does."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return False
        raise
    return True
