"""``batchserve serve`` on the servers (what ``make run`` starts where they are installed):
every role a supervised child process, answering requests; all of them stop with it, gracefully
on SIGTERM, and end even when it is killed outright (an API left behind would hold the port)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchserve.testing.deployment import ROOT, free_port
from tests.conftest import server_env
from tests.support import keys
from tests.support.processes import descendants, running

MODELS = """
[models.echo-100ms]
backend = "fixed"
batch_time_ms = 100
max_batch_size = 32
"""


@contextlib.contextmanager
def serving(
    database_url: str, namespace: str, home: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str, set[int]]]:
    """``serve`` up and announced: the process, its URL, its roles' pids (whatever of them
    is still running at the end is killed: a failing test leaves nothing behind)."""
    (home / "models.toml").write_text(MODELS)
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    env |= server_env(database_url, namespace, BATCHSERVE_MODELS=str(home / "models.toml"))
    env |= {"BATCHSERVE_HOME": str(home), "BATCHSERVE_LOG_LEVEL": "WARNING"}
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = open(home / "serve.log", "ab")  # noqa: SIM115 - the child owns it
    command = [sys.executable, "-m", "batchserve.cli", "serve", "--port", str(port)]
    process = subprocess.Popen(command, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    log.close()
    roles: set[int] = set()
    try:
        give_up = time.monotonic() + 120
        while "batchserve listening on" not in (home / "serve.log").read_text():
            assert process.poll() is None and time.monotonic() < give_up, (
                home / "serve.log"
            ).read_text()[-3000:]
            time.sleep(0.2)
        roles = descendants(process.pid)
        yield process, url, roles
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for pid in running(roles):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def _port_free(url: str) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", int(url.rsplit(":", 1)[1])))
        except OSError:
            return False
    return True


def _until_ended(pids: set[int], timeout_s: float) -> list[int]:
    give_up = time.monotonic() + timeout_s
    while running(pids) and time.monotonic() < give_up:
        time.sleep(0.2)
    return running(pids)


@pytest.mark.usefixtures("live_servers")
@pytest.mark.parametrize(
    ("sig", "code"),
    [(signal.SIGTERM, 0), (signal.SIGKILL, -signal.SIGKILL)],
    ids=["sigterm", "killed"],
)
def test_serve_answers_and_every_role_ends_with_it(
    database_url: str, namespace: str, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    """SIGTERM stops each role gracefully; killed outright, ``serve`` cannot, and each role,
    hearing SIGTERM as its parent dies, stops as it would on one."""
    with serving(database_url, namespace, tmp_path) as (serve, url, roles):
        auth = {"Authorization": f"Bearer {keys.key()}"}
        with httpx.Client(base_url=url, headers=auth, timeout=30) as http:
            sent = http.post("/v1/requests", json={"model": "echo-100ms", "input": "hello"})
            assert sent.status_code == 202, sent.text
            done = http.get(f"/v1/requests/{sent.json()['id']}", params={"wait": 20}).json()
            assert done["status"] == "succeeded" and done["output"]["text"] == "hello"
        assert len(roles) >= 5  # API, batcher, maintenance, webhooks, worker (and its pool)
        serve.send_signal(sig)
        assert serve.wait(timeout=60) == code
        assert _until_ended(roles, 60) == []
        assert _port_free(url)  # free for the next serve
