"""Standby pool processes: two processes per slot, at most one of them running its model.

A Celery prefork child only gets its next task once the current one has returned, and its
lease is a database round trip; on a slot that one process serves, both sit between one
batch's model end and the next one's start (about 10 ms, a tenth of a 100 ms batch). With
a second process per slot, the batch the batcher sends just before the running one ends goes
to the idle process, which takes its lease at once and then waits here, at the slot's gate,
for the running model to finish: the hand-over is a lock passing between two processes.

Each turn tells how early its batch came: how long it waited at the gate for the running
model (positive), or how long the slot had stood idle when it came (negative: late). The
releasing process writes the moment it left (``CLOCK_MONOTONIC``, one clock for every process
of the host) into the slot's file. The batcher learns from these how early to send a batch
(``batchserve/batching/timeline.py``: ``LeadTuner``).

The gate is a set of ``flock`` locks on files in a directory of the worker's own, one per
slot. A process that dies holding one (a batch that kills its process) releases it with its
last file descriptor, so a crash never wedges a slot. The files are opened in each process
after the fork: ``flock`` locks belong to an open file description, which a fork would share.

The directory is the worker's for its life: the worker holds a lock on its ``owner`` file,
which its pool processes inherit, and removes the directory when it stops. A worker killed
outright cannot; the next worker to start on the host sweeps every gate directory whose owner
lock nobody holds any more (:mod:`batchserve.core.scratch`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from batchserve.core import scratch

POLL_S = 0.0005
_STAMP = struct.Struct("<d")


@dataclass(frozen=True, slots=True)
class Turn:
    slot: int
    # How long the holder waited for the slot (positive), or minus how long the slot had
    # been free when it came; None for a slot never released before.
    early_s: float | None


class SlotGate:
    """At most ``slots`` models run at once among the processes that share ``directory``."""

    def __init__(self, directory: Path, slots: int) -> None:
        if slots < 1:
            raise ValueError("a gate needs at least one slot")
        self.directory = Path(directory)
        self.slots = slots
        self._fds: list[int] | None = None  # opened lazily, in the process that waits
        self._queue_fd: int | None = None
        self._owner_fd: int | None = None  # held by the worker that made the directory

    @classmethod
    def create(cls, directory: Path, slots: int) -> SlotGate:
        """The gate in ``directory``, its files made and its owner lock taken by this process
        (its forks inherit it: the lock lasts while any of them lives)."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        for path in [cls._slot_path(directory, n) for n in range(slots)] + [directory / "queue"]:
            path.touch(exist_ok=True)
        gate = cls(directory, slots)
        gate._owner_fd = scratch.own(directory)
        return gate

    @staticmethod
    def _slot_path(directory: Path, n: int) -> Path:
        return directory / f"slot-{n}"

    def _open(self) -> list[int]:
        if self._fds is None:
            self._fds = [
                os.open(self._slot_path(self.directory, n), os.O_RDWR) for n in range(self.slots)
            ]
            self._queue_fd = os.open(self.directory / "queue", os.O_RDWR)
        return self._fds

    def take(self) -> Turn:
        """Block until a slot is free and hold it; the slot, and how early this came."""
        fds = self._open()
        asked = time.monotonic()
        slot, waited = self._lock_one(fds)
        now = time.monotonic()
        if waited:
            return Turn(slot, now - asked)
        released = _read_stamp(fds[slot])
        return Turn(slot, None if released is None else min(0.0, released - now))

    def _lock_one(self, fds: list[int]) -> tuple[int, bool]:
        """A slot's lock, and whether it had to wait for it."""
        if len(fds) == 1:
            if scratch.try_lock(fds[0]):
                return 0, False
            fcntl.flock(fds[0], fcntl.LOCK_EX)  # the kernel wakes the waiter at the release
            return 0, True
        # Several slots: one waiter at a time polls them (the others queue on a lock), so a
        # freed slot goes to the process that has waited longest, and only one process polls.
        assert self._queue_fd is not None
        fcntl.flock(self._queue_fd, fcntl.LOCK_EX)
        try:
            waited = False
            while True:
                for n, fd in enumerate(fds):
                    if scratch.try_lock(fd):
                        return n, waited
                waited = True
                time.sleep(POLL_S)
        finally:
            fcntl.flock(self._queue_fd, fcntl.LOCK_UN)

    def release(self, slot: int) -> None:
        fd = self._open()[slot]
        os.pwrite(fd, _STAMP.pack(time.monotonic()), 0)
        fcntl.flock(fd, fcntl.LOCK_UN)

    @contextlib.contextmanager
    def turn(self) -> Iterator[Turn]:
        turn = self.take()
        try:
            yield turn
        finally:
            self.release(turn.slot)

    def close(self) -> None:
        for fd in [*(self._fds or ()), *([self._queue_fd] if self._queue_fd is not None else [])]:
            with contextlib.suppress(OSError):
                os.close(fd)
        self._fds, self._queue_fd = None, None


def _read_stamp(fd: int) -> float | None:
    data = os.pread(fd, _STAMP.size, 0)
    return _STAMP.unpack(data)[0] if len(data) == _STAMP.size else None
