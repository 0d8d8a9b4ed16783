"""The standby gate: at most ``slots`` processes past it, and a dead holder frees its slot."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from batchserve.core import scratch
from batchserve.workers.slot_gate import SlotGate, Turn

ctx = multiprocessing.get_context("fork")


def _hold(gate: SlotGate, entered: Any, leave: Any, log: Any, name: str) -> None:
    with gate.turn() as turn:
        log.put((name, "in", turn.slot))
        entered.set()
        leave.wait(10)
        log.put((name, "out", turn.slot))


def _spawn(gate: SlotGate, name: str, log: Any) -> tuple[Any, Any, Any]:
    entered, leave = ctx.Event(), ctx.Event()
    process = ctx.Process(target=_hold, args=(gate, entered, leave, log, name), daemon=True)
    process.start()
    return process, entered, leave


def test_one_slot_lets_the_waiting_process_in_when_the_running_one_leaves(
    tmp_path: Path,
) -> None:
    # A SimpleQueue's put is written before it returns (a Queue's goes through a feeder thread,
    # so "a out", put before a left the slot, could reach the pipe after "b in").
    gate, log = SlotGate.create(tmp_path, 1), ctx.SimpleQueue()
    first, first_in, first_leave = _spawn(gate, "a", log)
    assert first_in.wait(5)
    second, second_in, second_leave = _spawn(gate, "b", log)
    assert not second_in.wait(0.3)  # the slot is taken
    first_leave.set()
    assert second_in.wait(5)
    second_leave.set()
    for process in (first, second):
        process.join(5)
    events = [log.get() for _ in range(4)]
    assert events == [("a", "in", 0), ("a", "out", 0), ("b", "in", 0), ("b", "out", 0)]


def test_a_process_that_dies_holding_its_slot_frees_it(tmp_path: Path) -> None:
    gate, log = SlotGate.create(tmp_path, 1), ctx.Queue()
    doomed, doomed_in, _ = _spawn(gate, "doomed", log)
    assert doomed_in.wait(5)
    waiter, waiter_in, waiter_leave = _spawn(gate, "waiter", log)
    assert not waiter_in.wait(0.3)
    assert doomed.pid is not None
    os.kill(doomed.pid, signal.SIGKILL)  # a batch that kills its process
    assert waiter_in.wait(5)
    waiter_leave.set()
    waiter.join(5)


def test_several_slots_admit_that_many_processes_at_once(tmp_path: Path) -> None:
    gate, log = SlotGate.create(tmp_path, 2), ctx.Queue()
    holders = [_spawn(gate, name, log) for name in ("a", "b", "c", "d")]
    inside = [h for h in holders if h[1].wait(0.5)]
    assert len(inside) == 2  # the other two wait
    slots = {log.get(timeout=1)[2] for _ in range(2)}
    assert slots == {0, 1}
    inside[0][2].set()  # one leaves: exactly one of the waiters gets its slot
    entered = [h for h in holders if h not in inside and h[1].wait(2)]
    assert len(entered) == 1
    for _, _, leave in holders:
        leave.set()
    for process, _, _ in holders:
        process.join(5)
        assert process.exitcode == 0


def test_a_turn_tells_how_early_its_batch_came(tmp_path: Path) -> None:
    """Waiting for the running model is coming early (positive); a slot that stood free is
    coming late by as long (negative); a slot never given back tells nothing."""
    gate = SlotGate.create(tmp_path, 1)
    other = SlotGate(tmp_path, 1)  # another process's: its own open file, its own lock
    with gate.turn() as first:
        assert first.slot == 0 and first.early_s is None
        waiting: list[Turn] = []
        taker = threading.Thread(target=lambda: waiting.append(other.take()))
        taker.start()
        time.sleep(0.2)
    taker.join(5)
    assert 0.15 <= (waiting[0].early_s or 0.0) < 5.0
    other.release(waiting[0].slot)
    time.sleep(0.1)
    with gate.turn() as late:
        assert late.early_s is not None and -5.0 < late.early_s <= -0.09


def test_a_turn_at_one_of_several_slots_tells_the_same(tmp_path: Path) -> None:
    gate, other = SlotGate.create(tmp_path, 2), SlotGate(tmp_path, 2)
    first, second = gate.take(), SlotGate(tmp_path, 2).take()
    assert {first.slot, second.slot} == {0, 1}
    waiting: list[Turn] = []
    taker = threading.Thread(target=lambda: waiting.append(other.take()))
    taker.start()
    time.sleep(0.2)
    gate.release(first.slot)
    taker.join(5)
    assert waiting[0].slot == first.slot and 0.15 <= (waiting[0].early_s or 0.0) < 5.0


def _own_gate_then_leave(directory: Path, pool_alive: Any, stop_pool: Any) -> None:
    """A worker: makes its gate, forks a pool process that outlives it, and exits."""
    SlotGate.create(directory, 1)
    pool = ctx.Process(target=_pool_process, args=(pool_alive, stop_pool))
    pool.start()
    pool_alive.wait(10)
    os._exit(0)  # killed outright: nothing removes the directory


def _pool_process(alive: Any, stop: Any) -> None:
    alive.set()
    stop.wait(10)


def test_a_sweep_removes_the_gates_of_dead_workers_only(tmp_path: Path) -> None:
    """A worker killed outright leaves its gate directory; the sweep of the next worker removes
    it once no process of the dead one holds the owner lock (its pool processes inherit it),
    and never a live worker's directory or one still being made (no owner file yet)."""
    live = SlotGate.create(tmp_path / "batchserve-gate-live", 2)
    being_made = tmp_path / "batchserve-gate-new"
    being_made.mkdir()
    other = tmp_path / "another-gate"
    dead = tmp_path / "batchserve-gate-dead"
    pool_alive, stop_pool = ctx.Event(), ctx.Event()
    worker = ctx.Process(target=_own_gate_then_leave, args=(dead, pool_alive, stop_pool))
    worker.start()
    # Reaped directly: join() would wait for the pool process too (it inherits the pipe
    # multiprocessing watches).
    assert worker.pid is not None
    deadline = time.monotonic() + 10
    while os.waitpid(worker.pid, os.WNOHANG) == (0, 0) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert pool_alive.is_set()
    other.mkdir()
    (other / "owner").touch()  # nobody holds it, but it is not a gate of this prefix
    # The dead worker's pool process still holds the lock: its gate stays.
    assert scratch.sweep(tmp_path, "batchserve-gate-") == []
    stop_pool.set()
    deadline = time.monotonic() + 10
    removed: list[Path] = []
    while not removed and time.monotonic() < deadline:
        removed = scratch.sweep(tmp_path, "batchserve-gate-")
        time.sleep(0.05)
    assert removed == [dead] and not dead.exists()
    assert live.directory.exists() and being_made.exists() and other.exists()
    with live.turn() as turn:  # the live gate still works
        assert turn.slot in (0, 1)
    worker.join(5)  # multiprocessing's bookkeeping (the process itself was reaped above)


def test_a_worker_sweeps_before_it_makes_its_gate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The worker's new gate directory goes where the stale ones are, after the sweep."""
    from batchserve.workers import worker_main

    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    stale = tmp_path / f"{worker_main.GATE_PREFIX}stale"
    stale.mkdir()
    (stale / "owner").touch()  # its worker gone: nobody holds the lock
    made = worker_main._gate_directory()
    assert not stale.exists()
    assert made.parent == tmp_path and made.name.startswith(worker_main.GATE_PREFIX)
