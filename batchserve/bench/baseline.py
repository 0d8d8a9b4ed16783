"""The front door's baseline: FastAPI and an in-process asyncio batcher, nothing durable.

What the seeds' problem needs at the least: a handler that queues its request and waits; one
model slot that takes, the moment it is free, everything waiting (up to ``batch``) and holds
it for the fixed batch time; each caller answered from its own future. No database, broker or
second process: the floor a durable service's HTTP path is compared with
(``bench --scenario frontdoor``). Run as ``python -m batchserve.bench.baseline --port P``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel

from batchserve.api.processes import end_with_parent
from batchserve.core import loops


class Submit(BaseModel):
    input: str


class Answer(BaseModel):
    output: str
    batch_size: int
    model_ended_at: float  # time.time() as the batch's model ended: what came after it


class InProcessBatcher:
    """``slots`` model slots: a batch leaves as soon as a slot is free and something waits."""

    def __init__(self, batch: int, batch_s: float, slots: int = 1) -> None:
        self.batch = batch
        self.batch_s = batch_s
        self.slots = slots
        self._waiting: list[tuple[str, asyncio.Future[Answer]]] = []
        self._arrived = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._run()) for _ in range(self.slots)]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def answer(self, text: str) -> Answer:
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._waiting.append((text, future))
        self._arrived.set()
        return await future

    async def _run(self) -> None:
        while True:
            await self._arrived.wait()
            taken, self._waiting = self._waiting[: self.batch], self._waiting[self.batch :]
            if not self._waiting:
                self._arrived.clear()
            if not taken:  # another slot took them
                continue
            await asyncio.sleep(self.batch_s)  # the seeds' model: a fixed time a batch
            ended = time.time()
            for text, future in taken:
                if not future.done():
                    future.set_result(
                        Answer(output=text, batch_size=len(taken), model_ended_at=ended)
                    )


def create_app(batch: int = 32, batch_s: float = 0.1, slots: int = 1) -> FastAPI:
    batcher = InProcessBatcher(batch, batch_s, slots)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        batcher.start()
        yield
        await batcher.stop()

    app = FastAPI(lifespan=lifespan)

    @app.post("/v1/requests")
    async def submit(body: Submit) -> Answer:
        return await batcher.answer(body.input)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batch-ms", type=float, default=100.0)
    parser.add_argument("--slots", type=int, default=1)
    args = parser.parse_args()
    end_with_parent()  # a bench killed outright leaves no server behind
    # Served as batchserve's API is (roles.py): uvloop, its collector tuned, httptools, no
    # access log.
    app = create_app(args.batch, args.batch_ms / 1000.0, args.slots)
    loops.tune_gc()
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=args.port,
        log_level="warning",
        access_log=False,
        loop="uvloop",
        http="httptools",
    )


if __name__ == "__main__":
    main()
