"""The OpenAPI document says what the server enforces (issue 21, item 8): schemathesis, with
every check, runs against a deployment in tests/e2e/test_schema_fuzz.py; these pin the limits
and links it found missing, and the Allow header of a 405."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI


def operation(app: FastAPI, method: str, path: str) -> dict[str, Any]:
    document: dict[str, Any] = app.openapi()
    return dict(document["paths"][path][method])


def parameter(op: dict[str, Any], name: str) -> dict[str, Any]:
    return next(p for p in op["parameters"] if p["name"] == name)


async def test_the_document_states_the_limits_the_routes_enforce(app: FastAPI) -> None:
    settings = app.state.services.settings
    wait = parameter(operation(app, "get", "/v1/requests/{request_id}"), "wait")
    assert wait["schema"]["maximum"] == settings.max_wait_s
    schemas = app.openapi()["components"]["schemas"]
    batch = schemas["CreateBatch"]["properties"]
    assert batch["endpoint"]["enum"] == [
        "/v1/chat/completions",
        "/v1/completions",
        "/v1/embeddings",
    ]
    assert "24h" in batch["completion_window"]["enum"]
    chat = schemas["ChatBody"]["properties"]
    assert chat["model"]["minLength"] == 1 and chat["tools"]["maxItems"] == 0
    assert chat["n"]["maximum"] == 1 and chat["temperature"]["maximum"] == 2.0
    submit = schemas["SubmitRequest"]
    assert [branch["required"] for branch in submit["oneOf"]] == [["input"], ["messages"]]
    upload = operation(app, "post", "/v1/files")["requestBody"]["content"]
    form = next(iter(upload.values()))["schema"]
    ref = form["$ref"].rsplit("/", 1)[1]
    assert schemas[ref]["properties"]["purpose"]["enum"] == ["batch"]
    assert set(schemas[ref]["required"]) == {"file", "purpose"}


async def test_a_created_resource_links_to_what_takes_its_id(app: FastAPI) -> None:
    links = operation(app, "post", "/v1/requests")["responses"]["202"]["links"]
    assert links["CancelRequest"]["parameters"] == {"request_id": "$response.body#/id"}
    assert "GetBatch" in operation(app, "post", "/v1/batches")["responses"]["200"]["links"]
    created = operation(app, "post", "/v1/files")["responses"]["200"]["links"]["CreateBatch"]
    assert created["requestBody"]["input_file_id"] == "$response.body#/id"


async def test_a_405_names_every_method_of_the_path(client: httpx.AsyncClient) -> None:
    for path, allowed in [
        ("/v1/batches", {"GET", "POST"}),
        ("/v1/webhooks/secret", {"GET", "POST"}),
    ]:
        response = await client.request("PUT", path)
        assert response.status_code == 405, response.text
        assert set(response.headers["allow"].split(", ")) == allowed, response.headers


async def test_an_integer_may_not_come_as_a_fraction(client: httpx.AsyncClient) -> None:
    body = {"model": "echo-100ms", "messages": [{"role": "user", "content": "hi"}]}
    refused = await client.post("/v1/chat/completions", json=body | {"max_tokens": 4.5})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
