"""Token streams on real processes, in the embedded mode and on the full stack: OpenAI's own
client with ``stream=True``, a durable request's ``/stream`` (resumed with ``Last-Event-ID`` on
another API replica after the one serving it was killed), and disconnects cancelling OpenAI
calls."""

from __future__ import annotations

import contextlib
import json
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import OpenAI

from batchserve.testing.deployment import Stack, free_port
from tests.e2e.test_contract import ECHO, SLOW, Service, service_of
from tests.support.streams import Event, assembled, sse_events

TERMINAL = {"succeeded", "failed", "cancelled", "expired"}


@pytest.fixture(scope="module", params=["embedded", "stack"])
def service(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Service]:
    with service_of(request, tmp_path_factory, "streaming") as service:
        yield service


@dataclass
class Tenant:
    url: str
    key: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.key}"}

    def openai(self) -> OpenAI:
        return OpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0, timeout=60)

    def http(self) -> httpx.Client:
        return httpx.Client(base_url=self.url, headers=self.headers, timeout=60)


@pytest.fixture
def tenant(service: Service) -> Tenant:
    return Tenant(service.url, service.new_key())


def stored(http: httpx.Client, request_id: str) -> dict[str, Any]:
    give_up = time.monotonic() + 60
    while time.monotonic() < give_up:
        record: dict[str, Any] = http.get(f"/v1/requests/{request_id}", params={"wait": 10}).json()
        if record["status"] in TERMINAL:
            return record
    raise AssertionError(f"{request_id} not finished")


def latest(http: httpx.Client) -> dict[str, Any]:
    data = http.get("/v1/requests", params={"limit": 1}).json()["data"]
    assert len(data) == 1
    return dict(data[0])


