"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import Response

from batchserve.api.deps import Services
from batchserve.api.problems import problem
from batchserve.api.responses import JSON

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> JSON:
    """The process is alive."""
    return JSON({"status": "ok"})


@router.get("/health")
async def health() -> JSON:
    """The process is alive: ``/healthz`` under the name OpenAI-compatible benchmark clients
    probe."""
    return await healthz()


@router.get("/readyz")
async def readyz(services: Services) -> Response:
    """Postgres, the broker and Redis are reachable."""
    checks = await services.adapters.check()
    if all(v.startswith("ok") for v in checks.values()):
        return JSON({"status": "ready", "checks": checks})
    failing = ", ".join(k for k, v in checks.items() if not v.startswith("ok"))
    return problem(
        503, "not_ready", f"unreachable: {failing}", checks=checks, headers={"Retry-After": "1"}
    )
