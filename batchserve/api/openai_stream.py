"""``stream: true`` on ``/v1/chat/completions`` and ``/v1/completions``: the request's stream
(``batchserve/api/streams.py``) in OpenAI's chunk format.

Chat: a first chunk with ``delta.role``, then ``delta.content`` pieces, a last chunk with the
``finish_reason``, with ``stream_options.include_usage`` one more with ``usage`` and no
``choices``, then ``data: [DONE]``. Completions: ``text`` pieces the same way. A request that
ends without an answer ends its stream with OpenAI's error object (``{"error": {...}}``).

OpenAI's format cannot take text back, so where the request's own stream starts over (it ran
again after its worker was lost) the new run's text is held until it passes what was already
sent, which it must repeat; an answer that differs ends the stream with an error.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import orjson

from batchserve.api.openai_schemas import finish_reason, usage
from batchserve.api.services import ApiServices
from batchserve.api.statuses import error_body, failure_of, status_of
from batchserve.api.streams import DELTA_EVENT, RESET, follow
from batchserve.core.domain import RequestRecord, RequestState, to_epoch

DONE = "[DONE]"


@dataclass(frozen=True, slots=True)
class ChunkFormat:
    chat: bool
    include_usage: bool

    def base(self, record: RequestRecord) -> dict[str, Any]:
        prefix, kind = (
            ("chatcmpl", "chat.completion.chunk") if self.chat else ("cmpl", "text_completion")
        )
        chunk: dict[str, Any] = {
            "id": f"{prefix}-{record.id.hex}",
            "object": kind,
            "created": int(to_epoch(record.created_at)),
            "model": record.model,
            "system_fingerprint": None,
        }
        if self.include_usage:
            chunk["usage"] = None
        return chunk

    def piece(
        self,
        record: RequestRecord,
        text: str | None,
        *,
        reason: str | None = None,
        role: bool = False,
    ) -> dict[str, Any]:
        choice: dict[str, Any] = {"index": 0}
        if self.chat:
            delta: dict[str, Any] = {"role": "assistant"} if role else {}
            if text is not None:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text or ""
        choice["logprobs"] = None
        choice["finish_reason"] = reason
        return {**self.base(record), "choices": [choice]}


class Diverged(Exception):
    """A run's text departs from what the client already got."""


def next_piece(sent: str, target: str) -> str:
    """What to send of ``target`` (the stream's text now) after ``sent``: the part past it, or
    nothing while a new run is still repeating it."""
    if target.startswith(sent):
        return target[len(sent) :]
    if sent.startswith(target):
        return ""
    raise Diverged


async def chunks(
    services: ApiServices, record: RequestRecord, tenant: str, form: ChunkFormat
) -> AsyncIterator[str]:
    """The ``data:`` of each event of an OpenAI stream, until ``[DONE]``."""
    first = record
    if form.chat:
        yield _json(form.piece(first, "", role=True))
    sent = target = ""
    end: RequestRecord | None = None
    try:
        async for event in follow(services, record, tenant):
            if event.event == RESET:
                target = ""
            elif event.event == DELTA_EVENT:
                target += event.data["text"]
            elif event.record is not None:
                end = event.record
            piece = next_piece(sent, target)
            if piece:
                sent += piece
                yield _json(form.piece(first, piece))
    except Diverged:
        yield _json(error_body(500, DIVERGED, "stream_diverged", None))
        yield DONE
        return
    assert end is not None
    if end.state is RequestState.SUCCEEDED:
        yield _json(form.piece(end, None if form.chat else "", reason=finish_reason(end)))
        if form.include_usage:
            yield _json({**form.base(end), "choices": [], "usage": usage(end)})
    else:
        failure = failure_of(end)
        status = status_of(failure)
        yield _json(error_body(status, failure.message, end.error_code or end.state.value, None))
    yield DONE


DIVERGED = (
    "the request ran again after its worker was lost, and its new answer differs from the text "
    "already streamed; read the stored answer at /v1/requests/{id}"
)


def _json(value: dict[str, Any]) -> str:
    return orjson.dumps(value).decode()