def test_openai_client_streams_chat_and_completions(tenant: Tenant) -> None:
    client = tenant.openai()
    question = f"stream me {uuid.uuid4().hex[:8]} please"
    chunks = list(
        client.chat.completions.create(
            model=ECHO,
            messages=[{"role": "user", "content": question}],
            max_tokens=16,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == question  # echo-100ms answers with the prompt
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert reasons[-1] == "stop" and set(reasons[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == 4
    assert all(c.object == "chat.completion.chunk" and c.id == chunks[0].id for c in chunks)
    with tenant.http() as http:
        record = latest(http)  # the same durable request as any other
        assert record["status"] == "succeeded" and record["output"]["text"] == question
        assert chunks[0].id == f"chatcmpl-{uuid.UUID(record['id']).hex}"
        assert record["timings"]["ttft_ms"] is not None

    prompt = f"once upon {uuid.uuid4().hex[:8]}"
    pieces = list(client.completions.create(model=ECHO, prompt=prompt, max_tokens=8, stream=True))
    assert "".join(p.choices[0].text for p in pieces) == prompt
    assert pieces[-1].choices[0].finish_reason == "stop" and pieces[-1].usage is None


def test_openai_stream_refusals_name_the_parameter(tenant: Tenant) -> None:
    with tenant.http() as http:
        for body, param in (
            ({"stream_options": {"include_usage": True}}, "stream_options"),
            (
                {"stream": True, "stream_options": {"include_usage": True, "x": 1}},
                "stream_options.x",
            ),
            (
                {"stream": True, "stream_options": {"include_usage": 1}},
                "stream_options.include_usage",
            ),
            ({"stream": True, "n": 2}, "n"),
        ):
            response = http.post(
                "/v1/chat/completions",
                json={"model": ECHO, "messages": [{"role": "user", "content": "hi"}], **body},
            )
            assert response.status_code == 400, response.text
            assert response.json()["error"]["param"] == param


def test_a_stream_shows_a_request_from_queued_to_its_stored_answer(
    tenant: Tenant, service: Service
) -> None:
    with tenant.http() as http:
        text = f"durable {uuid.uuid4().hex[:8]}"
        request_id = http.post("/v1/requests", json={"model": SLOW, "input": text}).json()["id"]
        with http.stream("GET", f"/v1/requests/{request_id}/stream") as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            events = list(sse_events(response.iter_lines()))
        statuses = [e.data["status"] for e in events if e.event == "state"]
        assert statuses[0] in ("queued", "running") and "running" in statuses
        assert statuses[-1] == "succeeded" and events[-1].data["request"]["id"] == request_id
        assert assembled(events) == stored(http, request_id)["output"]["text"] == text
        ids = [e.id for e in events]
        assert all(ids) and len(set(ids)) == len(ids)

        # After the end the stream replays it: the same answer, the terminal state.
        with http.stream("GET", f"/v1/requests/{request_id}/stream") as response:
            replay = list(sse_events(response.iter_lines()))
        assert assembled(replay) == text and replay[-1].data["status"] == "succeeded"
        # Resumed after any event: exactly the rest.
        for n, event in enumerate(replay):
            headers = {"Last-Event-ID": event.id}
            with http.stream("GET", f"/v1/requests/{request_id}/stream", headers=headers) as rest:
                assert list(sse_events(rest.iter_lines())) == replay[n + 1 :]

        bad = http.get(f"/v1/requests/{request_id}/stream", headers={"Last-Event-ID": "nope"})
        assert bad.status_code == 422 and bad.json()["field"] == "Last-Event-ID"
    other = Tenant(service.url, service.new_key())
    with other.http() as http:
        assert http.get(f"/v1/requests/{request_id}/stream").status_code == 404


def test_leaving_an_openai_call_cancels_its_request_but_leaving_a_stream_does_not(
    tenant: Tenant,
) -> None:
    body = {"model": SLOW, "messages": [{"role": "user", "content": "abandoned"}]}
    with tenant.http() as http:
        with http.stream("POST", "/v1/chat/completions", json={**body, "stream": True}) as gone:
            assert gone.status_code == 200
            next(gone.iter_lines())  # the role chunk: then the client goes away
        assert stored(http, latest(http)["id"])["status"] == "cancelled"

        with pytest.raises(httpx.ReadTimeout):
            http.post("/v1/chat/completions", json=body, timeout=0.5)
        assert stored(http, latest(http)["id"])["status"] == "cancelled"

        request_id = http.post("/v1/requests", json={"model": SLOW, "input": "kept"}).json()["id"]
        with http.stream("GET", f"/v1/requests/{request_id}/stream") as left:
            next(left.iter_lines())
        assert stored(http, request_id)["status"] == "succeeded"


def test_an_api_told_to_stop_lets_an_openai_stream_finish(stack: Stack) -> None:
    stack.start_all({SLOW: 1})
    body = {"model": SLOW, "messages": [{"role": "user", "content": "finish me"}], "stream": True}
    with (
        httpx.Client(base_url=stack.url, headers=stack.auth(), timeout=60) as http,
        http.stream("POST", "/v1/chat/completions", json=body) as response,
    ):
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # the role chunk; the batch takes 1 s
        stack.signal("api", signal.SIGTERM)  # a rolling restart
        rest = [line for line in lines if line]
    contents = [json.loads(line[6:])["choices"][0]["delta"].get("content") for line in rest[:-1]]
    assert "finish me" in contents and rest[-1] == "data: [DONE]"


def _up(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(f"{url}/health", timeout=1).status_code == 200
    return False


def test_a_stream_resumes_on_another_replica_after_its_api_was_killed(
    stack: Stack, tmp_path: Path
) -> None:
    stack.start_all({SLOW: 1})
    other_port = free_port()
    stack.start("api2", "api", "--host", "127.0.0.1", "--port", str(other_port))
    other = f"http://127.0.0.1:{other_port}"
    headers = stack.auth("resume")
    give_up = time.monotonic() + 30
    while not _up(other):
        assert time.monotonic() < give_up, stack.logs("api2")
        time.sleep(0.1)
    with httpx.Client(base_url=stack.url, headers=headers, timeout=60) as first:
        text = f"resumable {uuid.uuid4().hex[:8]}"
        request_id = first.post("/v1/requests", json={"model": SLOW, "input": text}).json()["id"]
        seen: list[Event] = []
        with first.stream("GET", f"/v1/requests/{request_id}/stream") as response:
            for event in sse_events(response.iter_lines()):
                seen.append(event)
                if event.data.get("status") == "running":
                    stack.kill("api")  # mid-answer: the batch runs for a second
                    break
    assert seen and seen[-1].data["status"] == "running"
    with httpx.Client(base_url=other, headers=headers, timeout=60) as second:
        resume = {"Last-Event-ID": seen[-1].id}
        with second.stream("GET", f"/v1/requests/{request_id}/stream", headers=resume) as rest:
            missed = list(sse_events(rest.iter_lines()))
        assert {e.id for e in missed}.isdisjoint(e.id for e in seen)  # no duplicate
        assert missed[-1].data["status"] == "succeeded"
        answer = stored(second, request_id)["output"]["text"]
        assert assembled(seen + missed) == answer == text  # no gap


def test_langchain_and_litellm_stream_unmodified(
    tenant: Tenant, monkeypatch: pytest.MonkeyPatch
) -> None:
    from langchain_openai import ChatOpenAI
    from pydantic import SecretStr

    chat = ChatOpenAI(
        model=ECHO,
        base_url=f"{tenant.url}/v1",
        api_key=SecretStr(tenant.key),
        max_retries=0,
        timeout=60,
    )
    pieces = list(chat.stream("hello from langchain"))
    assert "".join(str(p.content) for p in pieces) == "hello from langchain"

    # LiteLLM reads its model price list from the network unless told to use its own copy.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    chunks = litellm.completion(
        model=f"openai/{ECHO}",
        api_base=f"{tenant.url}/v1",
        api_key=tenant.key,
        messages=[{"role": "user", "content": "hello from litellm"}],
        stream=True,
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "hello from litellm"
