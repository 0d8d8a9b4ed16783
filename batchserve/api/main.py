"""Builds the FastAPI app."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from batchserve.api import openapi, problems
from batchserve.api.json_guard import JsonBodyGuard
from batchserve.api.limits import BodySizeLimit
from batchserve.api.observe import RejectionCounter, RequestIdHeader
from batchserve.api.openai_errors import OPENAI_PATHS
from batchserve.api.routes import batches, files, health, models, openai, ops, requests, webhooks
from batchserve.api.services import ApiServices
from batchserve.core.settings import Settings, load_settings


def create_app(settings: Settings | None = None, services: ApiServices | None = None) -> FastAPI:
    """The API app. With ``services`` given, the caller owns their lifetime (embedded mode)."""
    settings = settings or load_settings()
    owned = services is None

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        nonlocal services
        if services is None:
            services = ApiServices.create(settings)
        app.state.services = services
        if owned:
            await services.start()
        try:
            yield
        finally:
            if owned:
                await services.stop()

    app = FastAPI(
        title="batchserve",
        version="0.1.0",
        summary="Durable, batched LLM inference",
        lifespan=lifespan,
    )
    problems.install(app)
    openapi.install(app, settings)
    app.include_router(health.router)
    app.include_router(requests.router)
    app.include_router(models.router)
    app.include_router(webhooks.router)
    app.include_router(openai.router)
    app.include_router(files.router)
    app.include_router(batches.router)
    # Uploads may be as large as a batch file may be (multipart framing on top).
    uploads = {"/v1/files": settings.max_file_bytes + 65_536}
    # Innermost first: the JSON check reads a body the size limit has already bounded.
    app.add_middleware(JsonBodyGuard, openai_paths=OPENAI_PATHS)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes, overrides=uploads)
    app.add_middleware(RejectionCounter)  # it sees the size guard's refusals too
    app.add_middleware(RequestIdHeader)  # outermost: on every answer, refusals included
    return app


def create_ops_app(app: FastAPI) -> FastAPI:
    """The operator endpoints of ``app``'s services (``/metrics``, ``/dashboard``,
    ``/dashboard/data``), for a listener of their own: they show every tenant's traffic and
    failures, so they are never on the public port."""
    ops_app = FastAPI(
        title="batchserve operations", openapi_url=None, docs_url=None, redoc_url=None
    )
    ops_app.state = app.state  # the services the API's lifespan started
    problems.install(ops_app)
    ops_app.include_router(ops.router)
    return ops_app
