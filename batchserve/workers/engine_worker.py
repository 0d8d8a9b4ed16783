"""``batchserve worker --model NAME`` for an engine backend: one engine, many sequences.

The process holds one engine (one copy of the model) and an event loop in a thread of its own
where the engine runner lives. Celery's consumer takes the batch tasks the batcher sends (only
as many requests as the engine announced room for); each task only takes its batch's lease and
hands the requests to the engine, so it returns at once and the next batch can join while
the first still generates. A heartbeat announces the engine's capacity in sequences and KV
tokens, with the speed it measured at start.

SIGTERM (a rolling restart): the heartbeat is withdrawn so nothing new comes, the sequences
running finish (up to ``drain_s``), then the process exits; whatever was still running then
is requeued by maintenance when its lease runs out. An engine that stops stepping (hung) makes
the process exit, so its supervisor starts a fresh one.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import threading
from typing import Any

from celery import signals

from batchserve.core.domain import BatchMessage
from batchserve.core.health import role_health
from batchserve.core.logs import get_logger
from batchserve.core.loops import new_event_loop
from batchserve.core.metrics import serve_role_metrics
from batchserve.core.settings import Settings
from batchserve.core.slots import SlotRegistration
from batchserve.core.wiring import Adapters, connect
from batchserve.models.loader import load_engine
from batchserve.models.registry import ModelSpec
from batchserve.workers.celery_app import RUN_BATCH_TASK, batches_queue_name, create_celery
from batchserve.workers.engine_runner import EngineRunner, EngineRunnerConfig
from batchserve.workers.runtime import worker_id

log = get_logger("batchserve.worker")


def stall_limit_s(runner: EngineRunner) -> float:
    """How long an engine may go without a step before it counts as hung: twenty times its
    slowest measured step (a prefill chunk with every sequence decoding), at least 30 s."""
    profile = runner.engine.profile
    if profile is None:
        return 60.0
    chunk_s = 512 / max(profile.prefill_tokens_per_s, 1.0)
    return max(30.0, 20.0 * (chunk_s + profile.decode_step_s))


class EngineWorker:
    def __init__(self, settings: Settings, spec: ModelSpec) -> None:
        assert settings.redis_url and settings.broker_url
        self.settings, self.spec = settings, spec
        self.loop = new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="worker-loop")
        self._thread.daemon = True
        self._thread.start()
        self.adapters: Adapters = self._on_loop(self._connect())
        engine = load_engine(spec)
        self.runner = EngineRunner(
            store=self.adapters.store,
            events=self.adapters.events,
            queue=self.adapters.queue,
            engine=engine,
            model=spec.name,
            max_new_tokens=spec.max_new_tokens,
            worker_id=worker_id(spec.name),
            config=EngineRunnerConfig(lease_s=settings.lease_s),
            on_stalled=self._stalled,
            tokens=self.adapters.tokens,
        )
        self._on_loop(self.runner.start())
        self.runner.config = dataclasses.replace(
            self.runner.config, stall_s=stall_limit_s(self.runner)
        )
        capacity, profile = engine.capacity, engine.profile
        self.registration = SlotRegistration(
            settings.redis_url,
            settings.key_prefix,
            spec.name,
            self.runner.worker_id,
            capacity.max_num_seqs,
            tokens=capacity.max_num_tokens,
            profile=None if profile is None else dataclasses.asdict(profile),
        )
        self._stop_beating = threading.Event()
        self._beater = threading.Thread(target=self._beat, name="heartbeat", daemon=True)

    async def _connect(self) -> Adapters:
        return connect(self.settings, pool_size=4)

    def _on_loop(self, coroutine: Any, timeout: float | None = None) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    def accept(self, payload: dict[str, Any]) -> None:
        """The Celery task: take the batch's lease and hand its requests to the engine."""
        self._on_loop(self.runner.accept(BatchMessage.from_dict(payload)))

    def start_heartbeat(self) -> None:
        self._beater.start()
        role_health().set_ready()

    def _beat(self) -> None:
        # The slot heartbeat is the process's liveness too: a stalled engine stops both.
        health = role_health()
        while not self._stop_beating.is_set():
            if not self.runner.stalled:
                health.beat()
                self.registration.beat(self.settings.worker_ttl_s)
            self._stop_beating.wait(self.settings.worker_heartbeat_s)

    def withdraw(self) -> None:
        role_health().set_ready("draining")
        self._stop_beating.set()
        if self._beater.is_alive():  # a beat in flight must not re-announce after withdrawal
            self._beater.join(timeout=2.0)
        self.registration.withdraw()

    def drain_and_close(self, drain_s: float) -> None:
        self.withdraw()
        finished = self._on_loop(self.runner.drain(drain_s))
        log.info("worker_drained", model=self.spec.name, all_finished=finished)
        self._on_loop(self.runner.close(), timeout=60)
        self._on_loop(self.adapters.close(), timeout=30)

    def _stalled(self) -> None:
        # The leases are left to run out (maintenance requeues what ran here); a fresh
        # process is the only cure for a hung engine.
        log.error("worker_exiting", model=self.spec.name, reason="engine_stalled")
        self.registration.withdraw()
        os._exit(70)


def run_engine_worker(settings: Settings, spec: ModelSpec, *, loglevel: str = "INFO") -> None:
    serve_role_metrics(settings, "worker")
    worker_state = EngineWorker(settings, spec)
    app = create_celery(settings, [spec.name])

    def run_batch(payload: dict[str, Any]) -> None:
        worker_state.accept(payload)

    app.task(name=RUN_BATCH_TASK, acks_late=True)(run_batch)

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        worker_state.start_heartbeat()
        capacity = worker_state.runner.engine.capacity
        log.info(
            "worker_ready",
            model=spec.name,
            kind="engine",
            max_num_seqs=capacity.max_num_seqs,
            max_num_tokens=capacity.max_num_tokens,
        )

    @signals.worker_shutting_down.connect(weak=False)
    def _stopping(**_: Any) -> None:
        log.info("worker_draining", model=spec.name)
        worker_state.withdraw()

    @signals.worker_shutdown.connect(weak=False)
    def _shutdown(**_: Any) -> None:
        worker_state.drain_and_close(settings.engine_drain_s)

    worker = app.Worker(
        hostname=f"{spec.name}@{socket.gethostname()}.{os.getpid()}",
        queues=[batches_queue_name(settings, spec.name)],
        concurrency=1,
        pool="solo",
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
        optimization="fair",
    )
    worker.start()
