"""The embedded mode: every role in one process, on a SQLite file and in-process queues.

Same policy, same store logic, same API as the full stack; no servers to install. For
development and demos: one process means one machine and no fault isolation between roles.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import Callable

from batchserve.api.main import create_app
from batchserve.api.server import serve_api
from batchserve.api.services import ApiServices
from batchserve.batching.batcher import ModelBatcher
from batchserve.cli.roles import batcher_config, job_driver, maintenance_config
from batchserve.cli.served import redacted
from batchserve.core import loops
from batchserve.core.clock import deployment_time
from batchserve.core.logs import get_logger
from batchserve.core.migrate import upgrade
from batchserve.core.republish import publish_and_mark
from batchserve.core.settings import Settings
from batchserve.core.slots import MemorySlotDirectory
from batchserve.core.wiring import Adapters, connect
from batchserve.models.loader import load_backend, load_engine
from batchserve.models.plugins import plugin_for, servable
from batchserve.models.registry import Registry
from batchserve.workers.dispatch import InProcessDispatcher
from batchserve.workers.engine_runner import EngineRunner, EngineRunnerConfig
from batchserve.workers.maintenance import Maintenance
from batchserve.workers.runner import BatchRunner
from batchserve.workers.webhooks.delivery import create_deliverer
from batchserve.workers.webhooks.relay import InProcessSenders, Relay

log = get_logger("batchserve.embedded")


class EmbeddedStack:
    """All roles wired in-process. ``start`` then serve the app; ``stop`` when done.

    ``clock`` is the one every role reads; a test passes a fake one and, with
    ``start(background=False)``, steps the batchers and maintenance itself."""

    def __init__(self, settings: Settings, *, clock: Callable[[], float] = deployment_time) -> None:
        self.settings = settings
        self.clock = clock
        self.adapters: Adapters = connect(settings)
        # A light install serves what it can; the API then calls the rest unknown.
        specs, refused = servable(self.adapters.registry.specs())
        for name, reason in refused.items():
            log.warning("model_not_served", model=name, reason=reason)
            print(f"batchserve: not serving {name}: {reason}", flush=True)
        self.adapters.registry = Registry({spec.name: spec for spec in specs})
        runners: dict[str, BatchRunner] = {}
        self.engines: dict[str, EngineRunner] = {}
        for spec in specs:
            plugin = plugin_for(spec)
            if plugin.prepare is not None:
                plugin.prepare(spec)
            if plugin.kind == "engine":
                self.engines[spec.name] = EngineRunner(
                    store=self.adapters.store,
                    events=self.adapters.events,
                    queue=self.adapters.queue,
                    engine=load_engine(spec),
                    model=spec.name,
                    max_new_tokens=spec.max_new_tokens,
                    worker_id=f"embedded:{spec.name}",
                    config=EngineRunnerConfig(lease_s=settings.lease_s),
                    tokens=self.adapters.tokens,
                    clock=clock,
                )
                continue
            runners[spec.name] = BatchRunner(
                store=self.adapters.store,
                events=self.adapters.events,
                queue=self.adapters.queue,
                backend=load_backend(spec),
                worker_id=f"embedded:{spec.name}",
                lease_s=settings.lease_s,
                tokens=self.adapters.tokens,
                clock=clock,
                joins=self.adapters.joins,
            )
        self.dispatcher = InProcessDispatcher(
            runners, self.engines, slots={spec.name: spec.slots for spec in specs}
        )
        self.batchers = [
            ModelBatcher(
                spec,
                store=self.adapters.store,
                queue=self.adapters.queue,
                dispatcher=self.dispatcher,
                slots=self.adapters.slots,
                events=self.adapters.events,
                config=batcher_config(settings),
                loadboard=self.adapters.loadboard,
                clock=clock,
                joins=self.adapters.joins,
            )
            for spec in specs
        ]
        self.maintenance = Maintenance(
            store=self.adapters.store,
            queue=self.adapters.queue,
            events=self.adapters.events,
            config=maintenance_config(settings),
            jobs=job_driver(self.adapters),
            clock=clock,
        )
        # Webhooks: the same deliverer as the webhooks role, its attempts as tasks of this loop.
        self.deliverer = create_deliverer(self.adapters.store, settings)
        self.senders = InProcessSenders(self.deliverer, self.deliverer.config.concurrency)
        self.relay = Relay(
            store=self.adapters.store,
            senders=self.senders,
            lease_s=self.deliverer.config.lease_s,
            tick_s=self.deliverer.config.relay_tick_s,
            events=self.adapters.events,
        )
        self.api = ApiServices.create(settings, self.adapters, clock=clock)
        self._tasks: list[asyncio.Task[None]] = []

    async def start(self, *, background: bool = True) -> None:
        """Start every role; without ``background`` nothing runs on its own: the caller steps
        the batchers (``step``, ``run_due``) and maintenance (``tick``)."""
        slots = self.adapters.slots
        assert isinstance(slots, MemorySlotDirectory)
        for spec in self.adapters.registry.specs():
            runner = self.engines.get(spec.name)
            if runner is None:
                slots.register(spec.name, "embedded", spec.slots, float("inf"))
                continue
            await runner.start()
            engine = runner.engine
            slots.register(
                spec.name,
                "embedded",
                engine.capacity.max_num_seqs,
                float("inf"),
                tokens=engine.capacity.max_num_tokens,
                profile=None if engine.profile is None else dataclasses.asdict(engine.profile),
            )
        # The in-process queue starts empty: whatever was queued when we stopped goes back in.
        recovered = await self.adapters.store.queued_messages()
        await publish_and_mark(self.adapters.queue, self.adapters.store, recovered)
        if recovered:
            log.info("recovered_queued", count=len(recovered))
        for batcher in self.batchers:
            await batcher.start(background=background)
            if background:
                self._tasks.append(asyncio.create_task(batcher.loop()))
        if background:
            self._tasks.append(asyncio.create_task(self.maintenance.run()))
            self._tasks.append(asyncio.create_task(self.relay.run()))
        await self.api.start()

    async def stop(self) -> None:
        await self.api.stop(close_adapters=False)
        for batcher in self.batchers:
            await batcher.stop()
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.dispatcher.close()
        for runner in self.engines.values():
            await runner.close()
        await self.senders.close()
        await self.deliverer.close()
        await self.adapters.close()


async def run_embedded(settings: Settings, host: str, port: int) -> None:
    await asyncio.to_thread(upgrade, settings.effective_database_url)
    stack = EmbeddedStack(settings)
    await stack.start()
    app = create_app(settings, services=stack.api)
    # As every role does: what start-up made (the models, the app) out of every collection, and
    # the youngest generation collected at the roles' threshold (batchserve/core/loops.py).
    loops.tune_gc()
    log.info(
        "embedded_ready",
        url=f"http://{host}:{port}",
        database=redacted(settings.effective_database_url),
    )
    print(f"batchserve (embedded) listening on http://{host}:{port}", flush=True)
    if settings.metrics_port is not None:
        ops = f"http://{settings.metrics_host}:{settings.metrics_port}"
        print(f"dashboard on {ops}/dashboard, metrics on {ops}/metrics", flush=True)
    try:
        await serve_api(app, settings, host, port)
    finally:
        await stack.stop()
