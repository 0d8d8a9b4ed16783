"""``batchserve worker --model NAME``: a Celery worker whose slots run one batch each."""

from __future__ import annotations

import logging
import os
import socket
import threading
from typing import Any

from celery import signals

from core.settings import Settings
from core.slots import SlotRegistration
from models.registry import ModelSpec
from workers.celery_app import RUN_BATCH_TASK, batches_queue_name, create_celery
from workers.runtime import RuntimeHolder

log = logging.getLogger("batchserve.worker")


def _run_batch(payload: dict[str, Any]) -> None:
    RuntimeHolder.get().run(payload)


class _Heartbeat:
    """Announces this worker's slots to the batcher until the worker stops."""

    def __init__(self, settings: Settings, spec: ModelSpec, slots: int) -> None:
        assert settings.redis_url
        worker = f"{spec.name}@{socket.gethostname()}:{os.getpid()}"
        self._registration = SlotRegistration(
            settings.redis_url, settings.key_prefix, spec.name, worker, slots
        )
        self._period_s = settings.worker_heartbeat_s
        self._ttl_s = settings.worker_ttl_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="slot-heartbeat", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._registration.beat(self._ttl_s)
            self._stop.wait(self._period_s)

    def stop(self) -> None:
        self._stop.set()
        self._registration.withdraw()


def run_worker(settings: Settings, spec: ModelSpec, *, slots: int, loglevel: str = "INFO") -> None:
    app = create_celery(settings, [spec.name])
    app.task(name=RUN_BATCH_TASK, acks_late=True)(_run_batch)
    RuntimeHolder.settings = settings
    RuntimeHolder.spec = spec
    heartbeat = _Heartbeat(settings, spec, slots)

    @signals.worker_process_init.connect(weak=False)
    def _init_process(**_: Any) -> None:
        RuntimeHolder.runtime = None  # never reuse the parent's loop or connections
        RuntimeHolder.get()

    @signals.worker_ready.connect(weak=False)
    def _ready(**_: Any) -> None:
        heartbeat.start()
        log.info("worker_ready model=%s slots=%d", spec.name, slots)

    @signals.worker_shutdown.connect(weak=False)
    def _shutdown(**_: Any) -> None:
        heartbeat.stop()

    worker = app.Worker(
        hostname=f"{spec.name}@{socket.gethostname()}.{os.getpid()}",
        queues=[batches_queue_name(settings, spec.name)],
        concurrency=slots,
        pool="prefork",
        loglevel=loglevel,
        without_gossip=True,
        without_mingle=True,
        without_heartbeat=True,
        optimization="fair",
    )
    worker.start()
