"""Build the backend a model spec names, through its plugin."""

from __future__ import annotations

from batchserve.models.base import Backend
from batchserve.models.engine import Engine
from batchserve.models.plugins import plugin_for
from batchserve.models.registry import ModelSpec


def load_backend(spec: ModelSpec) -> Backend:
    """A batch backend (the model runs a batch as a unit)."""
    loaded = plugin_for(spec).load(spec)
    if not isinstance(loaded, Backend):
        raise TypeError(f"model {spec.name}: backend {spec.backend!r} is not a batch backend")
    return loaded


def load_engine(spec: ModelSpec) -> Engine:
    """An engine backend (many sequences at once, joining at step boundaries)."""
    loaded = plugin_for(spec).load(spec)
    if not isinstance(loaded, Engine):
        raise TypeError(f"model {spec.name}: backend {spec.backend!r} is not an engine")
    return loaded
