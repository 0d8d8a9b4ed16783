"""Faults a chaos run injects: kill or freeze a role's processes, restart a local server.

Servers are restarted with the commands this machine's services were started with; every
restart waits for the port to answer again, so a run always leaves the servers up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from batchserve.testing.deployment import Stack


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_port(port: int, *, up: bool = True, timeout_s: float = 90.0) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if port_open(port) == up:
            return
        time.sleep(0.2)
    raise RuntimeError(f"port {port} did not {'open' if up else 'close'} in {timeout_s:.0f}s")


def _run(*argv: str, timeout_s: float = 120.0) -> None:
    subprocess.run(argv, check=True, timeout=timeout_s, capture_output=True)


def restart_postgres() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]
    _run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart", "-m", "fast")
    wait_port(5432)


def start_postgres() -> None:
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]
    if not port_open(5432):
        _run("pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "start")
    wait_port(5432)


def stop_redis() -> None:
    subprocess.run(
        ["redis-cli", "-p", "6379", "shutdown", "nosave"], capture_output=True, timeout=30
    )
    wait_port(6379, up=False)


def start_redis() -> None:
    if not port_open(6379):
        Path("/var/lib/redis").mkdir(parents=True, exist_ok=True)
        Path("/var/log/redis").mkdir(parents=True, exist_ok=True)
        _run(
            "redis-server",
            "--daemonize",
            "yes",
            "--bind",
            "127.0.0.1",
            "-::1",
            "--port",
            "6379",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            "/var/lib/redis",
            "--logfile",
            "/var/log/redis/ci.log",
        )
    wait_port(6379)


def restart_redis() -> None:
    stop_redis()
    start_redis()


def stop_rabbitmq() -> None:
    """Stop the broker application (the Erlang node stays, so it comes back in seconds)."""
    _run("rabbitmqctl", "stop_app")
    wait_port(5672, up=False)


def start_rabbitmq() -> None:
    _run("rabbitmqctl", "start_app")
    _run("rabbitmqctl", "await_startup", "--timeout", "120")
    wait_port(5672)


def restart_rabbitmq() -> None:
    stop_rabbitmq()
    start_rabbitmq()


def kill_worker_child(stack: Stack, name: str) -> int | None:
    """SIGKILL one pool process of a Celery worker (the one running a batch, if any)."""
    children = stack.child_pids(name)
    if not children:
        return None
    os.kill(children[0], signal.SIGKILL)
    return children[0]


def freeze(stack: Stack, name: str, seconds: float) -> None:
    """SIGSTOP a role and its children for ``seconds``, then SIGCONT: a worker that stops
    beating past its lease is reaped, and what it writes when it wakes is discarded."""
    pids = [stack.roles[name].pid, *stack.child_pids(name)]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(seconds)
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
