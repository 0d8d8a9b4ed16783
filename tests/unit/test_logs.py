"""Structured log lines: the event, its typed fields and the bound context, in both formats."""

from __future__ import annotations

import ast
import asyncio
import io
import logging
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

from batchserve.core.logs import (
    IDS_PER_LINE,
    annotate,
    bind,
    bound,
    formatter,
    get_logger,
    log_request_ids,
    setup_logging,
)

Log = Callable[..., list[str]]


@pytest.fixture
def emit() -> Iterator[Log]:
    """Log through a process's renderer: ``emit("json", "api", lambda log: ...)``, its lines."""
    logger = logging.getLogger("batchserve.test")

    def run(fmt: str, role: str, call: Callable[[Any], None], *, stdlib: bool = False) -> list[str]:
        stream = io.StringIO()
        handler = logging.StreamHandler(stream)
        handler.setFormatter(formatter(role, fmt))
        logger.addHandler(handler)
        try:
            call(logger if stdlib else get_logger(logger.name))
        finally:
            logger.removeHandler(handler)
        return stream.getvalue().splitlines()

    level, propagate = logger.level, logger.propagate
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield run
    logger.setLevel(level)
    logger.propagate = propagate


def json_line(emit: Log, role: str, call: Callable[[Any], None], **kw: Any) -> dict[str, Any]:
    (line,) = emit("json", role, call, **kw)
    data: dict[str, Any] = orjson.loads(line)
    return data


def test_a_json_line_has_the_event_its_fields_and_the_bound_context(emit: Log) -> None:
    with bind(batch_id="b-1", model="echo-100ms"), bind(attempt=2):
        data = json_line(
            emit, "worker", lambda log: log.info("batch_done", size=32, model_ms=101.5)
        )
    assert data["event"] == "batch_done" and data["role"] == "worker"
    assert data["size"] == 32 and data["model_ms"] == 101.5
    assert data["batch_id"] == "b-1" and data["model"] == "echo-100ms" and data["attempt"] == 2
    assert list(data)[:6] == ["ts", "level", "role", "pid", "logger", "event"]
    assert data["level"] == "info" and data["logger"] == "batchserve.test"


def test_an_error_a_float_and_an_int_keep_their_json_types(emit: Log) -> None:
    """The regex formatter this replaced cut the error at its first space and kept floats as
    strings."""
    error = ConnectionError("Connection refused by peer")
    with bind(request_id="r-42"):
        data = json_line(
            emit,
            "api",
            lambda log: log.warning("publish_failed", error=error, seconds=0.25, count=3),
        )
    assert data["error"] == "ConnectionError: Connection refused by peer"
    assert isinstance(data["seconds"], float) and data["seconds"] == 0.25
    assert isinstance(data["count"], int) and data["count"] == 3
    assert data["request_id"] == "r-42"


REQUEST_ID = "01a22c87-857a-7153-9df7-f9006fb25689"


def test_the_bound_request_id_is_on_every_line_in_both_formats(emit: Log) -> None:
    def lines(log: Any) -> None:
        log.info("request_accepted", lane="interactive")
        log.warning("openai_stream_failed", error=TimeoutError())

    with bind(request_id=REQUEST_ID):
        text = emit("text", "api", lines)
        json = emit("json", "api", lines)
    assert len(text) == len(json) == 2
    assert all(f"request_id={REQUEST_ID}" in line for line in text)
    assert all(orjson.loads(line)["request_id"] == REQUEST_ID for line in json)
    assert text[1].endswith(f"openai_stream_failed error=TimeoutError request_id={REQUEST_ID}")


def test_the_call_wins_over_the_context_and_none_is_absent(emit: Log) -> None:
    with bind(model="bound-model", tenant="acme"), bind(batch_id="b-1"):
        data = json_line(
            emit,
            "api",
            lambda log: log.info(
                "requests_running", model="echo-100ms", request_ids=["a", "b"], batch_id=None
            ),
        )
    assert data["model"] == "echo-100ms" and data["tenant"] == "acme"
    assert data["request_ids"] == ["a", "b"]
    assert data["batch_id"] == "b-1"  # None at the call: the bound one fills it
    assert "message" not in data  # nothing but fields: no need to repeat it


