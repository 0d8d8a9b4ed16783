"""Dependency aliases for routes."""

from __future__ import annotations

import hashlib
from typing import Annotated

from fastapi import Depends, Request

from api.services import ApiServices


async def get_services(request: Request) -> ApiServices:
    services: ApiServices = request.app.state.services
    return services


async def get_tenant(request: Request) -> str:
    """The caller's identity. Until API keys and tenants exist, a bearer token names the caller
    (only its hash is kept) and everyone else is ``anonymous``.

    Dependencies are ``async`` so FastAPI calls them on the event loop, not in a thread.
    """
    auth = request.headers.get("authorization", "")
    scheme, _, token = auth.partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "key:" + hashlib.sha256(token.strip().encode()).hexdigest()[:24]
    return "anonymous"


Services = Annotated[ApiServices, Depends(get_services)]
Tenant = Annotated[str, Depends(get_tenant)]
