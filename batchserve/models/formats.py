"""OpenAI's ``response_format`` as a grammar: what a constrained decoder lets a model say.

The transformers engine decodes under an llguidance matcher of this grammar; the API builds the
same grammar at admission, so a schema llguidance cannot take is refused there, by name. vLLM
takes the format itself (its structured outputs). No torch here: the API imports this.
"""

from __future__ import annotations

from typing import Any


def grammar_of(response_format: dict[str, Any] | None) -> str | None:
    """The llguidance grammar a ``response_format`` asks for (``None`` for plain text):
    ``json_object`` is any JSON object, ``json_schema`` JSON that its schema admits."""
    if not response_format or response_format.get("type") in (None, "text"):
        return None
    from llguidance import LLMatcher

    if response_format["type"] == "json_object":
        return str(LLMatcher.grammar_from_json_schema({"type": "object"}))
    schema = (response_format.get("json_schema") or {}).get("schema") or {}
    return str(LLMatcher.grammar_from_json_schema(schema))
