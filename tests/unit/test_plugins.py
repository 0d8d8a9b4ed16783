"""Backend plugins: what a process can serve is decided from the plugin alone, before any load."""

from __future__ import annotations

import pytest

from batchserve.models import plugins
from batchserve.models.plugins import BackendPlugin, servable
from batchserve.models.registry import ModelSpec


def spec(name: str, backend: str) -> ModelSpec:
    return ModelSpec(name=name, backend=backend, max_batch_size=4)


def test_a_backend_whose_module_is_absent_says_which_and_the_extra_that_installs_it() -> None:
    absent = BackendPlugin(
        "absent", "engine", "nowhere:Engine", requires=("json", "no_such_module_x"), extra="absent"
    )
    assert absent.missing() == (
        "the absent backend needs no_such_module_x: pip install 'batchserve[absent]'"
    )
    assert BackendPlugin("present", "batch", "json:loads", requires=("json",)).missing() is None


def test_servable_keeps_what_loads_here_and_names_why_the_rest_cannot(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    absent = BackendPlugin("absent", "engine", "nowhere:Engine", requires=("no_such_module_x",))
    monkeypatch.setattr(plugins, "backends", lambda: {"fixed": plugins.FIXED, "absent": absent})
    served, refused = servable([spec("a", "fixed"), spec("b", "absent"), spec("c", "fixed")])
    assert [s.name for s in served] == ["a", "c"]
    assert refused == {"b": "the absent backend needs no_such_module_x"}


def test_an_unknown_backend_names_the_installed_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown backend 'nope'; installed: .*fixed"):
        plugins.backend("nope")


def test_the_engines_honour_every_extended_field_the_api_takes() -> None:
    """The API's list of extended generation fields and the engines' (plugins cannot import
    the API) name the same fields: one added to the API alone would be refused on every model."""
    from batchserve.api.schemas import EXTENDED_DEFAULTS
    from batchserve.models.plugins import ENGINE_SAMPLING, TRANSFORMERS, VLLM

    assert set(EXTENDED_DEFAULTS) == ENGINE_SAMPLING
    assert TRANSFORMERS.sampling == VLLM.sampling == ENGINE_SAMPLING
