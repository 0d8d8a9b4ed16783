"""``batchserve worker --model NAME``: a Celery worker whose slots run one batch each."""

from __future__ import annotations

import math
import os
import shutil
import socket
import threading
from pathlib import Path
from typing import Any

import billiard.pool
from celery import signals

from batchserve.core import scratch
from batchserve.core.clock import follow_database
from batchserve.core.health import RoleHealth, role_health
from batchserve.core.logs import get_logger
from batchserve.core.metrics import (
    enable_multiprocess,
    mark_process_dead,
    multiprocess_dir,
    remove_multiprocess_dir,
    serve_exporter,
)
from batchserve.core.pids import alive
from batchserve.core.settings import Settings
from batchserve.core.slots import SlotRegistration
from batchserve.models.plugins import plugin_for
from batchserve.models.registry import ModelSpec
from batchserve.workers.celery_app import RUN_BATCH_TASK, batches_queue_name, create_celery
from batchserve.workers.runtime import RuntimeHolder
from batchserve.workers.slot_gate import SlotGate

log = get_logger("batchserve.worker")


# How long a pool process told to stop waits for the worker's main process to have read the
# results it sent. billiard waits up to 30 s (300 x 0.1 s), and one wait never ends early:
# Celery's warm shutdown drops from its books a task it has written to a pool process but whose
# acknowledgement it has not read yet (for the broker to deliver again), and never reads that
# task's result, so a worker told to stop just as it handed out a batch took 31 s to exit, past
# a deployment's 30 s grace period. The batch's results are in Postgres by then, and the
# message delivered again finds its batch finished (``batch_skipped``); a result read late is
# still read (it stays in the pipe). tests/chaos/test_workers.py forces that moment.
POOL_EXIT_WAIT_S = 5.0


def bound_pool_exit_wait(seconds: float = POOL_EXIT_WAIT_S) -> None:
    """Bound billiard's wait (a module global it reads at each process's exit: set before the
    pool forks)."""
    interval = billiard.pool.GUARANTEE_MESSAGE_CONSUMPTION_RETRY_INTERVAL
    billiard.pool.GUARANTEE_MESSAGE_CONSUMPTION_RETRY_LIMIT = math.ceil(seconds / interval)


def _run_batch(payload: dict[str, Any]) -> None:
    RuntimeHolder.get().run(payload)


READY_PREFIX = "batchserve-ready-"


class _ReadyProcesses:
    """Which pool processes have loaded their model: each leaves a file named by its pid.

    Celery calls the worker ready once its consumer is, while the pool processes may still be
    loading weights (seconds, for a real model): a slot announced then takes a batch that waits
    for the load, past its lease. The slots are announced once every pool process is ready."""

    def __init__(self, processes: int) -> None:
        self.processes = processes
        self.directory = scratch.make(READY_PREFIX)  # the worker's and its pool's

    def mark(self) -> None:
        (self.directory / str(os.getpid())).touch()

    def count(self) -> int:
        marks = (path.name for path in self.directory.iterdir())
        return sum(1 for mark in marks if mark.isdigit() and alive(int(mark)))

    def remove(self) -> None:
        scratch.remove(self.directory)


