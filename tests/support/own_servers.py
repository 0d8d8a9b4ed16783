"""Servers of one test's own, to stop and start under load without touching the shared ones.

A Redis on a free port (its files in the test's folder) and a PostgreSQL cluster made with
Debian's ``pg_createcluster`` on a free port, migrated, with the tests' API key. A test that
takes one of these down runs beside the others; only what the shared servers must suffer
(RabbitMQ's restart) still runs alone at the end of ``make test``.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path

from batchserve.core.migrate import upgrade
from batchserve.testing.deployment import free_port, terminate
from tests.support import keys, servers

REDIS_START_S = 30.0


class OwnRedis:
    """``redis-server`` in the foreground, started and stopped by its pid."""

    def __init__(self, folder: Path) -> None:
        self.port = free_port()
        self.folder = folder
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        with (self.folder / "redis.log").open("ab") as log:
            self._process = subprocess.Popen(
                [
                    "redis-server",
                    *("--port", str(self.port), "--bind", "127.0.0.1"),
                    *("--save", "", "--appendonly", "no", "--dir", str(self.folder)),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        servers.wait_port("127.0.0.1", self.port, timeout_s=REDIS_START_S)

    def stop(self) -> None:
        if self._process is not None:
            terminate(self._process, 30)

    def restart(self) -> None:
        self.stop()
        self.start()

    def clients(self) -> int:
        """Connections open to this Redis now (this query's own included)."""
        import redis

        with redis.Redis.from_url(self.url) as client:
            return int(client.info("clients")["connected_clients"])


@contextlib.contextmanager
def own_redis(folder: Path) -> Iterator[OwnRedis]:
    redis = OwnRedis(folder)
    redis.start()
    try:
        yield redis
    finally:
        redis.stop()


def _pg_version() -> str:
    return sorted(p.name for p in Path("/etc/postgresql").iterdir())[0]


def _pg(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


class OwnPostgres:
    """A PostgreSQL cluster named after the test run (so a later run drops it if this one
    crashed), on a free port, trusting local connections, with one migrated database."""

    def __init__(self, run_id: str, suffix: str) -> None:
        self.version = _pg_version()
        self.name = f"{servers.DB_PREFIX}{run_id}_{suffix}"
        self.port = free_port()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/batchserve"

    def create(self) -> None:
        _pg(
            "pg_createcluster",
            *("--port", str(self.port), self.version, self.name),
            # A throwaway cluster: no fsync (a test's data need not survive the machine).
            *("-o", "fsync=off", "--", "--auth=trust"),
        )
        self.start()
        admin = f"postgresql://postgres@127.0.0.1:{self.port}/postgres"
        servers.create_database("batchserve", admin=admin)
        upgrade(self.url)
        keys.install(self.url)

    def start(self) -> None:
        _pg("pg_ctlcluster", "--skip-systemctl-redirect", self.version, self.name, "start")
        servers.wait_port("127.0.0.1", self.port)

    def stop(self) -> None:
        _pg(
            "pg_ctlcluster",
            *("--skip-systemctl-redirect", self.version, self.name, "stop", "-m", "fast"),
        )

    def drop(self) -> None:
        drop_cluster(self.version, self.name)


def drop_cluster(version: str, name: str) -> None:
    subprocess.run(
        ["pg_dropcluster", "--stop", version, name], capture_output=True, timeout=120, check=False
    )


def drop_stale_clusters() -> None:
    """Clusters left by crashed test runs (their pid is gone)."""
    listed = subprocess.run(
        ["pg_lsclusters", "--no-header"], capture_output=True, text=True, timeout=30, check=False
    ).stdout
    for line in listed.splitlines():
        fields = line.split()
        if len(fields) < 2 or not fields[1].startswith(servers.DB_PREFIX):
            continue
        run = fields[1][len(servers.DB_PREFIX) :].split("_")[0]
        pid = servers.run_pid(run)
        if pid is None or not servers.alive(pid):
            drop_cluster(fields[0], fields[1])


@contextlib.contextmanager
def own_postgres(run_id: str, suffix: str) -> Iterator[OwnPostgres]:
    drop_stale_clusters()
    postgres = OwnPostgres(run_id, suffix)
    try:
        postgres.create()
        yield postgres
    finally:
        postgres.drop()
