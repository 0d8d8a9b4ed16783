"""A deployment across hosts (network namespaces, batchserve/testing/hosts.py): the API on host
a, the batcher and maintenance on b, a worker of ``echo-100ms`` on each of c and d, and open-loop
load from this process to the API's address. Three faults, each run audited exactly once:

(a) host c's link cut in the middle of a batch, past the lease, then healed;
(b) host d's clock 5 s ahead, then 5 s behind, under load: no batch started twice;
(c) host c killed (every process in it) mid-batch: host d serves the rest.

docs/cross-host.md has the picture and the figures; every figure there is a bound asserted here.
"""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from batchserve.testing.chaos import ChaosReport
from batchserve.testing.hosts import Hosts, HostStack, HostsUnavailable
from tests.chaos.conftest import CHAOS_ENV, ECHO, exactly_once, traffic
from tests.conftest import registered_test_models, server_env
from tests.support import keys
from tests.support.live import db_rows
from tests.support.servers import delete_namespace_queues

SKEWED_HOST = Path(__file__).parents[1] / "support" / "skewed_host"
LEASE_S = float(CHAOS_ENV["BATCHSERVE_LEASE_S"])
RATE = 40.0  # requests/s, open loop
SLOTS = 2  # per worker host

# The bounds docs/cross-host.md states.
CUT_FOR_S = LEASE_S + 4.0  # a few seconds past the lease
MAX_RECOVERY_S = 10.0  # from the fault to the last request of the batch it hit, terminal
# Any request, created to terminal, in a fault run: a batch RabbitMQ handed to the cut host
# after the cut waits out the dispatch grace (5 s) before it is dispatched again.
MAX_LATENCY_S = 15.0
MAX_LATENCY_SKEW_S = 5.0  # any request in a skew run (nothing reaped: nothing waits a lease)
MIN_ACCEPTED = 200


@pytest.fixture
def net(run_id: str, tmp_path: Path) -> Iterator[Hosts]:
    made = Hosts(["a", "b", "c", "d"], run=run_id, log_dir=tmp_path)
    try:
        made.create()
    except HostsUnavailable as error:
        made.close()
        pytest.skip(f"no network namespaces here (ip netns add needs root): {error}")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def stack(net: Hosts, database_url: str, namespace: str, tmp_path: Path) -> Iterator[HostStack]:
    env = {**os.environ, **server_env(database_url, namespace), **CHAOS_ENV}
    deployment = HostStack(env=env, log_dir=tmp_path, keys={"tests": keys.key()}, net=net)
    try:
        yield deployment
    finally:
        deployment.discard()
        delete_namespace_queues(namespace, registered_test_models())


def deploy(stack: HostStack, worker_d_env: dict[str, str] | None = None) -> None:
    stack.start("batcher", "batcher", host="b")
    stack.start("maintenance", "maintenance", host="b")
    for host in ("c", "d"):
        env = worker_d_env if host == "d" else None
        argv = ("worker", "--model", ECHO, "--slots", str(SLOTS))
        stack.start(f"worker-{host}", *argv, env=env, host=host)
    stack.start_api_on("a")
    stack.wait_slots(ECHO, 2 * SLOTS)


def skewed(offset_s: float) -> dict[str, str]:
    """A host whose wall clock is ``offset_s`` off (tests/support/skewed_host)."""
    return {"PYTHONPATH": str(SKEWED_HOST), "BATCHSERVE_TEST_CLOCK_SKEW_S": str(offset_s)}


@dataclass
class Hit:
    """A fault that hit batches running on a host."""

    at: float  # time.time() of the fault
    batches: list[str]
    requests: list[str]


def open_batches_on(stack: HostStack, host: str) -> list[str]:
    """Batches of ECHO started and not finished, by a process of ``host``."""
    rows = db_rows(
        stack,
        "SELECT id, worker FROM batches"
        " WHERE model = :m AND started_at IS NOT NULL AND outcome IS NULL",
        m=ECHO,
    )
    pids = set(stack.hosts.pids(host))
    return [str(b) for b, worker in rows if worker and int(worker.rsplit(":", 1)[1]) in pids]


