"""``batchserve serve`` with servers configured: every role as a supervised child process."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

import httpx

from batchserve.core.logs import get_logger

log = get_logger("batchserve.serve")

# Given to each child: the role ends when the process of this pid does (``_end_with_supervisor``
# in batchserve/cli/main.py).
SUPERVISOR_PID = "BATCHSERVE_SUPERVISOR_PID"


@dataclass
class Child:
    name: str
    argv: list[str]
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: float = 0.0
    backoff_s: float = 0.5
    history: list[float] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)  # on top of this process's environment

    def start(self) -> None:
        env = {**os.environ, **self.env, SUPERVISOR_PID: str(os.getpid())}
        self.process = subprocess.Popen(self.argv, start_new_session=False, env=env)
        self.started_at = time.monotonic()
        log.info("child_started", name=self.name, child_pid=self.process.pid)


class Supervisor:
    """Starts the children, restarts any that exit, and stops them all on SIGTERM/SIGINT."""

    def __init__(self, children: list[Child]) -> None:
        self.children = children
        self._stopping = False

    def run(self, ready_url: str | None = None) -> int:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        for child in self.children:
            child.start()
        if ready_url:
            self._announce(ready_url)
        while not self._stopping:
            for child in self.children:
                if child.process is not None and child.process.poll() is not None:
                    self._restart(child)
            time.sleep(0.2)
        return self._shutdown()

    def _announce(self, url: str) -> None:
        for _ in range(150):
            if self._stopping:
                return
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    print(f"batchserve listening on {url}", flush=True)
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        log.warning("api_not_ready", url=url)

    def _restart(self, child: Child) -> None:
        assert child.process is not None
        code = child.process.returncode
        uptime_s = time.monotonic() - child.started_at
        child.backoff_s = 0.5 if uptime_s > 30 else min(child.backoff_s * 2, 10.0)
        log.warning(
            "child_exited",
            name=child.name,
            code=code,
            uptime_s=round(uptime_s, 1),
            restart_in_s=round(child.backoff_s, 1),
        )
        time.sleep(child.backoff_s)
        if not self._stopping:
            child.restarts += 1
            child.start()

    def _stop(self, signum: int, _frame: object) -> None:
        self._stopping = True

    def _shutdown(self, grace_s: float = 20.0) -> int:
        log.info("stopping", children=len(self.children))
        for child in self.children:
            if child.process is not None and child.process.poll() is None:
                child.process.send_signal(signal.SIGTERM)
        give_up = time.monotonic() + grace_s
        for child in self.children:
            if child.process is None:
                continue
            try:
                child.process.wait(timeout=max(0.1, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("child_killed", name=child.name, note="no exit after SIGTERM")
                child.process.kill()
                child.process.wait()
        return 0


def role_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "batchserve.cli", *args]


def plan_children(
    host: str,
    port: int,
    models: list[str],
    slots: dict[str, int],
    metrics_port: int | None = None,
    ops_port: int | None = None,
) -> list[Child]:
    """The roles of one machine. With ``metrics_port``, each role but the API gets an exporter
    port of its own, counting up from it; the API serves ``/metrics`` and the dashboard on
    ``ops_port`` (never on its public port)."""
    children = [
        Child("api", role_argv("api", "--host", host, "--port", str(port))),
        Child("batcher", role_argv("batcher")),
        Child("maintenance", role_argv("maintenance")),
        Child("webhooks", role_argv("webhooks")),
    ]
    for model in models:
        children.append(
            Child(
                f"worker:{model}",
                role_argv("worker", "--model", model, "--slots", str(slots.get(model, 1))),
            )
        )
    if ops_port is not None:
        children[0].env["BATCHSERVE_METRICS_PORT"] = str(ops_port)
    if metrics_port is not None:
        for offset, child in enumerate(c for c in children if c.name != "api"):
            child.env["BATCHSERVE_METRICS_PORT"] = str(metrics_port + offset)
            log.info("metrics_port", child=child.name, port=metrics_port + offset)
    return children
