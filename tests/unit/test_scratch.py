"""A role's scratch directories (its pool's metrics, its processes' ready marks): owned by the
role and its forks, swept once they are all gone (``batchserve/core/scratch.py``)."""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path
from typing import Any

import pytest

from batchserve.core import scratch
from batchserve.core.metrics import multiprocess_dir, remove_multiprocess_dir
from batchserve.workers.worker_main import READY_PREFIX, _ReadyProcesses

ctx = multiprocessing.get_context("fork")


@pytest.fixture(autouse=True)
def _temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every scratch directory of the test under its own temporary directory."""
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))


def _make_then_die(made: Any) -> None:
    """A worker killed outright: its ready marks' and metrics' directories made, never removed."""
    ready = _ReadyProcesses(1)
    ready.mark()
    made.put([str(ready.directory), str(multiprocess_dir("worker"))])
    os._exit(0)


def test_a_killed_workers_directories_are_swept_by_the_next_of_their_kind(
    tmp_path: Path,
) -> None:
    """Its ready marks' directory goes when the next worker makes its own, its metrics'
    directory when the next metrics directory is made; a live one's stay."""
    live = _ReadyProcesses(1)
    made: Any = ctx.SimpleQueue()
    worker = ctx.Process(target=_make_then_die, args=(made,))
    worker.start()
    ready_dir, metrics_dir = (Path(d) for d in made.get())
    worker.join(10)
    assert ready_dir.exists() and metrics_dir.exists()
    assert live.count() == 0  # its owner file is no mark
    after = _ReadyProcesses(1)
    assert not ready_dir.exists() and metrics_dir.exists()
    assert live.directory.exists() and after.directory.exists()
    fresh = multiprocess_dir("worker")
    assert not metrics_dir.exists() and fresh.exists()
    assert {p.name.startswith(READY_PREFIX) for p in (live.directory, after.directory)} == {True}
    for ready in (live, after):
        ready.remove()
    remove_multiprocess_dir(fresh)
    assert list(tmp_path.iterdir()) == []


def test_a_directory_is_kept_while_its_maker_lives_and_let_go_when_removed(
    tmp_path: Path,
) -> None:
    """A sweep leaves a directory its maker holds (here this very process) and one being made
    (no owner file yet); removing it lets its lock go."""
    made = scratch.make("bs-test-")
    being_made = tmp_path / "bs-test-new"
    being_made.mkdir()
    assert scratch.sweep(tmp_path, "bs-test-") == []
    assert (made / scratch.OWNER).exists()
    scratch.remove(made)
    assert not made.exists() and being_made.exists()
    # A sweep that finds a directory whose maker died (its lock free) takes it.
    (being_made / scratch.OWNER).touch()
    assert scratch.sweep(tmp_path, "bs-test-") == [being_made]
