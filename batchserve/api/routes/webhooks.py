"""Webhooks: a request's deliveries and redelivery, the signing secret, endpoint re-enable."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Path

from batchserve.api.deps import Services, Tenant, get_caller
from batchserve.api.lean import LeanRoute
from batchserve.api.responses import JSON
from batchserve.api.schemas import (
    DeliveryList,
    DeliveryOut,
    EnableEndpoint,
    EndpointOut,
    WebhookSecretOut,
    dump,
)
from batchserve.core.errors import NotFound
from batchserve.core.webhook_secrets import NewSecret, SecretInfo

router = APIRouter(tags=["webhooks"], route_class=LeanRoute, dependencies=[Depends(get_caller)])

DeliveryId = Annotated[str, Path(min_length=1, max_length=40)]


@router.get("/v1/requests/{request_id}/deliveries", response_model=DeliveryList)
async def list_deliveries(request_id: uuid.UUID, services: Services, tenant: Tenant) -> JSON:
    """The webhook deliveries of a request, each with its attempts."""
    store = services.adapters.store
    if await store.get(request_id, tenant) is None:
        raise NotFound(f"no request {request_id}")
    deliveries = await store.list_deliveries(request_id, tenant)
    return JSON(dump(DeliveryList(data=[DeliveryOut.of(d) for d in deliveries])))


@router.post(
    "/v1/requests/{request_id}/deliveries/{delivery_id}/redeliver",
    status_code=202,
    response_model=DeliveryOut,
)
async def redeliver(
    request_id: uuid.UUID, delivery_id: DeliveryId, services: Services, tenant: Tenant
) -> JSON:
    """Send a delivery again now, with the same ``webhook-id`` and a fresh retry schedule."""
    delivery = await services.adapters.store.redeliver(
        request_id, delivery_id, tenant, now=services.clock()
    )
    return JSON(dump(DeliveryOut.of(delivery)), status_code=202)


@router.get("/v1/webhooks/secret", response_model=WebhookSecretOut)
async def get_secret(services: Services, tenant: Tenant) -> JSON:
    """When the signing secret was made, and until when the previous one still signs."""
    info = await services.webhook_secrets.info(tenant)
    if info is None:
        raise NotFound("no webhook secret yet; POST /v1/webhooks/secret creates one")
    return JSON(dump(_secret_out(info)))


@router.post("/v1/webhooks/secret", status_code=201, response_model=WebhookSecretOut)
async def create_secret(services: Services, tenant: Tenant) -> JSON:
    """Create the signing secret and show it, once; 409 if one exists (rotate it instead)."""
    made = await services.webhook_secrets.create(tenant, services.clock())
    return JSON(dump(_new_secret_out(made)), status_code=201)


@router.post("/v1/webhooks/secret/rotate", response_model=WebhookSecretOut)
async def rotate_secret(services: Services, tenant: Tenant) -> JSON:
    """Replace the signing secret and show the new one, once; the old one keeps signing too
    until ``previous_expires_at``."""
    made = await services.webhook_secrets.rotate(tenant, services.clock())
    return JSON(dump(_new_secret_out(made)))


@router.post("/v1/webhooks/endpoints/enable", response_model=EndpointOut)
async def enable_endpoint(body: EnableEndpoint, services: Services, tenant: Tenant) -> JSON:
    """Send to a URL again after it answered 410 Gone (deliveries that failed meanwhile can be
    redelivered). The URL passes the same checks as a request's ``webhook_url``: an endpoint
    that could never be sent to is not one to enable."""
    await services.url_guard.check_submission(body.url, field="url")
    was_disabled = await services.adapters.store.enable_endpoint(tenant, body.url)
    return JSON(dump(EndpointOut(url=body.url, enabled=True, was_disabled=was_disabled)))


def _secret_out(info: SecretInfo) -> WebhookSecretOut:
    return WebhookSecretOut(
        created_at=info.created_at, previous_expires_at=info.previous_expires_at
    )


def _new_secret_out(made: NewSecret) -> WebhookSecretOut:
    out = _secret_out(made.info)
    out.secret = made.secret
    return out
