"""The dashboard in a real browser (headless Chromium) against a running stack with traffic.

``BATCHSERVE_DASHBOARD_SCREENSHOT=docs/dashboard.png`` makes the test run a minute of varied
traffic first and save the screenshot there (see docs/operations.md).
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from batchserve.bench.loadgen import open_loop, poisson_schedule
from batchserve.testing.deployment import Stack
from tests.support import browser, keys
from tests.support.live import wait_terminal

ECHO = "echo-100ms"
SCREENSHOT = os.environ.get("BATCHSERVE_DASHBOARD_SCREENSHOT")


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    problem = browser.ensure_chromium()
    if problem is not None:
        pytest.skip(problem)
    with browser.headless_chromium() as driver:
        yield driver


def number(text: str) -> float | None:
    cleaned = text.replace(",", "").strip()
    return float(cleaned) if re.fullmatch(r"-?\d+(\.\d+)?", cleaned) else None


def text(driver: Any, selector: str) -> str:
    """An element's rendered text, read in one script: the page replaces its table on every
    refresh, so an element found by one WebDriver call can be gone (stale) by the next."""
    return str(
        driver.execute_script(
            "const e = document.querySelector(arguments[0]); return e ? e.innerText : '';",
            selector,
        )
    )


def cell(driver: Any, model: str, column: str) -> str:
    return text(driver, f'tr[data-model="{model}"] td.{column}')


def wait_until(check: Any, timeout_s: float = 60.0) -> None:
    give_up = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < give_up, "the dashboard did not show it in time"
        time.sleep(0.5)


def painted_pixels(driver: Any, canvas_id: str) -> int:
    """Pixels a chart has drawn on (its grid lines alone are a few hundred)."""
    return int(
        driver.execute_script(
            "const c = document.getElementById(arguments[0]);"
            "const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;"
            "let n = 0; for (let i = 3; i < d.length; i += 4) if (d[i] > 0) n++; return n;",
            canvas_id,
        )
    )


async def traffic(stack: Stack) -> list[str]:
    """A few seconds at 60/s; for the screenshot, a minute that rises, peaks and eases off."""
    phases = [(60.0, 6.0)]
    if SCREENSHOT:
        phases = [(40.0, 15.0), (150.0, 15.0), (300.0, 10.0), (100.0, 15.0)]
    accepted: list[str] = []
    for n, (rate, seconds) in enumerate(phases):
        result = await open_loop(
            stack.url,
            poisson_schedule(rate, seconds, seed=n),
            lambda i: {"model": ECHO, "input": f"dashboard {i}", "params": {"max_tokens": 32}},
            headers=keys.auth(),
        )
        accepted += [s.request_id for s in result.accepted if s.request_id]
    return accepted


async def test_dashboard_shows_live_figures_of_a_running_stack(
    stack: Stack, http: httpx.AsyncClient, chromium: Any
) -> None:
    stack.start_all({ECHO: 2})
    # Requests for a model no worker serves, with a deadline: they expire (recent failures).
    for i in range(3):
        await http.post(
            "/v1/requests", json={"model": "echo-slow", "input": f"x{i}", "timeout_s": 1}
        )
    load = asyncio.create_task(traffic(stack))

    await asyncio.to_thread(chromium.get, f"{stack.ops_url}/dashboard")
    assert chromium.title == "batchserve dashboard"

    def live_batches() -> bool:
        batches = number(cell(chromium, ECHO, "batches"))
        return batches is not None and batches > 0

    await asyncio.to_thread(wait_until, live_batches)
    accepted = await load

    def settled() -> bool:
        """Every request dispatched, and the page's batch figures account for all of them."""
        batches = number(cell(chromium, ECHO, "batches"))
        mean_batch = number(cell(chromium, ECHO, "mean-batch"))
        return (
            number(text(chromium, "#total-queued")) == 0
            and batches is not None
            and mean_batch is not None
            and abs(batches * mean_batch - len(accepted)) <= 0.02 * len(accepted)
            and number(cell(chromium, ECHO, "p50")) is not None
            and "expired" in text(chromium, "#failures")
        )

    await asyncio.to_thread(wait_until, settled, 120.0)
    p50, p99 = number(cell(chromium, ECHO, "p50")), number(cell(chromium, ECHO, "p99"))
    assert p50 is not None and p99 is not None
    assert 100 <= p50 <= p99 < 30_000  # echo-100ms: every batch takes 100 ms
    assert cell(chromium, ECHO, "slots").endswith("/ 2")
    assert number(text(chromium, "#throughput-rps")) not in (None, 0.0)
    assert chromium.execute_script("return document.getElementById('status').className") == "ok"
    assert painted_pixels(chromium, "latency-chart") > 2_000
    assert painted_pixels(chromium, "batch-chart") > 2_000
    failures = text(chromium, "#failures")
    assert "echo-slow" in failures and "deadline_exceeded" in failures

    target = Path(SCREENSHOT) if SCREENSHOT else stack.log_dir / "dashboard.png"
    target.parent.mkdir(parents=True, exist_ok=True)
    assert chromium.save_screenshot(str(target))
    assert target.stat().st_size > 20_000
    if not SCREENSHOT:  # the figures were real: every request the page counted succeeded
        results = await wait_terminal(http, accepted, timeout_s=120)
        assert all(r["status"] == "succeeded" for r in results.values())