def test_another_librarys_line_keeps_its_whole_message_and_the_context(emit: Log) -> None:
    with bind(request_id="r-7"):
        data = json_line(
            emit, "api", lambda log: log.warning("publish failed: %d (retrying)", 3), stdlib=True
        )
        (text,) = emit("text", "api", lambda log: log.warning("Shutting down"), stdlib=True)
    assert data["event"] == "publish failed: 3 (retrying)" and data["role"] == "api"
    assert data["request_id"] == "r-7" and data["level"] == "warning"
    assert text.endswith(f"WARNING api[{data['pid']}] Shutting down request_id=r-7")


def test_text_lines_carry_the_fields_then_the_context(emit: Log) -> None:
    with bind(batch_id="b-9", model="echo-100ms"):
        (line,) = emit(
            "text", "batcher", lambda log: log.info("batch_dispatched", model="echo-100ms", size=4)
        )
    assert line.endswith("batch_dispatched model=echo-100ms size=4 batch_id=b-9")
    assert re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} INFO batcher\[\d+\] ", line), line


def test_text_values_with_spaces_are_quoted_and_lists_joined(emit: Log) -> None:
    error = ConnectionError("Connection refused by peer")
    (line,) = emit(
        "text",
        "worker",
        lambda log: log.info("x", error=error, request_ids=["a", "b"], seconds=1.5),
    )
    assert line.endswith(
        'x error="ConnectionError: Connection refused by peer" request_ids=a,b seconds=1.5'
    )


def test_a_text_value_is_quoted_for_any_whitespace_a_quote_or_an_equals_sign(emit: Log) -> None:
    values = {"nbsp": "a\u00a0b", "em": "a\u2003b", "sep": "a\x1cb", "eq": "a=b", "q": 'a"b'}
    (line,) = emit("text", "api", lambda log: log.info("x", plain="a-b_c.d/e:f", **values))
    assert " plain=a-b_c.d/e:f " in line
    for key, value in values.items():
        assert f" {key}={orjson.dumps(value).decode()}" in line, key


def test_an_exception_keeps_its_traceback_in_both_formats(emit: Log) -> None:
    def failing(log: Any) -> None:
        try:
            1 / 0  # noqa: B018
        except ZeroDivisionError:
            log.exception("batch_failed", batch_id="b-3")

    text = emit("text", "worker", failing)
    (json,) = emit("json", "worker", failing)
    data = orjson.loads(json)
    assert text[0].endswith(f"ERROR worker[{data['pid']}] batch_failed batch_id=b-3")
    assert text[1] == "Traceback (most recent call last):" and "ZeroDivisionError" in text[-1]
    assert data["level"] == "error" and data["batch_id"] == "b-3"
    assert data["exc"].startswith("Traceback") and "ZeroDivisionError" in data["exc"]


def test_a_urls_password_is_never_logged(emit: Log) -> None:
    url = "postgresql+psycopg://batchserve:s3cret-pw@db:5432/batchserve"
    error = ConnectionError(f"cannot reach {url}")

    def ready(log: Any) -> None:
        log.info("embedded_ready", url="http://127.0.0.1:8000/", tenant="a@b", database=url)
        log.warning("store_unavailable", error=error)

    text = emit("text", "api", ready)
    json = [orjson.loads(line) for line in emit("json", "api", ready)]
    assert not any("s3cret-pw" in line for line in text)
    assert json[0]["database"] == "postgresql+psycopg://batchserve:***@db:5432/batchserve"
    assert json[0]["url"] == "http://127.0.0.1:8000/" and json[0]["tenant"] == "a@b"
    assert json[1]["error"].endswith("batchserve:***@db:5432/batchserve")


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


@pytest.mark.parametrize("value", [REQUEST_ID, "echo-100ms", "1e3"])
def test_ids_and_names_stay_strings(emit: Log, value: str) -> None:
    data = json_line(emit, "api", lambda log: log.info("x", key=value))
    assert data["key"] == value


