"""A finished job's output and error files, in OpenAI's Batch output format.

One line per ``custom_id``, in input order: succeeded requests go to the output file with the
response body the synchronous endpoint would have answered; the rest go to the error file,
with the HTTP error they would have earned, or, for requests the job's end kept from running,
``batch_expired`` / ``batch_cancelled``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from batchserve.api.embeddings import embedding_response
from batchserve.api.openai_schemas import chat_completion, text_completion
from batchserve.api.statuses import error_body, failure_of, status_of
from batchserve.core.bulk import Endpoint, JobCounts, JobLine, JobStatus, RenderedFiles
from batchserve.core.domain import RequestRecord, RequestState

UNRUN = {
    JobStatus.CANCELLED: ("batch_cancelled", "the batch was cancelled before this request ran"),
    JobStatus.EXPIRED: ("batch_expired", "the batch's completion window ended before it ran"),
}
UNRUN_BY_STATE = {
    RequestState.CANCELLED: UNRUN[JobStatus.CANCELLED],
    RequestState.EXPIRED: UNRUN[JobStatus.EXPIRED],
}


def render_files(
    endpoint: str,
    outcome: JobStatus,
    lines: Sequence[JobLine],
    input_content: bytes | None,
) -> RenderedFiles:
    """The output and error files of a job ending as ``outcome``.

    ``input_content`` is given when some lines never became requests (the job ended during
    ingest): those lines are reported unrun, with the ``custom_id`` the file gives them.
    """
    output: list[bytes] = []
    errors: list[bytes] = []
    for _, custom_id, record in _merged(lines, input_content):
        if record is not None and record.state is RequestState.SUCCEEDED:
            output.append(orjson.dumps(_succeeded(endpoint, custom_id, record)))
        elif record is not None and record.state is RequestState.FAILED:
            errors.append(orjson.dumps(_failed(custom_id, record)))
        else:
            code, message = (
                UNRUN_BY_STATE.get(record.state, UNRUN[JobStatus.EXPIRED])
                if record is not None
                else UNRUN.get(outcome, UNRUN[JobStatus.CANCELLED])
            )
            line_id = f"batch_req_{record.id.hex}" if record is not None else None
            errors.append(orjson.dumps(_unrun(line_id, custom_id, code, message)))
    counts = JobCounts(total=len(output) + len(errors), completed=len(output), failed=len(errors))
    return RenderedFiles(_jsonl(output), _jsonl(errors), counts)


def _merged(
    lines: Sequence[JobLine], input_content: bytes | None
) -> Iterator[tuple[int, str | None, RequestRecord | None]]:
    """Every line in order: the requests, and input lines that never became one."""
    missing = _unpersisted(lines, input_content)
    merged: list[tuple[int, str | None, RequestRecord | None]] = [
        (line.line, line.custom_id, line.record) for line in lines
    ]
    merged += [(number, custom_id, None) for number, custom_id in missing]
    merged.sort(key=lambda entry: entry[0])
    return iter(merged)


def _unpersisted(
    lines: Sequence[JobLine], input_content: bytes | None
) -> list[tuple[int, str | None]]:
    if input_content is None:
        return []
    persisted = {line.line for line in lines}
    missing: list[tuple[int, str | None]] = []
    for number, raw in enumerate(input_content.split(b"\n"), start=1):
        if not raw.strip() or number in persisted:
            continue
        try:
            data = orjson.loads(raw)
        except orjson.JSONDecodeError:
            data = None
        custom_id = data.get("custom_id") if isinstance(data, dict) else None
        missing.append((number, custom_id if isinstance(custom_id, str) else None))
    return missing


def _succeeded(endpoint: str, custom_id: str | None, record: RequestRecord) -> dict[str, Any]:
    body: dict[str, Any] | orjson.Fragment
    if endpoint == Endpoint.EMBEDDINGS.value:
        body = orjson.Fragment(embedding_response(record))  # the worker's JSON, as it is
    elif endpoint == Endpoint.CHAT.value:
        body = chat_completion(record)
    else:
        body = text_completion(record)
    return {
        "id": f"batch_req_{record.id.hex}",
        "custom_id": custom_id,
        "response": {"status_code": 200, "request_id": str(record.id), "body": body},
        "error": None,
    }


def _failed(custom_id: str | None, record: RequestRecord) -> dict[str, Any]:
    error = failure_of(record)
    status = status_of(error)
    body = error_body(status, error.message, error.error_code, None)
    return {
        "id": f"batch_req_{record.id.hex}",
        "custom_id": custom_id,
        "response": {"status_code": status, "request_id": str(record.id), "body": body},
        "error": None,
    }


def _unrun(line_id: str | None, custom_id: str | None, code: str, message: str) -> dict[str, Any]:
    return {
        "id": line_id,
        "custom_id": custom_id,
        "response": None,
        "error": {"code": code, "message": message},
    }


def _jsonl(lines: list[bytes]) -> bytes | None:
    return b"\n".join(lines) + b"\n" if lines else None
