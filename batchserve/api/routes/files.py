"""``/v1/files``: batch input files in, output and error files out (OpenAI's Files API)."""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, Depends, Form, Query, UploadFile
from fastapi.responses import Response

from batchserve.api.batch_schemas import EXPIRES_MAX_S, EXPIRES_MIN_S, file_object, openai_list
from batchserve.api.deps import IdempotencyKey, Services, Tenant, get_caller
from batchserve.api.openai_errors import OpenAIRoute
from batchserve.api.responses import JSON
from batchserve.api.submission import check_idempotency_key
from batchserve.core.bulk import FILE_PREFIX, FilePurpose, parse_public_id
from batchserve.core.errors import InvalidInput, NotFound
from batchserve.core.store.creations import CreationKey

router = APIRouter(
    prefix="/v1/files", tags=["files"], route_class=OpenAIRoute, dependencies=[Depends(get_caller)]
)

READ_CHUNK = 1 << 20


def _form_field(schema: dict[str, Any]) -> Callable[[dict[str, Any]], None]:
    """An optional form field documented as ``schema`` alone: absent is how a form leaves it
    out (a multipart part cannot be null; the string "null" is not a value of it)."""

    def document(generated: dict[str, Any]) -> None:
        generated.pop("anyOf", None)
        generated.update(schema)

    return document


@router.post("")
async def upload_file(
    services: Services,
    tenant: Tenant,
    file: UploadFile,
    # Checked here, which says why; the document lists the one choice.
    purpose: Annotated[str, Form(json_schema_extra={"enum": [FilePurpose.BATCH.value]})],
    # OpenAI's expires_after, as its SDK sends it in a multipart form.
    expires_anchor: Annotated[
        Literal["created_at"] | None,
        Form(
            alias="expires_after[anchor]",
            json_schema_extra=_form_field({"type": "string", "enum": ["created_at"]}),
        ),
    ] = None,
    expires_seconds: Annotated[
        int | None,
        Form(
            alias="expires_after[seconds]",
            ge=EXPIRES_MIN_S,
            le=EXPIRES_MAX_S,
            json_schema_extra=_form_field(
                {"type": "integer", "minimum": EXPIRES_MIN_S, "maximum": EXPIRES_MAX_S}
            ),
        ),
    ] = None,
    idempotency_key: IdempotencyKey = None,
) -> JSON:
    """Upload a batch input file (JSONL, ``purpose=batch``); it is checked when a batch uses it.
    With ``expires_after`` (``seconds``: 3,600 to 30 days after ``created_at``, the one anchor)
    it is gone from then on; without it, ``BATCHSERVE_FILE_RETENTION_S`` (30 days) after its
    creation (0: kept until deleted). A retry with the same ``Idempotency-Key`` (and the same
    file) gets the file the first upload created."""
    if purpose != FilePurpose.BATCH.value:
        raise InvalidInput(
            "purpose must be 'batch' (the only files batchserve takes)", field="purpose"
        )
    if expires_anchor is not None and expires_seconds is None:
        raise InvalidInput(
            "expires_after[anchor] needs expires_after[seconds]", field="expires_after[seconds]"
        )
    key = check_idempotency_key(idempotency_key)
    content = await _read_capped(file, services.settings.max_file_bytes)
    filename = file.filename or "input.jsonl"
    sent = [purpose, filename, expires_anchor, expires_seconds, hashlib.sha256(content).hexdigest()]
    record = await services.adapters.store.create_file(
        tenant=tenant,
        purpose=FilePurpose.BATCH,
        filename=filename,
        content=content,
        now=services.clock(),
        expires_after_s=expires_seconds or services.settings.file_retention_s or None,
        idempotency=None
        if key is None
        else CreationKey(key, hashlib.sha256(orjson.dumps(sent)).hexdigest()),
    )
    return JSON(file_object(record))


@router.get("")
async def list_files(
    services: Services,
    tenant: Tenant,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 10_000,
    order: Literal["asc", "desc"] = "desc",
    after: Annotated[
        str | None,
        Query(
            description="The last id of the previous page", pattern=f"^{FILE_PREFIX}[0-9a-f]{{32}}$"
        ),
    ] = None,
    purpose: FilePurpose | None = None,
) -> JSON:
    """The caller's files, newest first (``order=asc``: oldest first), a page at a time, as
    OpenAI's list of files: ``after`` is the ``last_id`` of the previous page."""
    cursor = _file_uuid(after) if after is not None else None
    records = await services.adapters.store.list_files(
        tenant,
        limit=limit + 1,
        after=cursor,
        newest_first=order == "desc",
        purpose=purpose,
        now=services.clock(),
    )
    page = [file_object(r) for r in records[:limit]]
    return JSON(openai_list(page, has_more=len(records) > limit))


@router.delete("/{file_id}")
async def delete_file(file_id: str, services: Services, tenant: Tenant) -> JSON:
    """Delete a file and its bytes. A batch that has not ended still reads its input file:
    deleting that one answers ``409`` naming the batch."""
    if not await services.adapters.store.delete_file(_file_uuid(file_id), tenant):
        raise NotFound(f"no file {file_id}")
    return JSON({"id": file_id, "object": "file", "deleted": True})


@router.get("/{file_id}")
async def get_file(file_id: str, services: Services, tenant: Tenant) -> JSON:
    """A file's size, name and purpose."""
    record = await services.adapters.store.get_file(
        _file_uuid(file_id), tenant, now=services.clock()
    )
    if record is None:
        raise NotFound(f"no file {file_id}")
    return JSON(file_object(record))


@router.get(
    "/{file_id}/content",
    responses={
        200: {
            "description": "The file's bytes",
            "content": {"application/octet-stream": {"schema": {"type": "string"}}},
        }
    },
    response_class=Response,
)
async def get_file_content(file_id: str, services: Services, tenant: Tenant) -> Response:
    """A file's bytes, as uploaded or generated."""
    content = await services.adapters.store.file_content(
        _file_uuid(file_id), tenant, now=services.clock()
    )
    if content is None:
        raise NotFound(f"no file {file_id}")
    return Response(content, media_type="application/octet-stream")


def _file_uuid(file_id: str) -> uuid.UUID:
    parsed = parse_public_id(file_id, FILE_PREFIX)
    if parsed is None:
        raise NotFound(f"no file {file_id}")
    return parsed


async def _read_capped(file: UploadFile, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await file.read(READ_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise InvalidInput(
                f"the file is larger than {max_bytes} bytes",
                field="file",
                limit={"max_bytes": max_bytes},
            )
        chunks.append(chunk)
    return b"".join(chunks)
