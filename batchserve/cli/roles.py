"""Each production role as a function: api, batcher, maintenance (the worker is Celery's)."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Awaitable, Callable

from batchserve.batching.batcher import BatcherConfig, ModelBatcher
from batchserve.core import loops
from batchserve.core.broker import RabbitRequestQueue
from batchserve.core.health import role_health
from batchserve.core.logs import get_logger
from batchserve.core.metrics import serve_role_metrics
from batchserve.core.settings import Settings
from batchserve.core.wiring import Adapters, connect
from batchserve.models.registry import ModelSpec
from batchserve.workers.celery_app import create_celery
from batchserve.workers.dispatch import CeleryDispatcher
from batchserve.workers.jobs import JobDriver
from batchserve.workers.maintenance import Maintenance, MaintenanceConfig

log = get_logger("batchserve")


def batcher_config(settings: Settings) -> BatcherConfig:
    return BatcherConfig(dispatch_grace_s=settings.dispatch_grace_s)


def maintenance_config(settings: Settings) -> MaintenanceConfig:
    return MaintenanceConfig(
        republish_after_s=settings.republish_after_s,
        idempotency_retention_s=settings.idempotency_retention_s,
        request_retention_s=settings.request_retention_s,
    )


def job_driver(adapters: Adapters) -> JobDriver:
    return JobDriver(
        store=adapters.store,
        queue=adapters.queue,
        registry=adapters.registry,
        settings=adapters.settings,
        events=adapters.events,
    )


def select_models(adapters: Adapters, names: list[str] | None) -> list[ModelSpec]:
    registry = adapters.registry
    wanted = names or registry.names()
    unknown = [n for n in wanted if n not in registry]
    if unknown:
        raise SystemExit(
            f"unknown model(s): {', '.join(unknown)}; known: {', '.join(registry.names())}"
        )
    return [spec for n in wanted if (spec := registry.get(n)) is not None]


async def _until_signalled(
    *tasks: asyncio.Task[None],
    drain: Callable[[], Awaitable[None]] | None = None,
    grace_s: float = 10.0,
) -> None:
    """Run ``tasks`` until SIGTERM/SIGINT; then ``drain`` (a graceful stop the tasks end on by
    themselves) and give them ``grace_s`` to end before cancelling them."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    stopper = asyncio.create_task(stop.wait())
    done, _ = await asyncio.wait([stopper, *tasks], return_when=asyncio.FIRST_COMPLETED)
    for task in tasks:
        if task in done and (error := task.exception()) is not None:
            raise error
    stopper.cancel()
    if drain is not None and stopper in done:
        log.info("draining", grace_s=round(grace_s))
        await drain()
        await asyncio.wait(tasks, timeout=grace_s)
    for task in tasks:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def run_batcher(settings: Settings, models: list[str] | None) -> None:
    adapters = connect(settings, pool_size=4)
    specs = select_models(adapters, models)
    celery = create_celery(settings, [s.name for s in specs])
    assert isinstance(adapters.queue, RabbitRequestQueue)  # create_celery: a broker's URL
    dispatcher = CeleryDispatcher(celery, settings, adapters.queue)
    batchers = [
        ModelBatcher(
            spec,
            store=adapters.store,
            queue=adapters.queue,
            dispatcher=dispatcher,
            slots=adapters.slots,
            events=adapters.events,
            config=batcher_config(settings),
            loadboard=adapters.loadboard,
            joins=adapters.joins,
        )
        for spec in specs
    ]
    health = role_health()
    beating = asyncio.create_task(health.beat_forever())
    try:
        serve_role_metrics(settings, "batcher")

        async def drain() -> None:
            health.set_ready("draining")
            await asyncio.gather(*(b.drain() for b in batchers))

        running = [asyncio.create_task(b.run()) for b in batchers]
        health.set_ready()
        await _until_signalled(*running, drain=drain)
    finally:
        beating.cancel()
        await adapters.close()


async def run_maintenance(settings: Settings) -> None:
    adapters = connect(settings, pool_size=4)
    maintenance = Maintenance(
        store=adapters.store,
        queue=adapters.queue,
        events=adapters.events,
        config=maintenance_config(settings),
        jobs=job_driver(adapters),
    )
    health = role_health()
    beating = asyncio.create_task(health.beat_forever())
    try:
        serve_role_metrics(settings, "maintenance")
        running = asyncio.create_task(maintenance.run())
        health.set_ready()
        await _until_signalled(running)
    finally:
        beating.cancel()
        await adapters.close()


def run_api(settings: Settings, host: str, port: int) -> None:
    from batchserve.api.main import create_app
    from batchserve.api.server import serve_api

    if settings.api_processes > 1:
        from batchserve.api.processes import ApiProcesses

        raise SystemExit(ApiProcesses(settings, host, port).run())

    # On the services' loop (uvloop, the short GIL switch), as every other role; against the
    # standard loop it measured the same (docs/frontdoor.md).
    app = create_app(settings)
    loops.tune_gc()
    loops.run(serve_api(app, settings, host, port, timeout_graceful_shutdown=10))
