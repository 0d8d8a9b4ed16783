"""docs/embeddings.md shows the run it names (``batchserve bench --scenario embeddings --json``):
each figure of its table and each ratio it states is the recorded run's."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "embeddings.md").read_text()
RUN = json.loads((ROOT / "docs" / "embeddings-bench.json").read_text())
TIMES = "\N{MULTIPLICATION SIGN}"  # as the doc writes a ratio
FIGURES = {f["name"]: f for f in RUN["figures"]}
ROWS = {
    "the encoder in-process, one text a forward pass": "model-one-a-batch",
    "the encoder in-process, 64 texts a forward pass": "model-batched",
    "the service, one `/v1/embeddings` call of one text at a time": "service-one-at-a-time",
    "the service, 64 such calls in flight": "service-concurrent",
    "the service, a Batch job of 2000 one-text lines": "service-batch-job",
}


def table() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] in ROWS:
            rows[cells[0]] = cells[1:]
    return rows


def test_the_table_is_the_run() -> None:
    rows = table()
    assert rows.keys() == ROWS.keys()
    for label, name in ROWS.items():
        figure = FIGURES[name]
        vectors, seconds, rate = rows[label]
        assert int(vectors) == figure["vectors"], label
        assert float(seconds) == round(figure["seconds"], 2), label
        assert float(rate) == figure["vectors_per_s"], label


def ratio(top: str, bottom: str) -> float:
    return FIGURES[top]["vectors_per_s"] / FIGURES[bottom]["vectors_per_s"]


def test_the_stated_ratios_are_the_runs() -> None:
    stated = {
        f"1.80{TIMES}": ratio("service-batch-job", "service-one-at-a-time"),
        f"1.35{TIMES}": ratio("service-concurrent", "service-one-at-a-time"),
        f"0.88{TIMES}": ratio("model-batched", "model-one-a-batch"),
        "0.99 of": ratio("service-batch-job", "model-batched"),
    }
    for text, value in stated.items():
        number = float(re.sub(r"[^\d.]", "", text))
        assert text in DOC, text
        assert abs(value - number) < 0.005, (text, value)
    # What the bullets claim, not just their numbers.
    assert ratio("service-batch-job", "service-one-at-a-time") > 1
    assert ratio("service-concurrent", "service-one-at-a-time") > 1
    assert ratio("model-batched", "model-one-a-batch") < 1
    assert (
        FIGURES["service-concurrent"]["vectors_per_s"]
        < FIGURES["service-batch-job"]["vectors_per_s"]
    )
    assert RUN["micro_batch"] == 64 and RUN["threads"] == 1
