"""``LeanRoute``: a request its plan resolves runs without FastAPI's dependency solver; any
other is answered by FastAPI's own handler, word for word as a plain ``APIRoute`` answers it."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Annotated, Any, Literal

import fastapi.routing
import pytest
from fastapi import APIRouter, Depends, FastAPI, Header, Query, Request
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from pydantic import BaseModel, Field

from batchserve.api.lean import LeanRoute
from batchserve.api.main import create_app
from batchserve.api.responses import JSON


class Item(BaseModel):
    name: str = Field(max_length=8)
    count: int = 1


SEEN: list[str] = []  # the dependencies called, in order (module level: annotations name them)


async def services(request: Request) -> str:
    SEEN.append("services")
    return str(request.app.title)


async def caller(request: Request) -> str:
    SEEN.append("caller")
    if request.headers.get("authorization") != "Bearer k":
        raise fastapi.HTTPException(401, "no key")
    return "tenant-a"


async def tenant(who: Annotated[str, Depends(caller)]) -> str:
    return who.upper()


def build(route_class: type[APIRoute]) -> FastAPI:
    router = APIRouter(prefix="/v1", route_class=route_class, dependencies=[Depends(caller)])

    @router.post("/items/{item_id}")
    async def put_item(
        item_id: uuid.UUID,
        body: Item,
        app_title: Annotated[str, Depends(services)],
        who: Annotated[str, Depends(tenant)],
        wait: Annotated[float, Query(ge=0)] = 0,
        until: Literal["terminal", "change"] = "terminal",
        key: Annotated[str | None, Header(alias="Idempotency-Key")] = None,
    ) -> JSON:
        return JSON(
            {
                "id": str(item_id),
                "body": body.model_dump(),
                "app": app_title,
                "who": who,
                "wait": wait,
                "until": until,
                "key": key,
                "types": [type(item_id).__name__, type(wait).__name__],
            }
        )

    app = FastAPI(title="lean-test")
    app.include_router(router)
    return app


@pytest.fixture
def solver_calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    calls: list[int] = []
    original = fastapi.routing.solve_dependencies

    async def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return await original(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counting)
    yield calls


ITEM = "/v1/items/0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b"
AUTH = {"authorization": "Bearer k"}


def test_a_resolved_request_skips_fastapis_solver_with_the_same_values(
    solver_calls: list[int],
) -> None:
    SEEN.clear()
    lean = TestClient(build(LeanRoute))
    plain = TestClient(build(APIRoute))
    headers = {**AUTH, "Idempotency-Key": "k-1"}
    url = f"{ITEM}?wait=2.5&until=change"
    got = lean.post(url, json={"name": "a", "count": 3}, headers=headers)
    assert solver_calls == []  # the plan resolved it
    assert SEEN == ["caller", "services"]  # each dependency once, cached for the request
    expected = plain.post(url, json={"name": "a", "count": 3}, headers=headers)
    assert got.status_code == expected.status_code == 200
    assert got.json() == expected.json()
    assert got.json()["types"] == ["UUID", "float"]
    assert got.json()["who"] == "TENANT-A" and got.json()["key"] == "k-1"


@pytest.mark.parametrize(
    ("url", "body", "headers"),
    [
        pytest.param(f"{ITEM}?wait=-1", b'{"name": "a"}', None, id="query below its bound"),
        pytest.param(f"{ITEM}?until=never", b'{"name": "a"}', None, id="query not a literal"),
        pytest.param("/v1/items/not-a-uuid", b'{"name": "a"}', None, id="path not a uuid"),
        pytest.param(ITEM, b'{"name": "far too long"}', None, id="body field over its limit"),
        pytest.param(ITEM, b'{"count": 2}', None, id="body field missing"),
        pytest.param(ITEM, b'{"name": "a",', None, id="body not json"),
        pytest.param(ITEM, b"", None, id="no body"),
        pytest.param(ITEM, b'{"name": "a"}', {"content-type": "text/plain"}, id="not json type"),
        pytest.param(ITEM, b'{"name": "a"}', {"authorization": "Bearer x"}, id="bad key"),
    ],
)
def test_every_refusal_is_fastapis_own(
    url: str, body: bytes, headers: dict[str, str] | None, solver_calls: list[int]
) -> None:
    sent = {**AUTH, "content-type": "application/json", **(headers or {})}
    got = TestClient(build(LeanRoute)).post(url, content=body, headers=sent)
    expected = TestClient(build(APIRoute)).post(url, content=body, headers=sent)
    assert got.status_code == expected.status_code
    assert got.status_code in (401, 422)
    assert got.json() == expected.json()


def test_dependency_overrides_are_honoured(solver_calls: list[int]) -> None:
    app = build(LeanRoute)

    async def fake_services() -> str:
        return "overridden"

    app.dependency_overrides[services] = fake_services
    got = TestClient(app).post(ITEM, json={"name": "a"}, headers=AUTH)
    assert got.status_code == 200 and got.json()["app"] == "overridden"
    assert solver_calls  # FastAPI's handler, which knows the overrides


def test_the_apis_routes_are_lean() -> None:
    """Every route of the API that returns a response takes the plan (a FastAPI upgrade that
    moved what the plan relies on would leave them on FastAPI's handler: this says so); the
    upload, a form, stays with FastAPI."""
    app = create_app()
    lean: set[tuple[str, str]] = set()
    plain: set[tuple[str, str]] = set()

    def walk(routes: list[object]) -> None:
        for route in routes:
            inner = getattr(route, "original_route", route)
            if isinstance(inner, APIRoute):
                for method in inner.methods or ():
                    (lean if getattr(inner, "lean", False) else plain).add((method, inner.path))
            included = getattr(route, "original_router", None)
            walk(list(getattr(included or inner, "routes", []) or []))

    walk(list(app.router.routes))
    for hot in [
        ("POST", "/v1/requests"),
        ("GET", "/v1/requests/{request_id}"),
        ("POST", "/v1/chat/completions"),
        ("POST", "/v1/completions"),
        ("POST", "/v1/batches"),
    ]:
        assert hot in lean, hot
    assert ("POST", "/v1/files") in plain


def test_the_route_benchmark_runs_both_ways() -> None:
    """``scripts/bench_routes.py`` (the page's micro-benchmark) runs, each way answering 202."""
    import asyncio
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_routes

    result = asyncio.run(bench_routes.measure(rounds=1, calls=20))
    assert set(result["median_us"]) == {"FastAPI's handler", "lean"}
    assert all(v > 0 for v in result["median_us"].values())


def test_a_request_fastapis_telemetry_traces_takes_fastapis_handler(
    solver_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where FastAPI's OpenTelemetry integration holds data of the request (it traces it), its
    handler serves, so the operations it records are all there. (Tracing needs the OpenTelemetry
    SDK, not installed: FastAPI's answer is stood in for.)"""
    import batchserve.api.lean

    app = build(LeanRoute)
    assert TestClient(app).post(ITEM, json={"name": "a"}, headers=AUTH).status_code == 200
    assert solver_calls == []
    monkeypatch.setattr(batchserve.api.lean, "get_telemetry_data", lambda: object())
    assert TestClient(app).post(ITEM, json={"name": "a"}, headers=AUTH).status_code == 200
    assert solver_calls  # FastAPI's handler