def strike(stack: HostStack, host: str, fault: str, tries: int = 5) -> Hit:
    """Wait for a batch running on ``host``, then ``fault`` it (``cut`` or ``kill``); the
    batches it hit: those still open in Postgres after the fault (their results cannot arrive
    any more). A cut that hit none (the batch's result was already on its way) is healed and
    tried again (a kill that hit none: the worker restarted on the host, and again)."""
    for _ in range(tries):
        give_up = time.monotonic() + 20.0
        while not open_batches_on(stack, host):
            assert time.monotonic() < give_up, f"no batch ran on host {host} in 20 s"
            time.sleep(0.02)
        at = time.time()
        if fault == "cut":
            stack.hosts.cut(host)
        else:
            stack.hosts.kill_host(host)
        time.sleep(0.2)  # what left the host before the fault lands
        batches = open_batches_on(stack, host) if fault == "cut" else open_after_kill(stack, at)
        if batches:
            rows = db_rows(
                stack, "SELECT id FROM requests WHERE batch_id::text = ANY(:b)", b=batches
            )
            return Hit(at, batches, [str(r[0]) for r in rows])
        if fault == "cut":
            stack.hosts.heal(host)
            time.sleep(1.0)
        else:  # killed between two batches: a new worker on the host, and again
            stack.start(f"worker-{host}")
            stack.wait_slots(ECHO, 2 * SLOTS)
    raise AssertionError(f"{tries} cuts of host {host} hit no running batch")


def open_after_kill(stack: HostStack, at: float) -> list[str]:
    """Batches a killed host held: open, started before ``at``, on no live worker process."""
    rows = db_rows(
        stack,
        "SELECT id, worker FROM batches WHERE model = :m AND started_at IS NOT NULL"
        " AND started_at < to_timestamp(:at) AND outcome IS NULL",
        m=ECHO,
        at=at,
    )
    live = set(stack.hosts.pids("d"))
    return [str(b) for b, worker in rows if int(worker.rsplit(":", 1)[1]) not in live]


def recovery_s(stack: HostStack, hit: Hit) -> float:
    """From the fault until the last request of the batches it hit was terminal."""
    rows = db_rows(
        stack,
        "SELECT max(extract(epoch FROM finished_at)) FROM requests WHERE id::text = ANY(:ids)",
        ids=hit.requests,
    )
    return float(rows[0][0]) - hit.at


def max_latency_s(stack: HostStack, accepted: list[str]) -> float:
    rows = db_rows(
        stack,
        "SELECT max(extract(epoch FROM finished_at - created_at)) FROM requests"
        " WHERE id::text = ANY(:ids)",
        ids=accepted,
    )
    return float(rows[0][0])


def summary(run: str, report: ChaosReport, recovery: float | None, latency: float) -> None:
    shown = "-" if recovery is None else f"{recovery:.2f}s"
    print(
        f"\ncross-host {run}: accepted={report.accepted} succeeded={report.succeeded}"
        f" lost={report.lost} duplicated={report.duplicated} stuck={report.stuck}"
        f" recovery={shown} max_latency={latency:.2f}s"
    )


def assert_clean(report: ChaosReport, accepted: list[str]) -> None:
    assert report.accepted == len(accepted) >= MIN_ACCEPTED
    assert report.lost == report.duplicated == report.stuck == 0
    assert report.succeeded == report.accepted  # timeout_s=300: none expires


def batches_of(stack: HostStack) -> list[tuple[str, int, str | None, float]]:
    rows = db_rows(
        stack,
        "SELECT worker, attempt, outcome, extract(epoch FROM started_at) FROM batches"
        " WHERE model = :m AND started_at IS NOT NULL",
        m=ECHO,
    )
    return [(str(w), int(a), o, float(s)) for w, a, o, s in rows]


