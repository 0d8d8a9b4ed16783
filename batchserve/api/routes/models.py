"""``GET /v1/models``: the models served here, with their batching limits and live estimate."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from batchserve.api.deps import Services, get_caller
from batchserve.api.lean import LeanRoute
from batchserve.api.responses import JSON
from batchserve.api.schemas import ModelList, ModelOut, dump
from batchserve.api.submission import resolve_model
from batchserve.core.loadboard import LoadBoard, LoadSnapshot
from batchserve.models.embedding import dimensions_of
from batchserve.models.plugins import is_embedding, plugin_for
from batchserve.models.registry import ModelSpec

router = APIRouter(
    prefix="/v1/models", tags=["models"], route_class=LeanRoute, dependencies=[Depends(get_caller)]
)


def _model_out(spec: ModelSpec, snapshot: LoadSnapshot | None) -> ModelOut:
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
        kind=plugin_for(spec).kind,
        capabilities=["embeddings"] if is_embedding(spec) else ["chat", "completions"],
        dimensions=dimensions_of(spec) if is_embedding(spec) else None,
        estimate=snapshot.estimate or None if snapshot is not None else None,
        capacity=None if snapshot is None else _capacity(snapshot),
    )


def _capacity(snapshot: LoadSnapshot) -> dict[str, int]:
    if snapshot.kind == "engine":
        return {
            "seqs": snapshot.slots,
            "free_seqs": snapshot.free_seqs,
            "tokens": snapshot.capacity_tokens,
            "free_tokens": snapshot.free_tokens,
        }
    return {"slots": snapshot.slots}


async def _out(spec: ModelSpec, board: LoadBoard, now: float) -> ModelOut:
    return _model_out(spec, await board.fresh(spec.name, now))


@router.get("", response_model=ModelList)
async def list_models(services: Services) -> JSON:
    board = services.adapters.loadboard
    specs = services.adapters.registry.specs()
    return JSON(dump(ModelList(data=[await _out(s, board, services.clock()) for s in specs])))


@router.get("/{model_id}", response_model=ModelOut)
async def get_model(model_id: str, services: Services) -> JSON:
    spec = resolve_model(services.adapters.registry, model_id)
    return JSON(dump(await _out(spec, services.adapters.loadboard, services.clock())))
