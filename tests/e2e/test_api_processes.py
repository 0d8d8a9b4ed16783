"""``batchserve api --processes N``: N processes on one port, one listening socket, supervised
by their parent (api/processes.py)."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time
from pathlib import Path

import httpx

from batchserve.testing.deployment import Stack
from tests.support import keys
from tests.support.live import wait_terminal

ECHO = "echo-100ms"


def accepting_pids(log: Path) -> set[int]:
    """The processes that logged an admission."""
    return {int(pid) for pid in re.findall(r"api\[(\d+)\] requests_accepted", log.read_text())}


async def submit(url: str, count: int, tag: str) -> list[str]:
    """``count`` submits, each on a connection of its own (as many clients would)."""
    ids = []
    for i in range(count):
        async with httpx.AsyncClient(base_url=url, headers=keys.auth(), timeout=30) as client:
            response = await client.post("/v1/requests", json={"model": ECHO, "input": f"{tag}{i}"})
            assert response.status_code == 202, response.text
            ids.append(response.json()["id"])
    return ids


async def test_processes_share_the_port_and_a_dead_one_is_replaced(stack: Stack) -> None:
    stack.start("batcher", "batcher")
    stack.start("maintenance", "maintenance")
    stack.start(f"worker:{ECHO}", "worker", "--model", ECHO, "--slots", "2")
    role = stack.start_api("api", None, "--processes", "2")
    stack.wait_slots(ECHO, 2)
    children = stack.child_pids("api")
    assert len(children) == 2
    log = Path(role.log_path)

    ids = await submit(stack.url, 60, "a")
    # The kernel handed connections to both processes; either answers a long-poll for any.
    assert accepting_pids(log) == set(children)
    async with httpx.AsyncClient(base_url=stack.url, headers=keys.auth(), timeout=60) as http:
        results = await wait_terminal(http, ids, timeout_s=60)
        assert all(r["status"] == "succeeded" for r in results.values())
        # The operators' listener adds up every process's counters.
        metrics = (await http.get(f"{stack.ops_url}/metrics")).text
    admitted = re.search(
        r'batchserve_admissions_total\{lane="interactive",model="echo-100ms"\} (\S+)', metrics
    )
    assert admitted is not None and float(admitted.group(1)) == 60

    # A process killed outright is forked again; the port never stops answering.
    os.kill(children[0], signal.SIGKILL)
    more = await submit(stack.url, 20, "b")
    give_up = time.monotonic() + 20
    while len(stack.child_pids("api")) < 2 and time.monotonic() < give_up:
        await asyncio.sleep(0.2)
    replaced = stack.child_pids("api")
    assert len(replaced) == 2 and children[0] not in replaced
    assert "api_process_died" in log.read_text()
    async with httpx.AsyncClient(base_url=stack.url, headers=keys.auth(), timeout=60) as http:
        results = await wait_terminal(http, more, timeout_s=60)
        assert all(r["status"] == "succeeded" for r in results.values())

    # SIGTERM to the parent: every process finishes and exits, the parent with 0.
    stack.stop("api")
    assert role.process is not None and role.process.returncode == 0
    for pid in replaced:
        assert (
            not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
        )


async def test_a_killed_parent_takes_its_processes_with_it(stack: Stack) -> None:
    """None outlives its parent holding the port (PR_SET_PDEATHSIG)."""
    stack.start_api("api", None, "--processes", "2")
    children = stack.child_pids("api")
    assert len(children) == 2
    stack.kill("api")
    give_up = time.monotonic() + 20
    while any(Path(f"/proc/{pid}").exists() for pid in children) and time.monotonic() < give_up:
        await asyncio.sleep(0.2)
    assert not any(Path(f"/proc/{pid}").exists() for pid in children)
    with httpx.Client(timeout=2) as client:
        try:
            client.get(f"{stack.url}/healthz")
        except httpx.ConnectError:
            pass
        else:
            raise AssertionError("something still answers on the API's port")
