"""What became of the processes a test started, read from /proc (Linux)."""

from __future__ import annotations

import contextlib
import os
import secrets
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
import redis

from batchserve.testing.deployment import namespace_queues
from tests.support import servers


def descendants(pid: int) -> set[int]:
    """Every process below ``pid``: what it started, and what they did."""
    parents: dict[int, int] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            fields = stat.read_text().rpartition(")")[2].split()
            parents[int(stat.parent.name)] = int(fields[1])
    found: set[int] = set()
    wanted = {pid}
    while wanted:
        children = {child for child, parent in parents.items() if parent in wanted}
        wanted = children - found
        found |= children
    return found


def ended(pid: int) -> bool:
    """No such process, or only its exit status left to collect."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] in ("Z", "X")


def running(pids: set[int]) -> list[int]:
    return sorted(p for p in pids if not ended(p))


@dataclass
class Stopped:
    """A command that ran a deployment of its own, signalled mid-run, and what it left."""

    process: subprocess.Popen[str]
    database: str  # the deployment's database
    namespace: str  # its queues' and keys' prefix
    started: set[int]  # every process it had started
    out: str
    err: str

    def database_exists(self) -> bool:
        with psycopg.connect(servers.PG_ADMIN, autocommit=True) as admin:
            found = admin.execute(
                "SELECT count(*) FROM pg_database WHERE datname = %s", (self.database,)
            ).fetchone()
        return found != (0,)

    def keys(self) -> list[bytes]:
        client = redis.Redis.from_url(servers.REDIS_URL)
        try:
            return list(client.scan_iter(match=f"{self.namespace}*", count=1000))
        finally:
            client.close()

    def queues(self, models: list[str]) -> list[str]:
        """Of the queues the deployment may have declared for ``models``, those still there."""
        from amqp.exceptions import NotFound
        from kombu import Connection

        there = []
        with Connection(servers.BROKER_URL, connect_timeout=5) as connection:
            for name in namespace_queues(self.namespace, models):
                try:
                    connection.channel().queue_declare(name, passive=True)
                except NotFound:
                    continue
                there.append(name)
        return there

    def remove(self, models: list[str]) -> None:
        servers.drop_database(self.database)
        servers.delete_redis_keys(self.namespace)
        servers.delete_namespace_queues(self.namespace, models)


def signalled_mid_run(run_id: str, args: list[str], sig: int, log_dir: Path) -> Stopped:
    """``batchserve <args> --log-dir <log_dir>`` as its own process on this run's servers,
    sent ``sig`` once its deployment's model has run a batch; waited for, and for what it
    started to end."""
    base = f"{servers.DB_PREFIX}{run_id}_{secrets.token_hex(3)}"  # its database: {base}_...
    env = {
        **os.environ,
        "BATCHSERVE_DATABASE_URL": servers.pg_url(base),
        "BATCHSERVE_BROKER_URL": servers.BROKER_URL,
        "BATCHSERVE_REDIS_URL": servers.REDIS_URL,
    }
    command = subprocess.Popen(
        [sys.executable, "-m", "batchserve.cli", *args, "--log-dir", str(log_dir)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    database = ""
    started: set[int] = set()
    try:
        give_up = time.monotonic() + 180
        while time.monotonic() < give_up and command.poll() is None:
            with psycopg.connect(servers.PG_ADMIN, autocommit=True) as admin:
                row = admin.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s", (f"{base}_%",)
                ).fetchone()
            if row is not None:
                database = row[0]
                with (
                    contextlib.suppress(psycopg.Error),
                    psycopg.connect(servers.PG_ADMIN.rsplit("/", 1)[0] + f"/{database}") as conn,
                ):
                    if conn.execute("SELECT count(*) FROM batches").fetchone() != (0,):
                        break
            time.sleep(0.5)
        else:
            raise AssertionError(f"no batch ran: {command.poll()}")
        started = descendants(command.pid)
        command.send_signal(sig)
        out, err = command.communicate(timeout=120)
    finally:
        if command.poll() is None:
            command.kill()
            out, err = command.communicate()
    give_up = time.monotonic() + 30
    while running(started) and time.monotonic() < give_up:
        time.sleep(0.2)
    return Stopped(command, database, database.removeprefix(f"{base}_"), started, out, err)
