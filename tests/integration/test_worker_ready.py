"""A batch worker announces its slots only once every pool process has loaded its model: Celery
calls the worker ready while they may still be loading weights (seconds, for a real model), and
a batch sent to a slot announced then waited past its lease and was reaped and run again."""

from __future__ import annotations

import asyncio
import subprocess
import time
from pathlib import Path

from batchserve.core.health import RoleHealth
from batchserve.core.settings import Settings
from batchserve.core.slots import RedisSlotDirectory
from batchserve.models.registry import load_registry
from batchserve.workers.worker_main import _Heartbeat, _ReadyProcesses

MODEL = "all-minilm-l6-v2"


async def slots(settings: Settings) -> int:
    assert settings.redis_url
    directory = RedisSlotDirectory(settings.redis_url, settings.key_prefix)
    try:
        capacity = await directory.capacity(MODEL, time.time())
        assert capacity is not None
        return capacity.units
    finally:
        await directory.close()


def mark_as(ready: _ReadyProcesses, process: subprocess.Popen[bytes]) -> None:
    """A pool process's mark: a file named by its pid (here a live stand-in's)."""
    (ready.directory / str(process.pid)).touch()


async def test_slots_are_announced_once_every_pool_process_is_ready(settings: Settings) -> None:
    spec = load_registry(None).get(MODEL)
    assert spec is not None
    ready = _ReadyProcesses(2)
    health = RoleHealth()
    heartbeat = _Heartbeat(settings, spec, 1, ready, health)
    stand_ins = [subprocess.Popen(["sleep", "30"]) for _ in range(2)]
    try:
        heartbeat.start()
        mark_as(ready, stand_ins[0])
        dead = subprocess.Popen(["true"])
        dead.wait()
        (ready.directory / str(dead.pid)).touch()  # a process that died counts for nothing
        await asyncio.sleep(0.5)
        assert await slots(settings) == 0
        # Its probes: alive (the heartbeat thread beats while it waits), not ready yet.
        assert health.liveness()[1]["status"] == "ok"
        assert health.readiness() == (False, {"status": "not_ready", "reason": "loading the model"})
        mark_as(ready, stand_ins[1])
        for _ in range(40):
            if await slots(settings) == 1:
                break
            await asyncio.sleep(0.05)
        assert await slots(settings) == 1
        assert health.readiness() == (True, {"status": "ok"})
    finally:
        heartbeat.stop()
        ready.remove()
        for process in stand_ins:
            process.kill()
            process.wait()
    assert await slots(settings) == 0
    assert health.readiness() == (False, {"status": "not_ready", "reason": "draining"})
    assert not Path(ready.directory).exists()
