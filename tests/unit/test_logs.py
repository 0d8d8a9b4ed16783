"""Structured log lines: the event, its key=value fields, ``extra=`` and the bound context."""

from __future__ import annotations

import asyncio
import logging

import orjson
import pytest

from core.logs import JsonFormatter, TextFormatter, annotate, bind, bound


def record(message: str, *args: object, **extra: object) -> logging.LogRecord:
    made = logging.LogRecord("batchserve.test", logging.INFO, __file__, 1, message, args, None)
    made.__dict__.update(extra)
    return made


def test_a_json_line_has_the_event_its_fields_and_the_bound_context() -> None:
    formatter = JsonFormatter("worker")
    with bind(batch_id="b-1", model="echo-100ms"), bind(attempt=2):
        line = formatter.format(record("batch_done size=%d model_ms=%.1f", 32, 101.5))
    data = orjson.loads(line)
    assert data["event"] == "batch_done" and data["role"] == "worker"
    assert data["size"] == 32 and data["model_ms"] == "101.5"
    assert data["batch_id"] == "b-1" and data["model"] == "echo-100ms" and data["attempt"] == 2


def test_the_message_wins_over_the_context_and_extra_adds_fields() -> None:
    formatter = JsonFormatter("api")
    with bind(model="bound-model", tenant="acme"):
        line = formatter.format(
            record("requests_running model=echo-100ms", request_ids="a,b", batch_id=None)
        )
    data = orjson.loads(line)
    assert data["model"] == "echo-100ms" and data["tenant"] == "acme"
    assert data["request_ids"] == ["a", "b"] and "batch_id" not in data
    assert "message" not in data  # nothing but fields: no need to repeat it


def test_free_text_keeps_the_whole_message() -> None:
    data = orjson.loads(JsonFormatter("api").format(record("publish_failed count=3 (retrying)")))
    assert data["count"] == 3 and data["message"] == "publish_failed count=3 (retrying)"


def test_text_lines_carry_the_context_not_already_in_the_message() -> None:
    formatter = TextFormatter("batcher")
    with bind(batch_id="b-9", model="echo-100ms"):
        line = formatter.format(record("batch_dispatched model=echo-100ms size=4"))
    assert line.endswith("batch_dispatched model=echo-100ms size=4 batch_id=b-9")


def test_bind_restores_the_outer_context_on_exit() -> None:
    with bind(request_id="r-1"):
        with bind(request_id="r-2", batch_id="b"):
            assert bound() == {"request_id": "r-2", "batch_id": "b"}
        assert bound() == {"request_id": "r-1"}
    assert bound() == {}


async def test_annotate_stays_inside_its_task() -> None:
    async def batch(batch_id: str) -> dict[str, object]:
        annotate(batch_id=batch_id)
        await asyncio.sleep(0)
        return bound()

    first, second = await asyncio.gather(batch("b-1"), batch("b-2"))
    assert first == {"batch_id": "b-1"} and second == {"batch_id": "b-2"}
    assert bound() == {}


@pytest.mark.parametrize("value", ["01a22c87-857a-7153-9df7-f9006fb25689", "echo-100ms", "1e3"])
def test_ids_and_names_stay_strings(value: str) -> None:
    data = orjson.loads(JsonFormatter("api").format(record(f"x key={value}")))
    assert data["key"] == value
