"""A deployment for benchmarks: its own database, queues and port, and the variants compared.

Each run writes a model registry into its own temp directory with one fixed 100 ms model per
variant (the same backend as ``echo-100ms``): ``bench-adaptive`` (batch B, the adaptive policy),
``bench-timer`` (batch B, the static timer policy) and ``bench-nobatch`` (batch 1), plus
``bench-wide`` (a large batch, so ingest tests are not limited by the workers). The API and
maintenance run for the whole run; a variant's batcher and worker are started for its turn only,
so idle variants cost nothing. Terminal transitions are heard as the API hears them, on the
deployment's Redis channel, and timestamped here.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url

from batchserve.core.domain import Event, StateChange
from batchserve.core.events import RedisEventBus, Subscription
from batchserve.core.migrate import upgrade
from batchserve.core.settings import Settings
from batchserve.models.registry import ModelSpec
from batchserve.testing.deployment import Stack, new_log_dir, settled, terminate

BATCH_TIME_MS = 100.0
TENANT = "bench"


@dataclass(frozen=True, slots=True)
class Variant:
    """One model of the run's registry: a name, its batch limit and policy."""

    name: str
    label: str
    max_batch_size: int
    policy: str = "adaptive"
    max_batch_delay_ms: float | None = None
    standby: str = "auto"  # the worker's standby processes (batchserve/workers/slot_gate.py)

    def ideal_rps(self, workers: int) -> float:
        return workers * self.max_batch_size * 1000.0 / BATCH_TIME_MS

    def spec(self) -> ModelSpec:
        return ModelSpec(
            name=self.name,
            backend="fixed",
            max_batch_size=self.max_batch_size,
            max_batch_delay_ms=self.max_batch_delay_ms,
            policy=self.policy,
            batch_time_ms=BATCH_TIME_MS,
        )

    def toml(self) -> str:
        lines = [
            f"[models.{self.name}]",
            'backend = "fixed"',
            f"batch_time_ms = {BATCH_TIME_MS:g}",
            f"max_batch_size = {self.max_batch_size}",
            f'policy = "{self.policy}"',
        ]
        if self.max_batch_delay_ms is not None:
            lines.append(f"max_batch_delay_ms = {self.max_batch_delay_ms:g}")
        return "\n".join(lines) + "\n"


def variants(batch: int, timer_delay_ms: float, wide_batch: int = 128) -> dict[str, Variant]:
    """The variants every scenario picks from, by label."""
    return {
        "adaptive": Variant("bench-adaptive", "adaptive", batch),
        "timer": Variant("bench-timer", "timer", batch, "timer", timer_delay_ms),
        "nobatch": Variant("bench-nobatch", "nobatch", 1),
        "nostandby": Variant("bench-nostandby", "nostandby", batch, standby="off"),
        "wide": Variant("bench-wide", "wide", wide_batch),
    }


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by nearest rank; NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))
    return float(ordered[rank])


def summary_ms(values_s: Sequence[float]) -> dict[str, float]:
    """p50, p99 and mean of durations given in seconds, in milliseconds."""
    ms = [v * 1000.0 for v in values_s]
    return {
        "p50_ms": round(percentile(ms, 0.50), 2),
        "p99_ms": round(percentile(ms, 0.99), 2),
        "mean_ms": round(sum(ms) / len(ms), 2) if ms else math.nan,
    }


