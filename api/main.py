"""Builds the FastAPI app."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from fastapi import FastAPI

from api import problems
from api.limits import BodySizeLimit
from api.routes import health, models, requests, webhooks
from api.services import ApiServices
from core.settings import Settings, load_settings


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
    app.include_router(health.router)
    app.include_router(requests.router)
    app.include_router(models.router)
    app.include_router(webhooks.router)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    return app