class _Heartbeat:
    """Announces this worker's slots to the batcher, once its pool processes are ready,
    until the worker stops."""

    def __init__(
        self,
        settings: Settings,
        spec: ModelSpec,
        slots: int,
        ready: _ReadyProcesses,
        health: RoleHealth | None = None,
    ) -> None:
        assert settings.redis_url
        worker = f"{spec.name}@{socket.gethostname()}:{os.getpid()}"
        self._registration = SlotRegistration(
            settings.redis_url, settings.key_prefix, spec.name, worker, slots
        )
        self._period_s = settings.worker_heartbeat_s
        self._ttl_s = settings.worker_ttl_s
        self._stop = threading.Event()
        self._ready = ready
        self._health = health or role_health()
        self._model = spec.name
        self._thread = threading.Thread(target=self._loop, name="slot-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        # This thread's beats are the worker's liveness; it is ready once its slots are out.
        health = self._health
        health.set_ready("loading the model")
        while self._ready.count() < self._ready.processes:
            health.beat()
            if self._stop.wait(0.05):
                return
        log.info("slots_announced", model=self._model, processes=self._ready.processes)
        health.set_ready()
        while not self._stop.is_set():
            health.beat()
            self._registration.beat(self._ttl_s)
            self._stop.wait(self._period_s)

    def stop(self) -> None:
        self._health.set_ready("draining")
        self._stop.set()
        if self._thread.is_alive():  # a beat in flight must not re-announce after withdrawal
            self._thread.join(timeout=2.0)
        self._registration.withdraw()


def _serve_pool_metrics(settings: Settings) -> Path | None:
    """The pool's batches run in child processes: they write their metrics to files in a
    directory of this worker's, and this process serves them merged."""
    if settings.metrics_port is None:
        return None
    directory = multiprocess_dir("worker")
    enable_multiprocess(directory)
    serve_exporter(
        settings.metrics_port,
        settings.metrics_host,
        "worker",
        directory=directory,
        stall_after_s=settings.health_stall_s,
    )
    return directory


GATE_PREFIX = "batchserve-gate-"


def _gate_directory() -> Path:
    """A new gate directory for this worker (its gate takes the owner lock), after sweeping
    those of workers that died without removing theirs (killed outright: their lock is free)."""
    return scratch.fresh(GATE_PREFIX)


def standby_enabled(settings: Settings, spec: ModelSpec) -> bool:
    if settings.worker_standby == "auto":
        return not plugin_for(spec).holds_weights
    return settings.worker_standby == "on"


def run_worker(settings: Settings, spec: ModelSpec, *, slots: int, loglevel: str = "INFO") -> None:
    plugin = plugin_for(spec)
    if plugin.prepare is not None:
        # Once, here, before any pool forks or engine loads (e.g. converting the weights).
        plugin.prepare(spec)
    if plugin.kind == "engine":
        from batchserve.workers.engine_worker import run_engine_worker

        run_engine_worker(settings, spec, loglevel=loglevel)
        return
    metrics_dir = _serve_pool_metrics(settings)  # before any metric is touched
    # The slot heartbeat (this process) and the pool (forked from it) keep time on the
    # deployment's clock; each pool process syncs again as it connects.
    follow_database(settings.effective_database_url)
    bound_pool_exit_wait()
    app = create_celery(settings, [spec.name])
    app.task(name=RUN_BATCH_TASK, acks_late=True)(_run_batch)
    RuntimeHolder.settings = settings
    RuntimeHolder.spec = spec
    # The batcher sees ``slots``; with standby processes the pool has twice as many, and the
    # gate lets ``slots`` of them run a model at once.
    standby = standby_enabled(settings, spec)
    gate_dir = _gate_directory() if standby else None
    RuntimeHolder.gate = SlotGate.create(gate_dir, slots) if gate_dir is not None else None
    concurrency = 2 * slots if standby else slots
    ready = _ReadyProcesses(concurrency)
    heartbeat = _Heartbeat(settings, spec, slots, ready)

    @signals.worker_process_init.connect(weak=False)
    def _init_process(**_: Any) -> None:
        RuntimeHolder.runtime = None  # never reuse the parent's loop or connections
        RuntimeHolder.get()
        ready.mark()

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        heartbeat.start()
        log.info("worker_ready", model=spec.name, slots=slots, standby=standby)

    @signals.worker_process_shutdown.connect(weak=False)
    def _drain_process(**_: Any) -> None:
        if RuntimeHolder.runtime is not None:
            RuntimeHolder.runtime.drain()
        mark_process_dead(os.getpid())

    @signals.worker_shutting_down.connect(weak=False)
    def _stopping(**_: Any) -> None:
        # SIGTERM: the running batches finish (Celery's warm shutdown) but the batcher must
        # send no more here, so the slots go at once.
        log.info("worker_draining", model=spec.name)
        heartbeat.stop()

    @signals.worker_shutdown.connect(weak=False)
    def _shutdown(**_: Any) -> None:
        heartbeat.stop()
        if metrics_dir is not None:
            remove_multiprocess_dir(metrics_dir)
        if gate_dir is not None:
            shutil.rmtree(gate_dir, ignore_errors=True)
        ready.remove()

    worker = app.Worker(
        hostname=f"{spec.name}@{socket.gethostname()}.{os.getpid()}",
        queues=[batches_queue_name(settings, spec.name)],
        concurrency=concurrency,
        pool="prefork",
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
        optimization="fair",
    )
    worker.start()
