"""The model registry: each model's backend, batching limits and options, from a TOML file."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

POLICIES = ("timer", "greedy", "size-only", "adaptive")


@dataclass(frozen=True)
class ModelSpec:
    """One servable model. Requests for different models never share a batch."""

    name: str
    backend: str
    max_batch_size: int = 32
    # The timer policy's delay (default 10 ms); for the adaptive policy a ceiling (default:
    # one batch time, so the policy decides).
    max_batch_delay_ms: float | None = None
    max_batch_tokens: int | None = None
    context_length: int = 8192
    max_new_tokens: int = 4096
    policy: str = "adaptive"
    batch_time_ms: float = 100.0
    slots: int = 1
    # Past this a running batch counts as stalled and its worker process is killed
    # (default: ten times the estimate, at least the estimate plus 10 s).
    time_limit_s: float | None = None
    # Batch only requests whose max_tokens fall in the same class (edges, in tokens); for
    # models whose batch time follows the longest generation.
    length_edges: tuple[int, ...] = ()
    description: str = ""
    options: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "length_edges", tuple(sorted(int(e) for e in self.length_edges)))
        from batchserve.models.plugins import backends

        if self.backend not in backends():
            known = ", ".join(sorted(backends()))
            raise ValueError(f"model {self.name}: unknown backend {self.backend!r}; known: {known}")
        if self.policy not in POLICIES:
            raise ValueError(f"model {self.name}: unknown policy {self.policy!r}")
        if self.max_batch_size < 1:
            raise ValueError(f"model {self.name}: max_batch_size must be at least 1")
        if self.max_batch_delay_ms is not None and self.max_batch_delay_ms < 0:
            raise ValueError(f"model {self.name}: max_batch_delay_ms must be >= 0")

    @property
    def batch_delay_ms(self) -> float:
        """The delay the policy works with: the timer's wait, or the adaptive ceiling."""
        if self.max_batch_delay_ms is not None:
            return self.max_batch_delay_ms
        return 10.0 if self.policy == "timer" else float("inf")


_KNOWN = {f for f in ModelSpec.__dataclass_fields__ if f not in ("name", "options")}


class Registry:
    def __init__(self, specs: dict[str, ModelSpec]) -> None:
        self._specs = dict(specs)

    def get(self, name: str) -> ModelSpec | None:
        return self._specs.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def names(self) -> list[str]:
        return sorted(self._specs)

    def specs(self) -> list[ModelSpec]:
        return [self._specs[n] for n in self.names()]


def parse_registry(text: str) -> Registry:
    data = tomllib.loads(text)
    specs: dict[str, ModelSpec] = {}
    for name, entry in data.get("models", {}).items():
        known = {k: v for k, v in entry.items() if k in _KNOWN}
        options = {k: v for k, v in entry.items() if k not in _KNOWN}
        options.update(entry.get("options", {}))
        options.pop("options", None)
        specs[name] = ModelSpec(name=name, options=options, **known)
    return Registry(specs)


def load_registry(path: Path | None) -> Registry:
    """The registry at ``path``, or the built-in one (``echo-100ms``, ``smollm2-135m``)."""
    if path is None:
        text = resources.files("batchserve.models").joinpath("builtin.toml").read_text()
    else:
        text = Path(path).read_text()
    return parse_registry(text)
