"""What every model backend provides: run a batch, count tokens."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

from batchserve.core.domain import BatchItem, ItemResult


def prompt_text(input_text: str | None, messages: list[dict[str, Any]] | None) -> str:
    """The text a model without a chat template answers: the input, or the last user message."""
    if input_text is not None:
        return input_text
    for message in reversed(messages or []):
        if message.get("role") == "user":
            return str(message.get("content") or "")
    return str((messages or [{}])[-1].get("content") or "")


# Called (from the thread running the model) with a member's result as soon as it is final,
# before the rest of its batch is done.
OnResult = Callable[[ItemResult], None]


class Backend(ABC):
    """A loaded model. ``run`` blocks; it may raise, which fails the batch as a whole."""

    # Asked between decode steps with a request id: True stops generating for it (cancelled).
    should_stop: Callable[[str], bool] | None = None

    @abstractmethod
    def run(
        self, items: Sequence[BatchItem], on_result: OnResult | None = None
    ) -> list[ItemResult]:
        """One result per item, in order. A backend that finishes some members early may hand
        their results to ``on_result`` first; they are returned in the list as well."""

    def count_tokens(self, input_text: str | None, messages: list[dict[str, Any]] | None) -> int:
        return max(1, len(prompt_text(input_text, messages).split()))

    def close(self) -> None:
        return None
