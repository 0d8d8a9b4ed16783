"""CPU a request of one route through FastAPI's own handler and as a ``LeanRoute``.

    python scripts/bench_routes.py --json > docs/frontdoor-routes.json

One in-process app a way, called straight through ASGI (no sockets, no server): a route with a
JSON body model, a path, a query and a header parameter, a router-level dependency and two
named ones (one behind the other), shaped as the API's submit and long-poll routes are.
Rounds alternate the ways; each round's figure is the process CPU time over its calls.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from collections.abc import MutableMapping
from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.routing import APIRoute
from pydantic import BaseModel

from batchserve.api.lean import LeanRoute
from batchserve.api.responses import JSON


class Body(BaseModel):
    model: str
    prompt: str
    max_tokens: int = 16


async def services(request: Request) -> object:
    return request.app.state.services


async def caller(request: Request) -> str:
    return request.headers.get("authorization", "")[7:]


async def tenant(key: Annotated[str, Depends(caller)]) -> str:
    return key.upper()


def build(route_class: type[APIRoute]) -> FastAPI:
    router = APIRouter(prefix="/v1", route_class=route_class, dependencies=[Depends(caller)])

    @router.post("/items/{item_id}")
    async def submit(
        item_id: uuid.UUID,
        body: Body,
        state: Annotated[object, Depends(services)],
        who: Annotated[str, Depends(tenant)],
        wait: Annotated[float, Query(ge=0)] = 0,
        key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    ) -> JSON:
        return JSON({"id": str(item_id), "who": who}, status_code=202)

    app = FastAPI()
    app.state.services = object()
    app.include_router(router)
    return app


BODY = orjson.dumps({"model": "fixed", "prompt": "hello there", "max_tokens": 8})
PATH = f"/v1/items/{uuid.uuid4()}"


async def call(app: FastAPI) -> int:
    scope: dict[str, Any] = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"wait=2",
        "root_path": "",
        "headers": [
            (b"host", b"test"),
            (b"content-type", b"application/json"),
            (b"authorization", b"Bearer key"),
            (b"idempotency-key", b"k-1"),
            (b"content-length", str(len(BODY)).encode()),
        ],
        "client": ("127.0.0.1", 1),
        "server": ("127.0.0.1", 80),
        "state": {},
    }
    status = 0
    received = False

    async def receive() -> dict[str, Any]:
        nonlocal received
        if not received:
            received = True
            return {"type": "http.request", "body": BODY, "more_body": False}
        return {"type": "http.disconnect"}

    async def send(message: MutableMapping[str, Any]) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]

    await app(scope, receive, send)
    return status


async def measure(rounds: int, calls: int) -> dict[str, Any]:
    apps = {"FastAPI's handler": build(APIRoute), "lean": build(LeanRoute)}
    for app in apps.values():
        async with app.router.lifespan_context(app):
            pass
        for _ in range(200):
            assert await call(app) == 202
    per_round: dict[str, list[float]] = {way: [] for way in apps}
    for _ in range(rounds):
        for way, app in apps.items():
            start = time.process_time()
            for _ in range(calls):
                await call(app)
            per_round[way].append(round((time.process_time() - start) / calls * 1e6, 1))
    return {
        "command": "python scripts/bench_routes.py --json",
        "calls_a_round": calls,
        "us_a_request": per_round,
        "median_us": {way: statistics.median(v) for way, v in per_round.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args.rounds, args.calls))
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        for way, median in result["median_us"].items():
            print(f"{way}: {median} us a request (median of {args.rounds} rounds)")


if __name__ == "__main__":
    main()
