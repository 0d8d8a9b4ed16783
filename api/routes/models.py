"""``GET /v1/models``: the models served here, with their batching limits."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from api.deps import Services, get_caller
from api.responses import JSON
from api.schemas import ModelList, ModelOut, dump
from api.submission import resolve_model
from models.registry import ModelSpec

router = APIRouter(prefix="/v1/models", tags=["models"], dependencies=[Depends(get_caller)])


def _model_out(spec: ModelSpec) -> ModelOut:
    return ModelOut(
        id=spec.name,
        backend=spec.backend,
        max_batch_size=spec.max_batch_size,
        max_batch_delay_ms=spec.max_batch_delay_ms,
        max_batch_tokens=spec.max_batch_tokens,
        context_length=spec.context_length,
        max_new_tokens=spec.max_new_tokens,
        policy=spec.policy,
        description=spec.description,
    )


@router.get("", response_model=ModelList)
async def list_models(services: Services) -> JSON:
    specs = services.adapters.registry.specs()
    return JSON(dump(ModelList(data=[_model_out(s) for s in specs])))


@router.get("/{model_id}", response_model=ModelOut)
async def get_model(model_id: str, services: Services) -> JSON:
    return JSON(dump(_model_out(resolve_model(services.adapters.registry, model_id))))
