"""``batchserve chaos``, the command: stopped mid-run, it stops its deployment (a fault in
flight finished first) and removes its database, queues and keys."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from batchserve.models.registry import load_registry
from tests.support.processes import running, signalled_mid_run

# Process faults only: the servers' restarts are for the exclusive tests (tests/chaos).
# The registry the command runs on: the environment's, else the built-in one.
_REGISTRY = os.environ.get("BATCHSERVE_MODELS")
MODELS = load_registry(Path(_REGISTRY) if _REGISTRY else None).names()
CHAOS = ["chaos", "--duration", "120", "--rate", "20", "--no-server-faults", "--json"]


@pytest.mark.usefixtures("live_servers")
def test_a_stopped_chaos_run_stops_its_deployment_and_removes_what_it_made(
    run_id: str, tmp_path: Path
) -> None:
    """SIGTERM (a Ctrl-C takes the same path: the bench's test sends both). Its roles' logs
    stay, in a folder of its own in ``--log-dir``; their temporary folder is gone."""
    stopped = signalled_mid_run(run_id, CHAOS, signal.SIGTERM, tmp_path)
    try:
        assert stopped.process.returncode == 128 + signal.SIGTERM, stopped.err[-3000:]
        assert "chaos: stopped by SIGTERM" in stopped.err and stopped.out == ""
        assert len(stopped.started) >= 6  # its template, API, two batchers, maintenance, worker
        assert running(stopped.started) == []
        assert stopped.namespace.startswith("chaos")
        assert not stopped.database_exists() and stopped.keys() == []
        assert stopped.queues(MODELS) == []  # the API declared one for each model it knows
        (logs,) = tmp_path.glob("batchserve-chaos-*")
        assert (logs / "api.log").exists() and not (logs / "tmp").exists()
    finally:
        stopped.remove(MODELS)
