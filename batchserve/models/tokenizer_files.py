"""A model's tokenizer from its files alone, for the API's token counts: no torch, no transformers.

A converted model directory (``batchserve/models/hf.py``) holds ``tokenizer.json`` (the fast
tokenizer, which the ``tokenizers`` package reads directly) and the chat template (in
``tokenizer_config.json`` or ``chat_template.jinja``). Rendering the template the way transformers
does (a sandboxed jinja2 environment with ``trim_blocks`` and ``lstrip_blocks``) and encoding the
result without adding special tokens gives the very ids the workers' tokenizer gives; a test holds
the two equal on the served models.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


def _raise(message: str) -> None:
    raise TemplateError(message)


def _special(value: Any) -> str:
    # Special tokens are saved as strings or as {"content": ...} objects.
    if isinstance(value, dict):
        return str(value.get("content") or "")
    return str(value or "")


class FileTokenizer:
    def __init__(self, directory: Path) -> None:
        self._tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        # Counts are of the whole text: a tokenizer.json may carry truncation and padding
        # settings (sentence-transformers' do: 128 tokens), which would hide a text too long.
        self._tokenizer.no_truncation()
        self._tokenizer.no_padding()
        config_path = directory / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        template = config.get("chat_template")
        template_path = directory / "chat_template.jinja"
        if template is None and template_path.exists():
            template = template_path.read_text()
        if isinstance(template, list):  # named templates: the default one
            template = next((t["template"] for t in template if t.get("name") == "default"), None)
        self._specials = {
            name: _special(config.get(name)) for name in ("bos_token", "eos_token", "pad_token")
        }
        self._template = None
        if template:
            env = ImmutableSandboxedEnvironment(
                trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]
            )
            env.filters["tojson"] = lambda value, indent=None, **_: json.dumps(
                value, indent=indent, ensure_ascii=False
            )
            env.globals["raise_exception"] = _raise
            self._template = env.from_string(template)

    def encode_prompt(
        self, input_text: str | None, messages: list[dict[str, Any]] | None
    ) -> list[int]:
        """The prompt's token ids: chat messages through the chat template, else the plain text
        (with the special tokens the tokenizer adds to a text of its own)."""
        if messages is not None:
            if self._template is None:
                raise ValueError("this model's tokenizer has no chat template")
            text = self._template.render(
                messages=messages, add_generation_prompt=True, **self._specials
            )
            return list(self._tokenizer.encode(text, add_special_tokens=False).ids)
        return list(self._tokenizer.encode(input_text or "", add_special_tokens=True).ids)

    def count_texts(self, texts: list[str]) -> list[int]:
        """Each text's token count, with the special tokens the model's encoder adds (the
        texts of an embedding request: an encoder sees each one alone)."""
        encoded = self._tokenizer.encode_batch(texts, add_special_tokens=True)
        return [len(e.ids) for e in encoded]


def file_tokenizer(directory: Path) -> FileTokenizer:
    """The tokenizer of a converted model directory, read once per process while its files
    stay the same: the registry's entries for one model in several configurations share it,
    and so do the apps a process starts one after another."""
    tokenizer_file = directory / "tokenizer.json"
    return _cached(directory.resolve(), tokenizer_file.stat().st_mtime_ns)


@functools.lru_cache(maxsize=16)
def _cached(directory: Path, _version: int) -> FileTokenizer:
    return FileTokenizer(directory)
