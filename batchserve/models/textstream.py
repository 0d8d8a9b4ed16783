"""A sequence's text as its tokens arrive: incremental decoding and stop strings. No torch.

Decoding the whole sequence again at every step costs O(length) a token (O(length²) a
sequence); the tokenizer's incremental decoder (``tokenizers.decoders.DecodeStream``) turns each
new token into its new text in constant time. Stop strings are searched only in the text that
could hold a new match: the fresh piece and the few characters before it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Decodes one more token; None while the token is part of a character still incomplete.
StepFn = Callable[[int], str | None]


class TextStream:
    """The text of one sequence, its stop strings and what has been handed out so far.

    Text is handed out (:meth:`take`) only once it can no longer turn out to be the start of a
    stop string, so a caller that shows it as it comes never shows a stop string, nor a piece
    of one that is later cut off.
    """

    def __init__(self, step: StepFn, stop: Sequence[str] = ()) -> None:
        self._step = step
        self._stop = tuple(s for s in stop if s)
        self._longest = max((len(s) for s in self._stop), default=0)
        self.text = ""
        self._given = 0  # characters of ``text`` handed out
        self.stopped = False  # a stop string was found; ``text`` ends before it

    def push(self, token_id: int) -> None:
        if self.stopped:
            return
        piece = self._step(token_id)
        if not piece:
            return
        before = len(self.text)
        self.text += piece
        if self._stop:
            # A match ending in the new piece starts at most longest-1 characters before it.
            start = max(0, before - self._longest + 1)
            found = [i for i in (self.text.find(s, start) for s in self._stop) if i >= 0]
            if found:
                self.text = self.text[: min(found)]
                self.stopped = True

    def take(self) -> str:
        """The text new since the last call that is safe to show."""
        if self.stopped or not self._stop:
            safe = len(self.text)
        else:
            safe = max(self._given, len(self.text) - self._longest + 1)
        piece = self.text[self._given : safe]
        self._given = max(self._given, safe)
        return piece

    def rest(self) -> str:
        """Everything not yet handed out (the sequence has ended)."""
        piece = self.text[self._given :]
        self._given = len(self.text)
        return piece