class TerminalClock:
    """When each request's terminal state change was announced (committed, then published)."""

    def __init__(self, redis_url: str, channel: str) -> None:
        self.heard: dict[str, float] = {}
        self._bus = RedisEventBus(redis_url, channel)
        self._subscription: Subscription | None = None
        self._changed = asyncio.Event()

    async def start(self) -> None:
        self._subscription = self._bus.subscribe(self._on_event)
        while not self._subscription.healthy:
            await asyncio.sleep(0.01)

    def _on_event(self, event: Event) -> None:
        if isinstance(event, StateChange) and event.state.terminal:
            now = time.time()
            for request_id in event.request_ids:
                self.heard.setdefault(request_id, now)
            self._changed.set()

    async def wait_for(self, ids: Iterable[str], timeout_s: float) -> bool:
        """Wait until every one of ``ids`` is terminal; False when ``timeout_s`` ran out."""
        wanted = set(ids)
        give_up = time.monotonic() + timeout_s
        while not wanted.issubset(self.heard.keys()):
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return False
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=min(remaining, 1.0))
        return True

    async def close(self) -> None:
        if self._subscription is not None:
            await self._subscription.close()
        await self._bus.close()


def bench_log_dir(root: Path | None = None) -> Path:
    """A new folder for one deployment's logs, in ``root`` (``bench --log-dir``), else in the
    temporary directory. A bench keeps it and prints where."""
    return new_log_dir("bench-", root)


