"""The vllm backend's arguments to vLLM, checked without vLLM (its own environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchserve.models.registry import ModelSpec
from batchserve.models.vllm_engine import engine_arguments, engine_environment


def spec(**options: object) -> ModelSpec:
    return ModelSpec(name="v", backend="vllm", options={"num_threads": 1, **options})


def test_the_model_runs_in_the_engine_core_process_by_default() -> None:
    arguments = engine_arguments(spec(), Path("/m"), 4096)
    assert arguments["distributed_executor_backend"] == "uni"
    # On a CPU vLLM replaces uni by mp unless its multiprocessing switch is off; the engine
    # core it spawns takes its threads from the environment.
    assert engine_environment(spec()) == {
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "OMP_NUM_THREADS": "1",
    }


def test_the_process_executor_is_vllms_own_choice_on_cpus() -> None:
    assert (
        engine_arguments(spec(executor="mp"), Path("/m"), 4096)["distributed_executor_backend"]
        == "mp"
    )
    assert engine_environment(spec(executor="mp")) == {}


def test_an_unknown_executor_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="executor must be one of uni, mp, not 'ray'"):
        engine_arguments(spec(executor="ray"), Path("/m"), 4096)
