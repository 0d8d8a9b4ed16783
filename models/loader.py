"""Build the backend a model spec names."""

from __future__ import annotations

from models.base import Backend
from models.registry import ModelSpec


def load_backend(spec: ModelSpec) -> Backend:
    if spec.backend == "fixed":
        from models.fixed import FixedBackend

        return FixedBackend(spec)
    if spec.backend == "faulty":
        from models.faulty import FaultyBackend

        return FaultyBackend(spec)
    if spec.backend == "transformers":
        from models.transformers_backend import TransformersBackend

        return TransformersBackend(spec)
    raise ValueError(f"unknown backend {spec.backend!r}")
