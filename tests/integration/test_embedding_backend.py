"""The sentence-embedding backend on the real all-MiniLM-L6-v2 files: sentence-transformers'
vectors to 1e-5 whatever the batch's texts and chunks, a text too long failing only its own
request, and the API's token counts equal to the encoder's."""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pytest

from batchserve.core.domain import BatchItem, ErrorCode
from batchserve.models.embedding import EmbeddingBackend, layout_of, model_dir
from batchserve.models.registry import load_registry
from batchserve.models.tokenizer_files import FileTokenizer

TEXTS = [
    "Hello",
    "A dragon guards a library full of ancient books, and it reads every one of them at night.",
    "Ünïcödé, 漢字, emoji 🚀 and a tab\there",
    "short",
    "def f(x):\n    return x ** 2  # code",
    "Batching amortises the fixed cost of a forward pass over many inputs " * 3,
]


@pytest.fixture(scope="module")
def backend() -> Iterator[EmbeddingBackend]:
    spec = load_registry(None).get("all-minilm-l6-v2")
    assert spec is not None
    # Chunks of three sequences: a batch's texts run in several passes, padded differently.
    small = dataclasses.replace(spec, options={**spec.options, "micro_batch": 3})
    loaded = EmbeddingBackend(small)
    yield loaded
    loaded.close()


@pytest.fixture(scope="module")
def reference() -> Any:
    from sentence_transformers import SentenceTransformer

    spec = load_registry(None).get("all-minilm-l6-v2")
    assert spec is not None
    return SentenceTransformer(str(model_dir(spec)), device="cpu")


def item(request_id: str, texts: list[str], encoding: str = "float") -> BatchItem:
    params = {"input": texts, "encoding_format": encoding}
    return BatchItem(request_id, None, None, params, created_at=0.0, received_at=0.0)


def floats(output: str | None) -> np.ndarray:
    data = orjson.loads(output or "[]")
    assert [d["index"] for d in data] == list(range(len(data)))
    assert {d["object"] for d in data} == {"embedding"}
    return np.array([d["embedding"] for d in data], dtype=np.float32)


def test_the_layout_is_read_from_the_package() -> None:
    spec = load_registry(None).get("all-minilm-l6-v2")
    assert spec is not None
    layout = layout_of(spec)
    assert (layout.dimensions, layout.pooling, layout.normalize) == (384, "mean", True)
    assert layout.max_seq_length == 256 == spec.context_length
    assert spec.options["dimensions"] == layout.dimensions


def test_vectors_equal_sentence_transformers_across_requests_and_chunks(
    backend: EmbeddingBackend, reference: Any
) -> None:
    items = [item("a", TEXTS[:4]), item("b", TEXTS[4:], "base64"), item("c", TEXTS[1:2])]
    results = backend.run(items)
    assert [r.request_id for r in results] == ["a", "b", "c"]
    expected = reference.encode(TEXTS)
    assert np.abs(floats(results[0].output) - expected[:4]).max() < 1e-5
    encoded = orjson.loads(results[1].output or "")
    decoded = np.array([np.frombuffer(base64.b64decode(d["embedding"]), "<f4") for d in encoded])
    assert np.abs(decoded - expected[4:]).max() < 1e-5
    assert np.abs(floats(results[2].output) - expected[1:2]).max() < 1e-5
    norms = np.linalg.norm(floats(results[0].output), axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5)
    counts = [len(ids) for ids in reference.tokenizer(TEXTS).input_ids]
    assert [r.prompt_tokens for r in results] == [sum(counts[:4]), sum(counts[4:]), counts[1]]
    assert all(r.completion_tokens == 0 and r.error_code is None for r in results)


def test_a_text_too_long_fails_its_own_request_only(backend: EmbeddingBackend) -> None:
    results = backend.run([item("ok", ["fine"]), item("long", ["fine", "word " * 300])])
    assert results[0].error_code is None and floats(results[0].output).shape == (1, 384)
    assert results[1].error_code == ErrorCode.CONTEXT_LENGTH_EXCEEDED.value
    assert results[1].output is None and "302 tokens" in (results[1].error_message or "")


def test_the_apis_counts_are_the_encoders(backend: EmbeddingBackend) -> None:
    spec = load_registry(None).get("all-minilm-l6-v2")
    assert spec is not None
    light = FileTokenizer(model_dir(spec))
    texts = [*TEXTS, "word " * 300]  # past the 128 tokens the package's tokenizer.json cuts at
    full = [len(ids) for ids in backend.tokenizer(texts).input_ids]
    assert light.count_texts(texts) == full
    assert full[-1] == 302