@dataclass
class BenchDeployment:
    """API and maintenance on a fresh database; batcher and worker per variant, on demand."""

    settings: Settings
    catalogue: dict[str, Variant]
    workers: int
    log_dir: Path = field(default_factory=bench_log_dir)
    keep: bool = False
    # py-spy records the first process of this role (``api``, ``batcher``, ``worker`` with its
    # pool, ``maintenance``) from its start to its stop, into ``profile_out`` (a flame graph;
    # collapsed stacks when it ends in ``.txt``).
    profile_role: str | None = None
    profile_out: Path | None = None
    # Further registry entries (name -> TOML table), e.g. the real models of the model bench.
    extra_models: dict[str, str] = field(default_factory=dict)
    # Processes of the API (``batchserve api --processes``).
    api_processes: int = 1
    # The roles' log level: WARNING leaves out the lines a request's history is made of, which
    # the service logs at its default, INFO.
    log_level: str = "WARNING"

    def __post_init__(self) -> None:
        self._profiler: subprocess.Popen[bytes] | None = None
        self._profiled: str | None = None
        assert self.settings.database_url and self.settings.broker_url and self.settings.redis_url
        self.run = f"bench{secrets.token_hex(3)}"
        url = make_url(self.settings.database_url)
        self.database = f"{url.database or 'batchserve'}_{self.run}"
        self.database_url = url.set(database=self.database).render_as_string(hide_password=False)
        self._admin_url = url.set(drivername="postgresql", database="postgres").render_as_string(
            hide_password=False
        )
        registry = self.log_dir / "models.toml"
        tables = [v.toml() for v in self.catalogue.values()] + list(self.extra_models.values())
        registry.write_text("\n".join(tables))
        env = {
            **os.environ,
            "BATCHSERVE_DATABASE_URL": self.database_url,
            "BATCHSERVE_BROKER_URL": self.settings.broker_url,
            "BATCHSERVE_REDIS_URL": self.settings.redis_url,
            "BATCHSERVE_NAMESPACE": self.run,
            "BATCHSERVE_MODELS": str(registry),
            "BATCHSERVE_LOG_LEVEL": self.log_level,
            "BATCHSERVE_LOG_FORMAT": "text",
            "BATCHSERVE_API_PROCESSES": str(self.api_processes),
        }
        env.pop("BATCHSERVE_METRICS_PORT", None)
        self.stack = Stack(env=env, log_dir=self.log_dir)
        self.clock = TerminalClock(self.settings.redis_url, f"{self.run}.events")
        self.headers: dict[str, str] = {}

    @property
    def url(self) -> str:
        return self.stack.url

    def dsn(self) -> str:
        return self.database_url.replace("postgresql+psycopg://", "postgresql://")

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[BenchDeployment]:
        """Started, then stopped and removed however the block ends: a start cut short (a
        SIGTERM, a Ctrl-C, a role that did not come up) stops what it had started."""
        try:
            await self.start()
            yield self
        finally:
            await self.stop()

    async def start(self) -> None:
        await settled(self.stack, self._start_blocking)
        await self.clock.start()

    def _start_blocking(self) -> None:
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        upgrade(self.database_url)
        key = self.stack.make_key(TENANT, max_queued=10_000_000, max_bulk_in_flight=1_000_000)
        self.headers = {"Authorization": f"Bearer {key}"}
        self.stack.start("maintenance", "maintenance")
        self._profile("maintenance")
        self.stack.start_api()
        self._profile("api")

    async def start_variant(self, variant: Variant) -> None:
        """The variant's batcher and its worker with W slots, once they are announced."""
        await settled(self.stack, self._start_variant_blocking, variant)

    def _start_variant_blocking(self, variant: Variant) -> None:
        self.stack.start(f"batcher:{variant.label}", "batcher", "--model", variant.name)
        self._profile(f"batcher:{variant.label}")
        name = f"worker:{variant.label}"
        self.stack.start(
            name,
            "worker",
            *("--model", variant.name, "--slots", str(self.workers)),
            *("--standby", variant.standby),
        )
        self.stack.wait_slots(variant.name, self.workers)
        self._profile(name)

    async def stop_variant(self, variant: Variant) -> None:
        def stop() -> None:
            roles = (f"worker:{variant.label}", f"batcher:{variant.label}")
            if self._profiled in roles:
                self._stop_profiler()
            for role in roles:
                if role in self.stack.roles:
                    self.stack.stop(role, timeout_s=15)

        await settled(self.stack, stop)

    def cpu_s(self) -> dict[str, float]:
        """CPU seconds used so far by each running role (a worker with its pool), by role kind:
        what each costs does not depend on how busy the machine is, unlike its latency."""
        used: dict[str, float] = {}
        for name, role in self.stack.roles.items():
            if role.alive():
                kind = name.split(":")[0]
                pids = [role.pid, *self.stack.child_pids(name)]
                used[kind] = used.get(kind, 0.0) + sum(_cpu_s(pid) for pid in pids)
        return used

    def api_gc(self) -> dict[str, float]:
        """The API's garbage collections so far (its ``batchserve_gc_pause_seconds``, from the
        operators' listener of its first process): how many, how many full, seconds in all."""
        text = httpx.get(f"{self.stack.ops_url}/metrics", timeout=10).text
        totals = {"collections": 0.0, "full": 0.0, "seconds": 0.0}
        for family in text_string_to_metric_families(text):
            if family.name != "batchserve_gc_pause_seconds":
                continue
            for sample in family.samples:
                if sample.name.endswith("_count"):
                    totals["collections"] += sample.value
                    if sample.labels.get("generation") == "2":
                        totals["full"] += sample.value
                elif sample.name.endswith("_sum"):
                    totals["seconds"] += sample.value
        return totals

    def query(self, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        with psycopg.connect(self.dsn()) as conn:
            return list(conn.execute(sql, params).fetchall())

    async def stop(self) -> None:
        await self.clock.close()
        await settled(self.stack, self._stop_blocking)

    def _profile(self, name: str) -> None:
        if self.profile_role is None or self._profiler is not None:
            return
        if name.split(":")[0] != self.profile_role or self.profile_out is None:
            return
        spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
        log_file = open(self.log_dir / "py-spy.log", "ab")  # noqa: SIM115 - the child owns it
        self.profile_out.parent.mkdir(parents=True, exist_ok=True)
        self._profiler = subprocess.Popen(
            [
                *(spy, "record", "--pid", str(self.stack.roles[name].pid), "--subprocesses"),
                *("--nonblocking", "--rate", "100", "--output", str(self.profile_out)),
                *("--format", "raw" if self.profile_out.suffix == ".txt" else "flamegraph"),
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
        self._profiled = name
        log_file.close()

    def _stop_profiler(self) -> None:
        """py-spy writes its flame graph when interrupted."""
        profiler, self._profiler = self._profiler, None
        if profiler is not None:
            terminate(profiler, 60, signal.SIGINT)
        self.profile_role = None  # one process per run

    def _stop_blocking(self) -> None:
        self._stop_profiler()
        self.stack.stop_all()
        if self.keep:
            return
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
        self.stack.remove_namespace(
            [v.name for v in self.catalogue.values()] + [*self.extra_models]
        )


# The kernel's TCP counters a front door's rounds report (this host's, all sockets: a benchmark
# runs alone): connections accepted, those dropped because a listener's accept queue was full
# (the server did not accept as fast as callers connected: they wait on SYN retransmissions),
# and established connections reset.
TCP_COUNTERS = {
    ("Tcp", "PassiveOpens"): "accepted",
    ("TcpExt", "ListenOverflows"): "listen_overflows",
    ("Tcp", "EstabResets"): "resets",
}


def tcp_counters() -> dict[str, int]:
    """:data:`TCP_COUNTERS` now, from ``/proc/net/snmp`` and ``/proc/net/netstat``."""
    found: dict[str, int] = {}
    for table in ("/proc/net/snmp", "/proc/net/netstat"):
        try:
            lines = Path(table).read_text().splitlines()
        except OSError:
            continue
        for names, values in zip(lines[::2], lines[1::2], strict=False):
            group, _, header = names.partition(": ")
            counts = dict(zip(header.split(), values.partition(": ")[2].split(), strict=False))
            for (wanted, counter), name in TCP_COUNTERS.items():
                if group == wanted and counter in counts:
                    found[name] = int(counts[counter])
    return found


def tcp_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before.get(name, 0) for name in after}


def _cpu_s(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cores_busy() -> tuple[float, float]:
    """Clock ticks so far that this machine's cores spent busy, and in all (``/proc/stat``):
    between two readings, the busy share says whether the machine ran out of CPU."""
    ticks = [int(t) for t in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    idle = ticks[3] + ticks[4]  # idle and iowait; guest time is within user already
    return float(sum(ticks) - idle), float(sum(ticks))


def busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of the machine's CPU busy between two :func:`cores_busy` readings."""
    total = after[1] - before[1]
    return round((after[0] - before[0]) / total, 3) if total > 0 else math.nan


# The servers' processes, by the name the kernel gives them (``/proc/<pid>/comm``).
SERVER_PROCESSES = {"postgres": "postgres", "beam.smp": "rabbitmq", "redis-server": "redis"}


def server_cpu_s() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each local Postgres, RabbitMQ and Redis process, by pid. The
    servers are this machine's whole: what else uses them counts too (a benchmark runs alone),
    and a process that exits between two readings drops out (the roles' pools keep theirs)."""
    found: dict[int, tuple[str, float]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            server = SERVER_PROCESSES.get((entry / "comm").read_text().strip())
        except OSError:
            continue
        if server is not None:
            found[int(entry.name)] = (server, _cpu_s(int(entry.name)))
    return found


def server_cpu_per(
    before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]], count: int
) -> dict[str, float]:
    """The servers' CPU milliseconds per unit of work between two :func:`server_cpu_s`
    readings (a process started between them counts from zero)."""
    spent = dict.fromkeys(SERVER_PROCESSES.values(), 0.0)
    for pid, (server, seconds) in after.items():
        spent[server] += seconds - before.get(pid, (server, 0.0))[1]
    return {server: round(s * 1000.0 / count, 3) for server, s in spent.items()} if count else {}


def cpu_per(before: dict[str, float], after: dict[str, float], count: int) -> dict[str, float]:
    """CPU milliseconds per unit of work, by role, between two :meth:`cpu_s` readings."""
    return {
        kind: round((after[kind] - before.get(kind, 0.0)) * 1000.0 / count, 3)
        for kind in sorted(after)
        if count
    }
