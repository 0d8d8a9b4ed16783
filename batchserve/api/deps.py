"""Dependency aliases for routes."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Header, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from batchserve.api.services import ApiServices
from batchserve.core.store import TenantRow


async def get_services(request: Request) -> ApiServices:
    services: ApiServices = request.app.state.services
    return services


# Declares the scheme in the OpenAPI document; the key ring decides (and words the 401).
bearer = HTTPBearer(auto_error=False, description="An API key: `batchserve keys create`")


async def get_caller(
    request: Request,
    _credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> TenantRow:
    """The caller's tenant, from its API key (401 problem+json without a valid one).

    Dependencies are ``async`` so FastAPI calls them on the event loop, not in a thread.
    """
    services: ApiServices = request.app.state.services
    caller = await services.keyring.authenticate(request.headers.get("authorization"))
    request.state.tenant = caller.name  # for logs
    return caller


async def get_tenant(caller: Annotated[TenantRow, Depends(get_caller)]) -> str:
    return caller.name


Services = Annotated[ApiServices, Depends(get_services)]
Caller = Annotated[TenantRow, Depends(get_caller)]
Tenant = Annotated[str, Depends(get_tenant)]
# The same semantics on every route that creates a request: a retry with the key gets the
# original request (its answer, on the synchronous routes), never a second run.
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias="Idempotency-Key",
        # What check_idempotency_key takes (printable; ASCII, as a header carries it).
        json_schema_extra={"pattern": "^[ -~]{1,255}$"},
    ),
]
