"""``/v1/files``: batch input files in, output and error files out (OpenAI's Files API)."""

from __future__ import annotations

import uuid
from typing import Annotated

from fastapi import APIRouter, Depends, Form, UploadFile
from fastapi.responses import Response

from batchserve.api.batch_schemas import file_object
from batchserve.api.deps import Services, Tenant, get_caller
from batchserve.api.openai_errors import OpenAIRoute
from batchserve.api.responses import JSON
from batchserve.core.bulk import FILE_PREFIX, FilePurpose, parse_public_id
from batchserve.core.errors import InvalidInput, NotFound

router = APIRouter(
    prefix="/v1/files", tags=["files"], route_class=OpenAIRoute, dependencies=[Depends(get_caller)]
)

READ_CHUNK = 1 << 20


@router.post("")
async def upload_file(
    services: Services,
    tenant: Tenant,
    file: UploadFile,
    # Checked here, which says why; the document lists the one choice.
    purpose: Annotated[str, Form(json_schema_extra={"enum": [FilePurpose.BATCH.value]})],
) -> JSON:
    """Upload a batch input file (JSONL, ``purpose=batch``); it is checked when a batch uses it."""
    if purpose != FilePurpose.BATCH.value:
        raise InvalidInput(
            "purpose must be 'batch' (the only files batchserve takes)", field="purpose"
        )
    content = await _read_capped(file, services.settings.max_file_bytes)
    record = await services.adapters.store.create_file(
        tenant=tenant,
        purpose=FilePurpose.BATCH,
        filename=file.filename or "input.jsonl",
        content=content,
        now=services.clock(),
    )
    return JSON(file_object(record))


@router.get("/{file_id}")
async def get_file(file_id: str, services: Services, tenant: Tenant) -> JSON:
    """A file's size, name and purpose."""
    record = await services.adapters.store.get_file(_file_uuid(file_id), tenant)
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
    content = await services.adapters.store.file_content(_file_uuid(file_id), tenant)
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
