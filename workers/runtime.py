"""Per-process worker state: an event loop, store, event bus, queue and the loaded model.

Built once in each worker process (after the fork, so no connection is shared across
processes) and reused by every batch that process runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Any

from core.broker import RabbitRequestQueue
from core.db import create_engine
from core.domain import BatchMessage
from core.events import RedisEventBus
from core.settings import Settings
from core.store import JobStore
from models.loader import load_backend
from models.registry import ModelSpec
from workers.runner import BatchRunner

log = logging.getLogger("batchserve.worker")


def worker_id(model: str) -> str:
    return f"{model}@{socket.gethostname()}:{os.getpid()}"


class WorkerRuntime:
    def __init__(self, settings: Settings, spec: ModelSpec) -> None:
        assert settings.redis_url and settings.broker_url
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.engine = create_engine(settings.effective_database_url, pool_size=2)
        self.events = RedisEventBus(settings.redis_url, settings.name("events"))
        self.store = JobStore(
            self.engine, max_failures=settings.max_failures, on_change=self.events.publish
        )
        self.queue = RabbitRequestQueue(settings.broker_url, settings.namespace)
        self.backend = load_backend(spec)
        self.runner = BatchRunner(
            store=self.store,
            events=self.events,
            queue=self.queue,
            backend=self.backend,
            worker_id=worker_id(spec.name),
            lease_s=settings.lease_s,
        )
        log.info("worker_process_ready model=%s pid=%d", spec.name, os.getpid())

    def run(self, payload: dict[str, Any]) -> None:
        self.loop.run_until_complete(self.runner.run(BatchMessage.from_dict(payload)))


class RuntimeHolder:
    """Where the worker command leaves its settings for the pool processes it forks."""

    settings: Settings | None = None
    spec: ModelSpec | None = None
    runtime: WorkerRuntime | None = None

    @classmethod
    def get(cls) -> WorkerRuntime:
        if cls.runtime is None:
            assert cls.settings is not None and cls.spec is not None, "worker not configured"
            cls.runtime = WorkerRuntime(cls.settings, cls.spec)
        return cls.runtime
