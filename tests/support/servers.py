"""The real servers the integration, e2e and chaos tests use, and per-run isolation on them."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import time

import psycopg

from batchserve.core.pids import alive
from batchserve.testing import deployment

PG_ADMIN = os.environ.get("BATCHSERVE_TEST_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
BROKER_URL = os.environ.get("BATCHSERVE_TEST_BROKER", "amqp://guest:guest@127.0.0.1:5672//")
REDIS_URL = os.environ.get("BATCHSERVE_TEST_REDIS", "redis://127.0.0.1:6379/0")
DB_PREFIX = "bstest_"


def port_open(host: str, port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def wait_port(host: str, port: int, timeout_s: float = 60.0) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        if port_open(host, port):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{host}:{port} did not open within {timeout_s:.0f}s")


def new_run_id() -> str:
    """``t<pid>x<hex>``: unique per run, and tells a later run whether this one is still alive."""
    return f"t{os.getpid()}x{secrets.token_hex(3)}"


def run_pid(run_id: str) -> int | None:
    head = run_id[1:].split("x")[0]
    return int(head) if run_id.startswith("t") and head.isdigit() else None


def pg_url(database: str) -> str:
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{database}"


def create_database(name: str, template: str | None = None, *, admin: str = PG_ADMIN) -> None:
    with psycopg.connect(admin, autocommit=True) as conn:
        clause = f' TEMPLATE "{template}"' if template else ""
        conn.execute(f'CREATE DATABASE "{name}"{clause}')


def drop_database(name: str) -> None:
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def drop_stale_databases() -> None:
    """Databases left by crashed test runs (their pid is gone)."""
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        names = [
            r[0]
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE datname LIKE %s", (DB_PREFIX + "%",)
            )
        ]
        for name in names:
            pid = run_pid(name[len(DB_PREFIX) :].split("_")[0])
            if pid is not None and alive(pid):
                continue
            with contextlib.suppress(psycopg.Error):
                conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def delete_queues(prefix: str) -> None:
    """Remove RabbitMQ queues whose names start with ``prefix`` (best effort): listed with one
    rabbitmqctl call, deleted over AMQP (a rabbitmqctl call a queue took a second or more each
    and held up the end of every pytest process)."""
    try:
        out = subprocess.run(
            ["rabbitmqctl", "-q", "list_queues", "name", "--no-table-headers"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return
    _delete_over_amqp([name for name in out.split() if name.startswith(prefix)])


def delete_namespace_queues(namespace: str, models: list[str]) -> None:
    """Delete one deployment's queues over AMQP (fast; a quorum queue left behind costs
    RabbitMQ a Raft log, and hundreds of them slow every later connection down)."""
    _delete_over_amqp(deployment.namespace_queues(namespace, models))


def _delete_over_amqp(names: list[str]) -> None:
    if names:
        deployment.delete_queues(BROKER_URL, names)


def delete_redis_keys(prefix: str) -> None:
    deployment.delete_keys(REDIS_URL, prefix)
