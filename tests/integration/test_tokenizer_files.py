"""The API's token counts come from the tokenizer files alone and equal the workers' tokenizer."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from batchserve.models.hf import encode_prompt, ensure_converted, load_tokenizer
from batchserve.models.registry import load_registry
from batchserve.models.tokenizer_files import FileTokenizer, file_tokenizer

PROMPTS = [
    "Hello",
    "",
    "  leading spaces, trailing newline\n",
    "Ünïcödé, 漢字, emoji 🚀 and a tab\there",
    "def f(x):\n    return x ** 2  # code",
]
CHATS = [
    [{"role": "user", "content": "What is 2 + 2?"}],
    [
        {"role": "system", "content": "You answer in one word."},
        {"role": "user", "content": "The colour of the sky?"},
        {"role": "assistant", "content": "Blue."},
        {"role": "user", "content": "And of grass, über-green?"},
    ],
    [{"role": "user", "content": ""}],
]


def test_file_tokenizer_counts_what_the_worker_counts() -> None:
    spec = load_registry(None).get("smollm2-135m")
    assert spec is not None
    directory = ensure_converted(spec)
    light, full = FileTokenizer(directory), load_tokenizer(spec)
    for text in PROMPTS:
        assert light.encode_prompt(text, None) == encode_prompt(full, text, None), text
    for messages in CHATS:
        assert light.encode_prompt(None, messages) == encode_prompt(full, None, messages)


def test_the_file_tokenizer_loads_neither_torch_nor_transformers() -> None:
    spec = load_registry(None).get("smollm2-135m")
    assert spec is not None
    directory = ensure_converted(spec)
    probe = (
        "import sys; from pathlib import Path\n"
        "from batchserve.models.tokens import PromptCounter\n"
        "from batchserve.models.tokenizer_files import FileTokenizer\n"
        f"ids = FileTokenizer(Path({str(directory)!r})).encode_prompt('hi', None)\n"
        "assert ids, ids\n"
        "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_a_model_directory_is_read_once_per_process_until_its_files_change(
    tmp_path: Path,
) -> None:
    spec = load_registry(None).get("smollm2-135m")
    assert spec is not None
    copy = tmp_path / "model"
    copy.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(ensure_converted(spec) / name, copy / name)

    first = file_tokenizer(copy)
    assert file_tokenizer(copy) is first  # the registry's entries for one model share it
    assert file_tokenizer(tmp_path / "." / "model") is first

    tokenizer_file = copy / "tokenizer.json"
    later = tokenizer_file.stat().st_mtime_ns + 1_000_000_000
    os.utime(tokenizer_file, ns=(later, later))  # a model converted again in place
    again = file_tokenizer(copy)
    assert again is not first
    assert again.encode_prompt("Hello", None) == first.encode_prompt("Hello", None)
