"""Backends are plugins: each registers under the entry-point group ``batchserve.backends``.

A plugin declares what the rest of batchserve needs to know about its backend without loading
it: its kind (``batch``: a batch runs as a unit, the seeds' model; ``engine``: one long-lived
engine holds many sequences and new ones join at a step boundary), whether it holds weights
(a standby process per slot then costs a second copy of the model), the work to do once
before workers start (converting weights), and where its tokenizer files are (the API counts
prompt tokens with them). Loading is lazy: importing this module imports no torch.

A third-party backend ships a :class:`BackendPlugin` and names it in its own package metadata::

    [project.entry-points."batchserve.backends"]
    mybackend = "mypackage.batchserve_plugin:PLUGIN"
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from importlib.metadata import entry_points
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from batchserve.core.logs import get_logger

if TYPE_CHECKING:
    from batchserve.models.base import Backend
    from batchserve.models.engine import Engine
    from batchserve.models.registry import ModelSpec

log = get_logger("batchserve.plugins")

GROUP = "batchserve.backends"
Kind = Literal["batch", "engine"]
# What a backend's models do: generate text (chat, completions) or embed it (embeddings).
Task = Literal["generate", "embed"]


@dataclass(frozen=True)
class BackendPlugin:
    """What batchserve knows of a backend before loading it. ``loader`` is ``module:callable``
    taking a :class:`ModelSpec`, imported only when a worker loads the model."""

    name: str
    kind: Kind
    loader: str
    holds_weights: bool = False
    prepare: Callable[[ModelSpec], object] | None = None
    tokenizer_dir: Callable[[ModelSpec], Path | None] | None = None
    # The modules the backend imports, and the extra that installs them: the base install
    # (API and control plane) has none of torch, transformers or vLLM.
    requires: tuple[str, ...] = ()
    extra: str | None = None
    task: Task = "generate"
    # The generation fields past max_tokens, temperature, top_p, stop, seed and ignore_eos that
    # the backend honours; a request that sets another is refused, naming it.
    sampling: frozenset[str] = frozenset()

    def missing(self) -> str | None:
        """Why this backend cannot load here (a module it needs is not installed), else None."""
        for module in self.requires:
            if find_spec(module) is None:
                install = f": pip install 'batchserve[{self.extra}]'" if self.extra else ""
                return f"the {self.name} backend needs {module}{install}"
        return None

    def load(self, spec: ModelSpec) -> Backend | Engine:
        module, _, attribute = self.loader.partition(":")
        factory = getattr(import_module(module), attribute)
        loaded: Backend | Engine = factory(spec)
        return loaded


def _prepare_hf(spec: ModelSpec) -> object:
    from batchserve.models.hf import ensure_converted

    return ensure_converted(spec)


def _tokenizer_dir_hf(spec: ModelSpec) -> Path | None:
    from batchserve.models.hf import tokenizer_dir

    return tokenizer_dir(spec)


def _prepare_embedding(spec: ModelSpec) -> object:
    from batchserve.models.embedding import model_dir

    return model_dir(spec)


def _tokenizer_dir_embedding(spec: ModelSpec) -> Path | None:
    from batchserve.models.embedding import tokenizer_dir

    return tokenizer_dir(spec)


# What both engines honour (the transformers engine itself; vLLM by its SamplingParams).
ENGINE_SAMPLING = frozenset(
    {
        "top_k",
        "min_p",
        "presence_penalty",
        "frequency_penalty",
        "repetition_penalty",
        "logit_bias",
        "min_tokens",
        "response_format",
    }
)

FIXED = BackendPlugin("fixed", "batch", "batchserve.models.fixed:FixedBackend")
FAULTY = BackendPlugin("faulty", "batch", "batchserve.models.faulty:FaultyBackend")
TRANSFORMERS = BackendPlugin(
    "transformers",
    "engine",
    "batchserve.models.transformers_engine:TransformersEngine",
    holds_weights=True,
    prepare=_prepare_hf,
    tokenizer_dir=_tokenizer_dir_hf,
    requires=("torch", "transformers"),
    extra="transformers",
    sampling=ENGINE_SAMPLING,
)
VLLM = BackendPlugin(
    "vllm",
    "engine",
    "batchserve.models.vllm_engine:VllmEngine",
    holds_weights=True,
    prepare=_prepare_hf,
    tokenizer_dir=_tokenizer_dir_hf,
    requires=("vllm",),
    extra="vllm",
    sampling=ENGINE_SAMPLING,
)
SENTENCE_EMBEDDING = BackendPlugin(
    "sentence-embedding",
    "batch",
    "batchserve.models.embedding:EmbeddingBackend",
    holds_weights=True,
    prepare=_prepare_embedding,
    tokenizer_dir=_tokenizer_dir_embedding,
    requires=("torch", "transformers"),
    extra="transformers",
    task="embed",
)
# What an uninstalled source tree (no package metadata) still knows.
_BUILT_IN = {p.name: p for p in (FIXED, FAULTY, TRANSFORMERS, VLLM, SENTENCE_EMBEDDING)}


@functools.cache
def backends() -> dict[str, BackendPlugin]:
    """Every installed backend by name: the entry points, over the built-in ones."""
    found = dict(_BUILT_IN)
    for point in entry_points(group=GROUP):
        try:
            plugin = point.load()
        except Exception:  # a broken third-party plugin must not take the others down
            log.exception("backend_plugin_unloadable", name=point.name)
            continue
        if not isinstance(plugin, BackendPlugin):
            log.error("backend_plugin_invalid", name=point.name, value=repr(plugin))
            continue
        found[point.name] = plugin
    return found


def plugin_for(spec: ModelSpec) -> BackendPlugin:
    return backend(spec.backend)


def backend(name: str) -> BackendPlugin:
    known = backends()
    if name not in known:
        raise ValueError(f"unknown backend {name!r}; installed: {', '.join(sorted(known))}")
    return known[name]


def servable(specs: Iterable[ModelSpec]) -> tuple[list[ModelSpec], dict[str, str]]:
    """The specs whose backend loads here, and why each of the others cannot (by name)."""
    served: list[ModelSpec] = []
    refused: dict[str, str] = {}
    for spec in specs:
        reason = plugin_for(spec).missing()
        if reason is None:
            served.append(spec)
        else:
            refused[spec.name] = reason
    return served, refused


def is_engine(spec: ModelSpec) -> bool:
    return plugin_for(spec).kind == "engine"


def is_embedding(spec: ModelSpec) -> bool:
    """Whether the model embeds text (``/v1/embeddings``) rather than generating it."""
    return plugin_for(spec).task == "embed"
