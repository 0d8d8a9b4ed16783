"""Running a chaos plan: a fresh local deployment, open-loop traffic, faults on a schedule."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from pathlib import Path
from typing import Annotated
from urllib.parse import urlsplit

import aiohttp
import psycopg
import typer
from sqlalchemy.engine import make_url

from batchserve.bench.loadgen import Submitted, open_loop, poisson_schedule
from batchserve.core.logs import get_logger, setup_logging
from batchserve.core.migrate import upgrade
from batchserve.core.settings import Settings, load_settings
from batchserve.models.registry import load_registry
from batchserve.testing import faults
from batchserve.testing.chaos import (
    ChaosPlan,
    ChaosReport,
    FaultRecord,
    audit,
    fault_schedule,
    new_run_name,
    traffic_body,
    wait_settled,
)
from batchserve.testing.deployment import Stack, new_log_dir, run_stoppable, settled

log = get_logger("batchserve.chaos")


class ChaosDeployment:
    """Two batchers (active + standby), a worker, maintenance and the API on a fresh database."""

    def __init__(self, settings: Settings, plan: ChaosPlan, log_dir: Path) -> None:
        assert settings.database_url and settings.broker_url and settings.redis_url
        self.plan = plan
        # The API declares a request queue for each model it knows, served here or not.
        self.models = load_registry(settings.models).names()
        self.run = new_run_name()
        url = make_url(settings.database_url)
        self.database = f"{url.database or 'batchserve'}_{self.run}"
        self.database_url = url.set(database=self.database).render_as_string(hide_password=False)
        self._admin_url = url.set(drivername="postgresql", database="postgres").render_as_string(
            hide_password=False
        )
        env = {
            **os.environ,
            "BATCHSERVE_DATABASE_URL": self.database_url,
            "BATCHSERVE_BROKER_URL": settings.broker_url,
            "BATCHSERVE_REDIS_URL": settings.redis_url,
            "BATCHSERVE_NAMESPACE": self.run,
            "BATCHSERVE_LEASE_S": "1.0",
            "BATCHSERVE_REPUBLISH_AFTER_S": "2",
        }
        if settings.models is not None:
            env["BATCHSERVE_MODELS"] = str(settings.models)
        self.stack = Stack(env=env, log_dir=log_dir)
        self.active_batcher = "batcher-a"

    def start(self) -> None:
        with psycopg.connect(self._admin_url, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{self.database}"')
        upgrade(self.database_url)
        self.stack.start("batcher-a", "batcher")
        time.sleep(1.0)  # a registers first and is the active consumer; b waits as standby
        self.stack.start("batcher-b", "batcher")
        self.stack.start("maintenance", "maintenance")
        self.start_worker()
        self.stack.start_api()
        self.stack.wait_slots(self.plan.model, self.plan.slots)

    def start_worker(self) -> None:
        self.stack.start(
            "worker", "worker", "--model", self.plan.model, "--slots", str(self.plan.slots)
        )

    def stop(self, keep: bool) -> None:
        self.stack.stop_all()
        if not keep:
            with psycopg.connect(self._admin_url, autocommit=True) as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')
            self.stack.remove_namespace(self.models)

    def inject(self, name: str) -> None:
        """Carry out one fault (blocking); every fault leaves the deployment whole again."""
        stack = self.stack
        if name == "kill-worker-pool-process":
            faults.kill_worker_child(stack, "worker")
        elif name == "kill-api":
            stack.kill("api")
            time.sleep(0.5)
            stack.start_api()
        elif name == "freeze-worker":
            faults.freeze(stack, "worker", seconds=3.0)  # three leases
        elif name == "kill-active-batcher":
            stack.kill(self.active_batcher)
            stack.start(self.active_batcher)  # back as the standby
            self.active_batcher = "batcher-b" if self.active_batcher == "batcher-a" else "batcher-a"
        elif name == "kill-worker":
            children = stack.child_pids("worker")
            stack.kill("worker")
            for pid in children:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, 9)
            time.sleep(1.0)
            self.start_worker()
        elif name == "restart-redis":
            faults.restart_redis()
        elif name == "restart-rabbitmq":
            faults.restart_rabbitmq()
        elif name == "restart-postgres":
            faults.restart_postgres()
        else:
            raise ValueError(f"unknown fault {name}")


async def run_plan(settings: Settings, plan: ChaosPlan, log_dir: Path, keep: bool) -> ChaosReport:
    deployment = ChaosDeployment(settings, plan, log_dir)
    records: list[FaultRecord] = []
    try:
        await settled(deployment.stack, deployment.start)
        cancel_every = 25

        async def cancel_some(session: aiohttp.ClientSession, submitted: Submitted) -> None:
            if submitted.index % cancel_every == 3 and submitted.request_id:
                await asyncio.sleep(0.05)
                with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError):
                    async with session.post(f"/v1/requests/{submitted.request_id}/cancel"):
                        pass

        traffic = asyncio.create_task(
            open_loop(
                deployment.stack.url,
                poisson_schedule(plan.rate, plan.duration_s, plan.seed),
                traffic_body(plan.model, plan.seed),
                headers=deployment.stack.auth(),
                on_accepted=cancel_some,
            )
        )
        started = time.monotonic()
        for at, name in fault_schedule(plan):
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            records.append(FaultRecord(name, time.time()))
            log.warning("fault_injected", name=name)
            # A fault stopped mid-way (a SIGTERM) is finished first: a restarted server is
            # up again before the run ends.
            await settled(deployment.stack, deployment.inject, name)
        load = await traffic
        accepted = [s.request_id for s in load.accepted if s.request_id]
        refused = len(load.submitted) - len(load.accepted) + load.errors
        await wait_settled(deployment.database_url, accepted, timeout_s=120)
        return await asyncio.to_thread(
            audit, deployment.database_url, accepted, refused=refused, faults=records
        )
    finally:
        await settled(deployment.stack, deployment.stop, keep)


def chaos(
    duration: Annotated[float, typer.Option(help="Seconds of traffic and faults")] = 120.0,
    rate: Annotated[float | None, typer.Option(help="Requests/s (default: half capacity)")] = None,
    model: Annotated[str, typer.Option(help="Model to load")] = "echo-100ms",
    slots: Annotated[int, typer.Option(help="Worker slots")] = 1,
    server_faults: Annotated[
        bool, typer.Option(help="Also restart the local Redis, RabbitMQ and Postgres")
    ] = True,
    seed: Annotated[int, typer.Option(help="Traffic seed")] = 1,
    keep: Annotated[bool, typer.Option(help="Keep the run's database for inspection")] = False,
    log_dir: Annotated[
        Path | None,
        typer.Option(
            file_okay=False,
            help="Where the run's log folder goes (default: the temporary directory)",
        ),
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document")] = False,
) -> None:
    """A bounded fault-injection run against a fresh local deployment, with a loss report."""
    settings = load_settings()
    setup_logging("chaos", fmt="text", level="WARNING")
    if settings.embedded:
        raise typer.BadParameter(
            "chaos needs servers: set BATCHSERVE_DATABASE_URL, _BROKER_URL, _REDIS_URL"
        )
    spec = load_registry(settings.models).get(model)
    if spec is None:
        raise typer.BadParameter(f"unknown model {model}")
    capacity = slots * spec.max_batch_size / (spec.batch_time_ms / 1000.0)
    plan = ChaosPlan(
        duration_s=duration,
        rate=rate or 0.5 * capacity,
        model=model,
        slots=slots,
        server_faults=server_faults and _servers_are_local(settings),
        seed=seed,
    )
    logs = new_log_dir("batchserve-chaos-", log_dir)
    report = run_stoppable(run_plan(settings, plan, logs, keep), "chaos")
    if as_json:
        typer.echo(json.dumps({**report.as_dict(), "rate": plan.rate, "logs": str(logs)}, indent=2))
    else:
        typer.echo(f"chaos: {duration:g} s at {plan.rate:g} requests/s on {slots} slot(s)")
        typer.echo(f"logs: {logs}")
        for line in report.lines():
            typer.echo(line)
    if not report.clean:
        raise typer.Exit(1)


def _servers_are_local(settings: Settings) -> bool:
    """Server faults restart this machine's services: only when the URLs point here."""
    hosts = [make_url(settings.database_url or "").host]
    hosts += [urlsplit(u or "").hostname for u in (settings.broker_url, settings.redis_url)]
    return all(h in ("127.0.0.1", "localhost", "::1") for h in hosts)