async def test_a_worker_host_cut_off_mid_batch_past_its_lease(stack: HostStack) -> None:
    deploy(stack)
    load = asyncio.create_task(traffic(stack, RATE, 14.0, seed=51))
    await asyncio.sleep(2.0)
    hit = await asyncio.to_thread(strike, stack, "c", "cut")
    await asyncio.sleep(CUT_FOR_S)
    stack.hosts.heal("c")
    accepted = await load
    report = exactly_once(stack, accepted)
    assert_clean(report, accepted)
    # The batch it cut off was reaped and run again elsewhere; the healed host's late write was
    # fenced out.
    outcomes = db_rows(stack, "SELECT outcome FROM batches WHERE id::text = ANY(:b)", b=hit.batches)
    assert {o for (o,) in outcomes} == {"crashed"}, outcomes
    attempts = db_rows(
        stack, "SELECT min(attempts) FROM requests WHERE id::text = ANY(:i)", i=hit.requests
    )
    assert attempts[0][0] >= 2
    # Host c came back and served again.
    assert stack.roles["worker-c"].alive()
    heal_at = hit.at + CUT_FOR_S
    later = [w for w, _, _, s in batches_of(stack) if s > heal_at + 1.0]
    assert any(stack.host_of_worker(w) == "c" for w in later), "host c served nothing after"
    recovery = recovery_s(stack, hit)
    latency = max_latency_s(stack, accepted)
    summary("a: link cut", report, recovery, latency)
    assert LEASE_S < recovery < MAX_RECOVERY_S
    assert latency < MAX_LATENCY_S


@pytest.mark.parametrize("offset_s", [5.0, -5.0], ids=["ahead", "behind"])
async def test_a_worker_host_with_a_skewed_clock_serves_without_a_reap(
    stack: HostStack, offset_s: float
) -> None:
    deploy(stack, worker_d_env=skewed(offset_s))
    accepted = await traffic(stack, RATE, 8.0, seed=52)
    report = exactly_once(stack, accepted)
    assert_clean(report, accepted)
    # No batch was started twice or reaped, and both worker hosts ran batches.
    rows = batches_of(stack)
    assert {outcome for _, _, outcome, _ in rows} == {"succeeded"}
    assert {attempt for _, attempt, _, _ in rows} == {1}
    assert {stack.host_of_worker(w) for w, _, _, _ in rows} == {"c", "d"}
    assert db_rows(stack, "SELECT max(attempts) FROM requests")[0][0] == 1
    # The skewed host found its clock off and corrected for it.
    log = stack.logs("worker-d")
    found = [float(v) for v in re.findall(r"clock_skew.*?offset_s\W*?(-?[\d.]+)", log)]
    assert found and all(abs(v + offset_s) < 0.5 for v in found), (found, log[-2000:])
    latency = max_latency_s(stack, accepted)
    summary(f"b: clock {offset_s:+.0f} s", report, None, latency)
    assert latency < MAX_LATENCY_SKEW_S


async def test_a_worker_host_killed_mid_batch_the_other_serves_the_rest(
    stack: HostStack,
) -> None:
    deploy(stack)
    load = asyncio.create_task(traffic(stack, RATE, 12.0, seed=53))
    await asyncio.sleep(2.0)
    hit = await asyncio.to_thread(strike, stack, "c", "kill")
    assert stack.hosts.pids("c") == []
    accepted = await load
    report = exactly_once(stack, accepted)
    assert_clean(report, accepted)
    outcomes = db_rows(stack, "SELECT outcome FROM batches WHERE id::text = ANY(:b)", b=hit.batches)
    assert {o for (o,) in outcomes} == {"crashed"}, outcomes
    # Everything after the kill ran on host d.
    after = [w for w, _, _, s in batches_of(stack) if s > hit.at + 0.5]
    assert after and {stack.host_of_worker(w) for w in after} == {"d"}
    recovery = recovery_s(stack, hit)
    latency = max_latency_s(stack, accepted)
    summary("c: host killed", report, recovery, latency)
    assert LEASE_S < recovery < MAX_RECOVERY_S
    assert latency < MAX_LATENCY_S