def test_setup_routes_other_libraries_through_the_renderer_and_quiets_the_noisy(
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    noisy = {name: logging.getLogger(name).level for name in ("celery", "uvicorn.access")}
    try:
        setup_logging("api", fmt="json", level="INFO")
        with bind(request_id="r-9"):
            logging.getLogger("uvicorn.error").info("Application startup complete.")
            logging.getLogger("uvicorn.access").info("GET /v1/requests 200")
            get_logger("batchserve.api").info("request_accepted", lane="bulk")
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)
        for name, was in noisy.items():
            logging.getLogger(name).setLevel(was)
    lines = [orjson.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [(line["logger"], line["event"]) for line in lines] == [
        ("uvicorn.error", "Application startup complete."),
        ("batchserve.api", "request_accepted"),
    ]
    assert all(line["role"] == "api" and line["request_id"] == "r-9" for line in lines)


PRODUCT = Path(__file__).resolve().parents[2]
LEVELS = {"debug", "info", "warning", "error", "exception", "critical"}


def test_every_log_call_is_an_event_name_and_keyword_fields() -> None:
    """No printf message anywhere: a log call is ``log.info("event", key=value)``."""
    found = []
    for folder in ("batchserve",):
        for path in (PRODUCT / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name)
                    and node.func.value.id == "log"
                    and node.func.attr in LEVELS
                ):
                    event = node.args[0] if node.args else None
                    plain = isinstance(event, ast.Constant) and re.fullmatch(
                        r"\w+", str(event.value)
                    )
                    if len(node.args) != 1 or not (plain or isinstance(event, ast.JoinedStr)):
                        found.append(f"{path.relative_to(PRODUCT)}:{node.lineno}")
    assert found == []


def test_lines_go_to_stderr_as_it_is_when_written(monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness swapped stderr and closed the old one (pytest's capture): a thread logging
    afterwards wrote to the closed file ("I/O operation on closed file")."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        first, second = io.StringIO(), io.StringIO()
        monkeypatch.setattr("sys.stderr", first)
        setup_logging("api")
        first.close()
        monkeypatch.setattr("sys.stderr", second)
        get_logger("batchserve.test").info("after_the_swap", n=1)
        written = second.getvalue()
        assert "after_the_swap" in written and "Logging error" not in written, written
    finally:
        root.handlers[:], level = saved
        root.setLevel(level)


def test_requests_that_changed_together_share_a_line_of_at_most_a_hundred_ids(emit: Log) -> None:
    ids = [f"r-{n}" for n in range(250)]
    lines = emit("json", "worker", lambda log: log_request_ids(log, "requests_x", ids, model="m"))
    data = [orjson.loads(line) for line in lines]
    assert [d["count"] for d in data] == [IDS_PER_LINE, IDS_PER_LINE, 50]
    assert [i for d in data for i in d["request_ids"]] == ids
    assert all(d["event"] == "requests_x" and d["model"] == "m" for d in data)


def test_a_group_commit_logs_a_line_for_each_model_lane_and_tenant_in_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A group's admissions are logged together, as their later changes are (a line each cost
    the API a few per cent of its CPU a submit at 1,000/s: docs/frontdoor.md), and counted by
    model and lane."""
    from prometheus_client import REGISTRY

    from batchserve.api import group_commit
    from batchserve.core.domain import Lane

    said: list[tuple[str, list[str], dict[str, Any]]] = []

    def record(_: Any, event: str, ids: list[str], **fields: Any) -> None:
        said.append((event, list(ids), fields))

    monkeypatch.setattr(group_commit, "log_request_ids", record)

    def admitted(n: int, lane: Lane, tenant: str) -> Any:
        return SimpleNamespace(
            record=SimpleNamespace(id=f"id-{n}", model="m-logs", lane=lane, tenant=tenant)
        )

    def counted(lane: str) -> float:
        labels = {"model": "m-logs", "lane": lane}
        return REGISTRY.get_sample_value("batchserve_admissions_total", labels) or 0.0

    before = counted("interactive"), counted("bulk")
    group_commit._observe_admitted(
        [
            admitted(1, Lane.INTERACTIVE, "a"),
            admitted(2, Lane.INTERACTIVE, "b"),
            admitted(3, Lane.INTERACTIVE, "a"),
            admitted(4, Lane.BULK, "a"),
        ]
    )
    fields = {"model": "m-logs", "lane": "interactive"}
    assert said == [
        ("requests_accepted", ["id-1", "id-3"], {**fields, "tenant": "a"}),
        ("requests_accepted", ["id-2"], {**fields, "tenant": "b"}),
        ("requests_accepted", ["id-4"], {**fields, "lane": "bulk", "tenant": "a"}),
    ]
    assert (counted("interactive"), counted("bulk")) == (before[0] + 3, before[1] + 1)
