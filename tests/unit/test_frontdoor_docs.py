"""docs/frontdoor.md shows the figures its benchmark runs recorded (the JSON files beside it)."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
import uuid
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from batchserve.batching.batcher import BatcherConfig
from batchserve.core.broker import INTERACTIVE_PACK
from batchserve.core.domain import QueueMessage

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "frontdoor.md").read_text()
PROSE = " ".join(DOC.split())
RUNS = ("frontdoor.json", "frontdoor-before.json")


def _run(name: str) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((ROOT / "docs" / name).read_text())
    return document


def _every_caller_answered(doc: dict[str, Any]) -> None:
    """Every caller of every run of alternating runs had its own answer, none refused."""
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] and not r["refused"]
        for run in doc["runs"]
        for r in run["results"]
    )


def _section(name: str) -> str:
    """The docs' text from the run's link to the next run's link or the next section."""
    starts = sorted(DOC.index(f"([{n}]({n}))") for n in RUNS)
    start = DOC.index(f"([{name}]({name}))")
    section_end = DOC.find("\n## ", start)
    later = [s for s in starts if s > start] + [section_end if section_end >= 0 else len(DOC)]
    return DOC[start : min(later)]


@pytest.mark.parametrize("name", RUNS)
def test_each_row_is_the_recorded_figure(name: str) -> None:
    run = _run(name)
    table = {}
    for line in _section(name).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 8 and cells[1] in run["paths"]:
            table[(float(cells[0]), cells[1])] = cells
    over = {(g["path"], g["offered_rps"]): g for g in run["goals"]["latency"]}
    assert len(table) == len(run["results"])
    for r in run["results"]:
        cells = table[(r["offered_rps"], r["path"])]
        assert int(cells[2]) == r["answered"] == r["sent"]  # every caller answered
        assert r["wrong"] == r["refused"] == r["errors"] == 0
        assert float(cells[3]) == r["p50_ms"] and float(cells[4]) == r["p99_ms"]
        assert float(cells[5]) == r["served_rps"]
        assert float(cells[6]) == round(sum(r["cpu_ms_per_request"].values()), 2)
        goal = over.get((r["path"], r["offered_rps"]))
        if goal is not None:
            p50, p99 = goal["p50_over_baseline_ms"], goal["p99_over_baseline_ms"]
            assert cells[7] == f"{p50:+.1f} / {p99:+.1f}"


def test_the_page_is_what_its_script_writes_from_the_runs() -> None:
    """Every table and verdict on the page comes from the recorded runs."""
    script = ROOT / "scripts" / "frontdoor_docs.py"
    written = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=True
    ).stdout
    assert written == DOC


def test_the_statement_costs_are_the_recorded_ones() -> None:
    """The README's "under a third of the CPU" (the page's table is the script's)."""
    doc = _run("frontdoor-statements.json")
    assert all(ratio < 1 / 3 for ratio in doc["pool_over_engine"].values())
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "at under a third of the CPU they cost through SQLAlchemy" in readme


def test_every_file_the_page_links_is_there() -> None:
    for name in re.findall(r"\]\(([\w.-]+\.(?:json|svg))\)", DOC):
        assert (ROOT / "docs" / name).is_file(), name


def test_the_pool_comparison_is_the_recorded_one() -> None:
    runs = _run("frontdoor-pool-ab.json")["runs"]

    def p50(overflow: int, path: str) -> list[float]:
        return [
            r["p50_ms"]
            for run in runs
            if run["api_db_max_overflow"] == overflow
            for r in run["results"]
            if r["path"] == path
        ]

    for path in ("longpoll", "sync"):
        fixed, churning = p50(0, path), p50(10, path)
        assert len(fixed) == len(churning) == 2
        assert max(fixed) < min(churning)  # the order held in every pair
        shown = f"{path} {fixed[0]} and {fixed[1]} against {churning[0]} and {churning[1]}"
        assert shown in PROSE
    assert re.search(r"\[frontdoor-pool-ab\.json\]", DOC)


def test_server_cpu_counts_each_process_between_two_readings() -> None:
    from batchserve.bench.stack import server_cpu_per

    before = {10: ("postgres", 1.0), 11: ("postgres", 2.0), 12: ("redis", 5.0)}
    # 11 exited (drops out), 13 started (counts from zero), RabbitMQ did nothing.
    after = {10: ("postgres", 1.5), 12: ("redis", 5.1), 13: ("postgres", 0.25)}
    spent = server_cpu_per(before, after, 100)
    assert spent == {"postgres": 7.5, "rabbitmq": 0.0, "redis": 1.0}
    assert server_cpu_per(before, after, 0) == {}


def test_the_busy_share_is_the_machines_cpu_between_two_readings() -> None:
    """The ingest steps' ``cores_busy``: this process spinning shows as busy CPU, the share
    never passes the whole machine, and no ticks between the readings is no figure."""
    import math
    import time

    from batchserve.bench.stack import busy_share, cores_busy

    before = cores_busy()
    assert 0 <= before[0] <= before[1]
    spin_until = time.process_time() + 0.3
    while time.process_time() < spin_until:
        pass
    share = busy_share(before, cores_busy())
    assert 0 < share <= 1
    assert busy_share((5.0, 10.0), (8.0, 14.0)) == 0.75
    assert math.isnan(busy_share(before, before))


def test_the_slot_is_busy_from_ten_percent_load_up() -> None:
    """The page's "the adaptive policy keeps the slot busy from 10 % load up": at each load of
    both overhead runs, batches of the mean size at the offered rate fill the slot's 100 ms
    batches back to back."""
    assert "keeps the slot busy from 10 % load up" in PROSE
    for name in ("frontdoor-overhead.json", "frontdoor-overhead-before.json"):
        for result in _run(name)["results"]:
            busy = result["offered_rps"] / result["mean_batch"] * 0.1
            assert busy >= 0.95, (name, result["load"], busy)


def test_the_api_flame_graphs_show_the_loop_it_ran_on() -> None:
    """The standard loop's own frames in the API's flame graph before, none now (uvloop's
    loop is compiled: py-spy sees no Python frames of it)."""
    before = (ROOT / "docs" / "profile-frontdoor-api-before.svg").read_text()
    now = (ROOT / "docs" / "profile-frontdoor-api.svg").read_text()
    assert "selector_events.py" in before and "selector_events.py" not in now


def test_uvloop_bought_nothing_measurable() -> None:
    """In every column of the alternating runs the two loops' figures overlap or lie within
    a tenth of each other: no difference the runs can tell."""
    runs = _run("frontdoor-uvloop-ab.json")["runs"]
    assert [r["loop"] for r in runs] == ["asyncio", "uvloop", "asyncio", "uvloop"]
    for rate in (100.0, 300.0):
        for path in ("longpoll", "sync"):
            api = {
                loop: [
                    x["cpu_ms_per_request"]["api"]
                    for r in runs
                    if r["loop"] == loop
                    for x in r["results"]
                    if x["offered_rps"] == rate and x["path"] == path
                ]
                for loop in ("asyncio", "uvloop")
            }
            low = min(max(api["asyncio"]), max(api["uvloop"]))
            high = max(min(api["asyncio"]), min(api["uvloop"]))
            assert high <= low * 1.1, (rate, path, api)


def test_the_collapse_past_the_knee_is_what_the_runs_show() -> None:
    """The page's "What is left": offered 300/s in the strict open loop the long-poll path
    served far less than the baseline while the synchronous one kept up and the roles used less
    than a core (the generator's own CPU is not measured); throttled by the old 256-connection
    generator it had kept up."""
    rows = {r["path"]: r for r in _run("frontdoor.json")["results"] if r["offered_rps"] == 300.0}
    base, longpoll, sync = rows["baseline"], rows["longpoll"], rows["sync"]
    assert longpoll["served_rps"] < 0.7 * base["served_rps"]
    assert sync["served_rps"] >= 0.95 * base["served_rps"]
    cores = sum(longpoll["cpu_ms_per_request"].values()) * longpoll["served_rps"] / 1000.0
    assert cores < 1.0
    capped = [
        r["served_rps"]
        for run in _run("frontdoor-uvloop-ab.json")["runs"]
        for r in run["results"]
        if r["path"] == "longpoll" and r["offered_rps"] == 300.0
    ]
    assert min(capped) >= 0.95 * base["served_rps"]
    assert "**The long-poll path collapses past its knee.**" in DOC


def test_packs_cut_the_ingest_latency_in_every_alternating_run() -> None:
    doc = json.loads((ROOT / "docs" / "frontdoor-packs-ab.json").read_text())
    runs = doc["ingest_runs"]
    assert [r["messages"] for r in runs] == ["packs", "one a request"] * 2
    for rate in (750.0, 1000.0):
        for measure in ("p50_ms", "p99_ms"):

            def figures(kind: str, rate: float = rate, measure: str = measure) -> list[float]:
                return [
                    next(s[measure] for s in r["steps"] if s["rate"] == rate)
                    for r in runs
                    if r["messages"] == kind
                ]

            assert max(figures("packs")) < min(figures("one a request")), (rate, measure)
    api = [
        next(s for s in r["steps"] if s["rate"] == 750.0)["cpu_ms_per_request"]["api"] for r in runs
    ]
    assert max(api) <= min(api) * 1.05  # the API's own CPU stayed the same
    for r in runs:  # p99 within 50 ms only up to 500/s
        assert [s["rate"] for s in r["steps"] if s["p99_ms"] <= 50.0] == [500.0]
    assert "every run with packs had a lower p50 and a lower p99" in PROSE
    assert "only up to 500/s of the rates tried" in PROSE


def test_the_seeds_deployment_is_what_the_page_says() -> None:
    doc = json.loads((ROOT / "docs" / "frontdoor-packs-ab.json").read_text())
    with_packs, without = doc["seeds"]["packs"], doc["seeds"]["one a request"]
    for run in (with_packs, without):
        assert run["workers"] == 4 and run["max_batch_size"] == 32
        by_path = {r["path"]: r for r in run["results"]}
        assert by_path["baseline"]["answered"] == by_path["baseline"]["sent"]
        assert all(r["refused"] == 0 and r["wrong"] == 0 for r in run["results"])
    served = [r["served_rps"] for r in with_packs["results"] if r["path"] != "baseline"]
    assert all(250 <= s <= 350 for s in served)  # "about 300/s"
    assert with_packs["api_publishes_timed_out"] == 0 < without["api_publishes_timed_out"]
    assert f"published {with_packs['published_by_maintenance']:,} requests" in PROSE
    assert f"packs of up to {INTERACTIVE_PACK} a message" in PROSE


def test_the_rerun_on_the_second_machine_did_not_collapse() -> None:
    rerun = json.loads((ROOT / "docs" / "frontdoor-rerun.json").read_text())
    at_300 = {r["path"]: r for r in rerun["results"] if r["offered_rps"] == 300.0}
    assert at_300["longpoll"]["served_rps"] >= 0.95 * at_300["baseline"]["served_rps"]
    assert all(r["answered"] == r["sent"] for r in rerun["results"])
    assert "did not collapse" in PROSE


def test_one_statement_each_shortened_both_hand_overs_in_every_pair() -> None:
    doc = json.loads((ROOT / "docs" / "frontdoor-store-ab.json").read_text())
    runs = doc["runs"]
    assert [r["store"] for r in runs] == ["one statement", "engine"] * 2
    assert doc["code"]["one statement"] != "PENDING"
    for load in (0.1, 0.3):
        for figure in (
            lambda r: r["breakdown"]["write_notify"]["p50_ms"],
            lambda r: r["breakdown"]["dispatch"]["p50_ms"],
            lambda r: r["cpu_ms_per_request"]["worker"],
            lambda r: r["cpu_ms_per_request"]["batcher"],
        ):
            by = {
                kind: [
                    figure(x)
                    for r in runs
                    if r["store"] == kind
                    for x in r["results"]
                    if x["load"] == load
                ]
                for kind in ("one statement", "engine")
            }
            assert max(by["one statement"]) < min(by["engine"]), (load, by)
    assert (
        "every run of one statement each was below every run of the engine's transactions in"
        " the write_notify stage, the dispatch stage, the worker's CPU a request and the"
        " batcher's CPU a request" in PROSE
    )


def test_the_head_runs_answered_everyone_and_are_judged_on_the_page() -> None:
    head = json.loads((ROOT / "docs" / "frontdoor-head.json").read_text())
    assert all(
        r["answered"] == r["sent"] and r["wrong"] == r["errors"] == 0 for r in head["results"]
    )
    served = head["goals"]["served_vs_ideal"]
    assert (served["longpoll"] >= 0.9 and served["sync"] >= 0.9) == (
        "the head served both paths past 0.90 of the ideal" in PROSE
    )
    assert "| 2. served through HTTP" in DOC and "| bac46b2 | head | verdict, head |" in DOC


def test_the_worker_at_the_head_writes_through_the_statements_pool() -> None:
    head = (ROOT / "docs" / "profile-frontdoor-worker-head.svg").read_text()
    now = (ROOT / "docs" / "profile-frontdoor-worker.svg").read_text()
    assert "_complete_in_one" in head and "greenlet_spawn" not in head
    assert "_write_outcomes_pg" in now and "greenlet_spawn" in now
    assert "worker's has no SQLAlchemy frame (`greenlet_spawn`) left" in PROSE


def test_the_shorter_lead_for_batches_with_room_was_not_kept() -> None:
    doc = json.loads((ROOT / "docs" / "frontdoor-lead-ab.json").read_text())
    for trial in doc["trials"]:
        by: dict[tuple[str, float], list[dict[str, Any]]] = {}
        for run in trial["runs"]:
            for r in run["results"]:
                by.setdefault((run["lead for batches with room"], r["load"]), []).append(r)
        for load in (0.1, 0.3):
            changed, kept = by[("changed", load)], by[("1 in 10 late", load)]
            dispatch = [r["breakdown"]["dispatch"]["p50_ms"] for r in changed]
            assert max(dispatch) < min(r["breakdown"]["dispatch"]["p50_ms"] for r in kept)
        assert min(r["live_p50_ms"] for r in by[("changed", 0.3)]) > max(
            r["live_p50_ms"] for r in by[("1 in 10 late", 0.3)]
        )
    assert "the live p50 at 30 % load was higher in every run with it" in PROSE
    assert not hasattr(BatcherConfig(), "pipeline_late_share_with_room")  # not committed


def test_a_second_api_process_gained_nothing_on_two_cores() -> None:
    """The section's title: four alternating runs, one process and two, and two were neither
    served more nor faster at 300 and 340/s in every run."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-processes-ab.json")
    assert [run["api_processes"] for run in doc["runs"]] == [1, 2, 1, 2]
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    verdict = frontdoor_docs.processes_verdict(doc)
    assert verdict["verdict"] == "It did not"
    assert "nothing gained on two cores" in DOC

    # "the collapse came back in one run of each kind"
    def collapsed(run: dict[str, Any]) -> bool:
        for r in run["results"]:
            offered, served = r["offered_rps"], r["served_rps"]
            if r["path"] == "longpoll" and offered >= 300 and served < 250:
                return True
            if r["path"] == "sync" and offered >= 200 and served < 0.85 * offered:
                return True
        return False

    for processes in (1, 2):
        runs = [collapsed(run) for run in doc["runs"] if run["api_processes"] == processes]
        assert runs.count(True) == 1, (processes, runs)


def test_answering_from_the_notification_cut_postgres_work_and_not_the_low_load_latency() -> None:
    """The section's reading of its four alternating runs: Postgres's CPU a request lower in
    every run with the change at 100/s and up on both paths; the p50 at 30 and 100/s (goal 1)
    not lower in every run on either path."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-notify-ab.json")
    answers = [run["poll_answer"] for run in doc["runs"]]
    assert answers == ["from the notification", "read"] * 2
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    lower = frontdoor_docs.notify_lower(doc)
    for path in ("longpoll", "sync"):
        for rate in (100, 200, 300):
            assert f"{path} at {rate}/s" in lower["Postgres's CPU a request"]
        for rate in (30, 100):
            assert f"{path} at {rate}/s" not in lower["p50"]
    assert "A waiting caller is answered from the results' notification" in DOC


def test_rows_as_one_document_cost_the_caller_less_and_did_not_move_the_front_door() -> None:
    """The section's reading: the JSON document cost the caller less than the arrays in both
    rounds for every statement measured; in the alternating frontdoor runs no figure was lower
    (or higher) in every run of one way; the API's CPU a request lay within 1.5-2.9 ms."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    encodings = _run("frontdoor-encodings.json")
    statements = {row["statement"] for row in encodings["rounds"]}
    assert {"admission of 1", "admission of 64", "results of 32"} <= statements
    verdict = frontdoor_docs.encodings_verdict(encodings)
    assert set(verdict["lower"].split(", ")) == statements
    lowest = frontdoor_docs.encodings_lowest(encodings)
    for statement in statements - {"admission of 1"}:  # a group: at most half the arrays' CPU
        json_cpu = lowest[(statement, "json")]["caller_cpu_ms"]
        assert json_cpu <= 0.5 * lowest[(statement, "arrays")]["caller_cpu_ms"]
    # "about a tenth of a millisecond or less"
    assert max(row["caller_cpu_ms"] for row in encodings["rounds"] if row["way"] == "json") < 0.12
    doc = _run("frontdoor-documents-ab.json")
    assert [run["rows_as"] for run in doc["runs"]] == ["arrays", "json"] * 3
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    assert all(not cases for cases in frontdoor_docs.documents_lower(doc).values())
    api = [r["cpu_ms_per_request"]["api"] for _, _, r in frontdoor_docs.documents_rows(doc)]
    assert min(api) >= 1.5 and max(api) <= 2.95
    assert "A group's rows travel as one JSON document" in DOC


def test_topics_moved_no_front_door_figure_past_the_counting_of_cpu() -> None:
    """The section's reading of its alternating runs: where one way's runs were all above the
    other's, the groups lie within the gap the page names (a few per cent at most)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-topics-ab.json")
    assert [run["events"] for run in doc["runs"]] == ["one channel", "topics"] * 3
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    gap = frontdoor_docs.topics_widest_gap(doc)
    assert gap < 0.03
    assert f"at most {100 * gap:.0f} %" in PROSE
    assert "Slots freed and cancellations travel on topics of their own" in DOC


def test_the_broker_section_reads_its_recorded_rounds() -> None:
    """The broker's CPU a message, as recorded: the summary is what the script makes of its
    rounds, the transient queue cost under half the quorum one at 100/s ("most of the broker's
    CPU ... is the message's durability"), and the quorum queue cost less a message at 1,000/s
    than at 100/s ("paid for each message alone, where at 1,000/s messages share it")."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_broker
    import frontdoor_docs

    doc = _run("frontdoor-broker.json")
    assert doc["summary"] == bench_broker.summarize(doc["rounds"])
    kinds = {(r["kind"], r["rate"]) for r in doc["rounds"]}
    assert kinds == {(k, rate) for k in bench_broker.KINDS for rate in (100.0, 1000.0)}
    assert all(r["messages"] == int(r["rate"] * 5) for r in doc["rounds"])
    median = frontdoor_docs.broker_median
    assert median(doc, "transient", 100.0) < 0.5 * median(doc, "quorum", 100.0)
    assert median(doc, "quorum", 1000.0) < median(doc, "quorum", 100.0)
    assert "What RabbitMQ spends a request's message" in DOC
    assert f"a median {median(doc, 'quorum', 100.0):g} ms of CPU a message" in PROSE


def test_marking_only_queued_requests_lowered_the_api_and_postgres_cpu() -> None:
    """The section's reading of its alternating runs: every run marking only queued requests
    spent less of the API's and of Postgres's CPU a request than every run marking all, on both
    paths, every caller answered with its own answer."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-marks-ab.json")
    assert [run["marks"] for run in doc["runs"]] == ["every request", "queued only"] * 3
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    lower = frontdoor_docs.marks_lower(doc)
    for figure in ("the API's CPU a request", "Postgres's CPU a request"):
        assert lower[figure] == [
            "lower with queued only: longpoll at 100/s",
            "lower with queued only: sync at 100/s",
        ]
    assert "A request is marked published only while it is still queued" in DOC


def test_single_submits_read_no_difference_from_marking_only_queued_requests() -> None:
    """The ingest runs' reading: the first two pairs kept 750/s within p99 50 ms only with the
    change, the last two neither way, and no run kept 1,000/s."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-marks-ingest-ab.json")
    assert [run["marks"] for run in doc["runs"]] == ["every request", "queued only"] * 4

    def ok_at_750(run: dict[str, Any]) -> bool:
        return next(s["ok"] for s in run["steps"] if s["rate"] == 750.0)

    assert [ok_at_750(run) for run in doc["runs"]] == [False, True] * 2 + [False, False] * 2
    assert not any(s["ok"] for run in doc["runs"] for s in run["steps"] if s["rate"] >= 1000)
    assert all(s["errors"] == 0 for run in doc["runs"] for s in run["steps"])
    verdict = frontdoor_docs.marks_ingest_verdict(doc)
    assert f"{verdict['best_old']}/s marking every request, {verdict['best_new']}/s" in PROSE
    assert "not a difference these runs show" in PROSE


def test_lean_routes_lowered_the_apis_cpu_on_both_paths() -> None:
    """The section's reading of its alternating runs: every lean run spent less of the API's CPU
    a request than every run through FastAPI's handler, on both paths and on single submits,
    every caller answered with its own answer; the route micro-benchmark agrees."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-lean-ab.json")
    assert [run["routes"] for run in doc["runs"]] == ["FastAPI's handler", "lean"] * 3
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    lower = frontdoor_docs.lean_lower(doc)
    assert lower["the API's CPU a request"] == [
        "lower with lean: longpoll at 100/s",
        "lower with lean: sync at 100/s",
    ]
    assert lower["p50"] == []  # the page says the runs overlap
    ingest = _run("frontdoor-lean-ingest-ab.json")
    assert [run["routes"] for run in ingest["runs"]] == ["FastAPI's handler", "lean"] * 3
    assert all(
        s["errors"] == 0 and s["refused"] == 0 for run in ingest["runs"] for s in run["steps"]
    )
    verdict = frontdoor_docs.lean_ingest_verdict(ingest)
    assert verdict["reading"] == "every lean run below every other"
    assert f"{verdict['api_new']} ms lean (every lean run below every other)" in PROSE
    routes = _run("frontdoor-routes.json")
    per_round = routes["us_a_request"]
    assert max(per_round["lean"]) < min(per_round["FastAPI's handler"])
    medians = routes["median_us"]
    plain_us, lean_us = medians["FastAPI's handler"], medians["lean"]
    assert (
        f"a median {plain_us:g} us of CPU a request through FastAPI's handler, {lean_us:g} us lean"
        in PROSE
    )
    assert "Routes resolve their parameters directly" in DOC


def test_a_long_poll_for_a_request_admitted_here_costs_one_transaction_fewer() -> None:
    """The section's figures: one Postgres transaction fewer a long-poll request over a run,
    every caller answered in every alternating run, and the CPU figures read as overlapping."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-unread-ab.json")
    assert [run["long_poll"] for run in doc["runs"]] == ["read first", "no first read"] * 3
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    runs = doc["transactions"]["runs"]
    longpolls = runs["no first read"]["answered"]["longpoll"]
    saved = runs["read first"]["transactions"] - runs["no first read"]["transactions"]
    assert 0.95 * longpolls <= saved <= 1.1 * longpolls
    lower = frontdoor_docs.unread_lower(doc)
    assert all(cases == [] for cases in lower.values())  # the page says they overlap
    assert "one statement fewer a long-poll" in PROSE
    assert "A long-poll for a request admitted here waits without reading it first" in DOC


def test_the_tuned_collector_took_under_a_fifth_of_the_apis_collection_time() -> None:
    """The section's runs: tuned, no full pass and under a fifth of the collection time of any
    run at the defaults, every submit accepted; the page's ranges are the runs'."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-gc-ab.json")
    assert [run["gc"] for run in doc["runs"]] == ["default", "tuned"] * 3
    steps = {
        way: [s for r in doc["runs"] if r["gc"] == way for s in r["steps"]]
        for way in ("default", "tuned")
    }
    assert all(s["accepted"] == s["sent"] and s["errors"] == 0 for ss in steps.values() for s in ss)
    slowest_tuned = max(s["api_gc"]["ms"] for s in steps["tuned"])
    assert slowest_tuned < 0.2 * min(s["api_gc"]["ms"] for s in steps["default"])
    assert all(s["api_gc"]["full"] == 0 for s in steps["tuned"])
    assert all(s["api_gc"]["full"] >= 1 for s in steps["default"])
    verdict = frontdoor_docs.gc_verdict(doc)
    assert f"tuned {verdict['collections_tuned']}, 0 full, {verdict['ms_tuned']} ms" in PROSE
    assert "The API's garbage collector" in DOC


def test_late_joiners_cut_the_low_load_gap_in_every_run_and_cost_cpu() -> None:
    """The section's reading of its six alternating runs: every request answered with its own
    answer; with late joiners some requests of every round rode in a batch sent before they
    arrived, the p50 gap to the baseline at 30/s was lower on both paths in every run and the
    goal's figure (the worst path at 30 and 100/s) lower in every run; the CPU was not lower."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-join-ab.json")
    assert [run["joiners"] for run in doc["runs"]] == ["no joiners", "late joiners"] * 3
    _every_caller_answered(doc)
    for run in doc["runs"]:
        for r in run["results"]:
            if run["joiners"] == "late joiners" and r["path"] != "baseline":
                assert r["joined"]["late"] > 0
    lower = frontdoor_docs.join_lower(doc)
    for path in ("longpoll", "sync"):
        assert f"lower with late joiners: {path} at 30/s" in lower["p50 over the baseline"]
    for figure in ("the batcher's CPU a request", "the worker's CPU a request"):
        assert not any(case.startswith("lower") for case in lower[figure])
    verdict = frontdoor_docs.join_verdict(doc)
    worst_new = [float(v) for v in verdict["new_p50"].split(", ")]
    worst_old = [float(v) for v in verdict["old_p50"].split(", ")]
    assert max(worst_new) < min(worst_old)
    assert min(worst_new) > 10.0  # goal 1 unmet, as the page says
    assert "Goal 1 (+10 ms at p50, +30 at p99) stays unmet" in PROSE


def test_with_late_joiners_the_lead_is_tuned_for_fewer_late_batches() -> None:
    """The default the section measured: 3 late batches in 100; with it the goal's p99 figure
    (worst path at 30 and 100/s) was lower in every run than with 1 in 10, and more joined."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    assert BatcherConfig().pipeline_late_share == 0.03
    doc = _run("frontdoor-lateshare-ab.json")
    assert [run["lead"] for run in doc["runs"]] == ["3 in 100 late", "1 in 10 late"] * 3
    assert all(
        r["answered"] == r["sent"] and not r["wrong"] for run in doc["runs"] for r in run["results"]
    )
    verdict = frontdoor_docs.join_verdict(doc, "lead", frontdoor_docs.LEAD_WAYS)
    fewer = [float(v) for v in verdict["new_p99"].split(", ")]
    more = [float(v) for v in verdict["old_p99"].split(", ")]
    assert max(fewer) < min(more)
    assert "the lead is now tuned for 3 late batches in 100" in PROSE


def test_publishing_the_batch_on_the_loop_cost_the_sender_less_in_every_round() -> None:
    """The hand-over's rounds: every round on the loop spent less of the sender's CPU a batch
    and sent faster than every round through send_task, and the page says so with its
    figures; the frontdoor runs alternate, every caller answered with its own answer, and the
    page reads them as overlapping where they do."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_dispatch
    import frontdoor_docs

    handover = _run("frontdoor-dispatch.json")
    assert handover["summary"] == bench_dispatch.summarize(handover["rounds"])
    rounds = handover["rounds"]

    def every(way: str, figure: str) -> list[float]:
        return [
            r["send_ms"]["p50"] if figure == "send" else r["cpu_ms_per_batch"]
            for r in rounds
            if r["way"] == way
        ]

    for figure in ("cpu", "send"):
        assert max(every("aio-pika", figure)) < min(every("send_task", figure))
    frontdoor = _run("frontdoor-dispatch-ab.json")
    verdict = frontdoor_docs.dispatch_verdict(handover, frontdoor)
    assert verdict["cpu_reading"] == verdict["send_reading"]
    assert verdict["cpu_reading"].startswith("every round on the loop below")
    assert (
        f"fell from {verdict['old_cpu']} ms to {verdict['new_cpu']} ms (medians; "
        f"{verdict['cpu_reading']})" in PROSE
    )
    assert 0 < int(verdict["share"]) < 10  # "a small saving"
    assert [run["dispatch"] for run in frontdoor["runs"]] == ["send_task", "aio-pika"] * 3
    _every_caller_answered(frontdoor)
    lower = frontdoor_docs.join_lower(frontdoor, "dispatch", frontdoor_docs.DISPATCH_WAYS)
    assert lower["p50 over the baseline"] == []  # "the runs overlap"
    assert "The batch task leaves on the batcher's own loop" in DOC


def test_announcing_the_slot_after_the_write_shortened_write_notify_in_every_run() -> None:
    """The section's reading of its eight alternating overhead runs: every run announcing after
    the write had a lower ``write_notify`` p50 than every run announcing beside it, at both
    loads, every request succeeded; the whole overhead spread by more than the difference."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-announce-ab.json")
    ways = ["beside the write", "after the write"]
    assert [run["announce"] for run in doc["runs"]] == ways * 4
    assert all(
        r["succeeded"] == r["accepted"] == r["sent"] for run in doc["runs"] for r in run["results"]
    )
    verdict = frontdoor_docs.announce_verdict(doc)
    assert (
        verdict["reading"] == "every run after the write below every run beside it, at both loads"
    )
    assert f"{verdict['new_10']} ms after the write against {verdict['old_10']} ms" in PROSE
    overhead = [
        r["overhead_p50_ms"] for run in doc["runs"] for r in run["results"] if r["load"] == 0.1
    ]
    write_notify = [
        r["breakdown"]["write_notify"]["p50_ms"] for run in doc["runs"] for r in run["results"]
    ]
    assert max(overhead) - min(overhead) > max(write_notify) - min(write_notify)


def test_the_three_changes_together_lowered_the_p99_gap_and_left_goal_one_unmet() -> None:
    """Three alternating runs before and with the session's three changes: every caller
    answered; the worst p99 gap lower in every run with them; the p50 goal met in no run."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-session-ab.json")
    assert [run["changes"] for run in doc["runs"]] == ["before them", "these three"] * 3
    _every_caller_answered(doc)
    # The page says the log change does not show in these runs: the roles log warnings only.
    from batchserve.bench.run import BenchOptions
    from batchserve.bench.stack import BenchDeployment

    assert {f.name: f.default for f in fields(BenchDeployment)}["log_level"] == "WARNING"
    assert {f.name: f.default for f in fields(BenchOptions)}["role_log_level"] == "WARNING"
    verdict = frontdoor_docs.together_verdict(doc)
    new, old = ([float(v) for v in verdict[k].split(", ")] for k in ("new_p99", "old_p99"))
    assert max(new) < min(old)
    assert min(float(v) for v in verdict["new_p50"].split(", ")) > 10.0
    assert (
        f"met in {verdict['p99_met']} of {verdict['runs']} runs with them and "
        f"{verdict['p99_met_old']} of {verdict['runs']} before them" in PROSE
    )


def test_a_lone_request_wakes_the_roles_far_more_than_a_loaded_one() -> None:
    """The wake-ups section: a request costs the roles several times the wake-ups and the CPU
    when it comes alone, and what one wake-up costs an empty process is a real share of it
    (the section's "far higher at low load", "each wake-up serving several requests" and the
    shares it prints)."""
    doc = _run("frontdoor-wakeups.json")
    roles = ("api", "batcher", "worker")
    lone = {k: sum(doc["lone"][r][k] for r in roles) for k in ("wakeups", "cpu_ms")}
    loaded = {k: sum(doc["loaded"][r][k] for r in roles) for k in ("wakeups", "cpu_ms")}
    assert lone["cpu_ms"] > 2 * loaded["cpu_ms"] and lone["wakeups"] > 2 * loaded["wakeups"]
    assert doc["loaded_answered"] >= 0.9 * doc["rate"] * 10
    bare = min(doc["bare_wakeup_cpu_ms"].values())
    for spent in (lone, loaded):
        assert spent["wakeups"] * bare >= 0.3 * spent["cpu_ms"]
    assert f"woke the API, the batcher and the worker {lone['wakeups']:.0f} times" in PROSE


def _wakeup_rounds(name: str, ways: tuple[str, ...]) -> tuple[Any, dict[str, Any]]:
    """The scripts' renderer and an alternating wake-ups A/B, its rounds checked whole: the
    ways in turn, three times, every loaded caller answered."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run(name)
    assert [run["way"] for run in doc["runs"]] == list(ways) * 3
    assert all(run["loaded_answered"] >= 0.9 * doc["rate"] * 10 for run in doc["runs"])
    return frontdoor_docs, doc


def _below(doc: dict[str, Any], phase: str, role: str, figure: str, after: str) -> bool:
    """Whether every round of ``after`` is below every round of the first way."""

    def of(way: str) -> list[float]:
        return [run[phase][role][figure] for run in doc["runs"] if run["way"] == way]

    return max(of(after)) < min(of(doc["runs"][0]["way"]))


def test_idle_maintenance_and_batcher_wake_less_than_before() -> None:
    """The idle section: maintenance's and the batcher's idle wake-ups and CPU with both
    changes were below those of every round before them (maintenance's already with its change
    alone), and the page prints the recorded spreads."""
    docs, doc = _wakeup_rounds("frontdoor-idle-ab.json", ("before", "maintenance", "both"))
    for figure in ("wakeups_a_s", "cpu_ms_a_s"):
        assert _below(doc, "idle", "batcher", figure, "both")
        assert _below(doc, "idle", "maintenance", figure, "maintenance")
        assert _below(doc, "idle", "maintenance", figure, "both")
    verdict = docs.idle_verdict(doc)
    assert (
        f"maintenance went from {verdict['maintenance_wakeups_before']} to "
        f"{verdict['maintenance_wakeups_after']} wake-ups a second" in PROSE
    )
    assert docs.idle_table(doc) in DOC


@pytest.mark.parametrize(
    ("name", "role", "ways", "section"),
    [
        ("frontdoor-loadboard-ab.json", "api", ("polling", "on read"), "loadboard"),
        ("frontdoor-rate-ab.json", "batcher", ("rate a change", "rate no change"), "rate"),
    ],
    ids=["the API reads the load board on admission", "the arrival rate alone no change"],
)
def test_a_lone_request_wakes_the_role_less_after_the_change(
    name: str, role: str, ways: tuple[str, str], section: str
) -> None:
    """The load board and arrival rate sections: in every round a lone request cost the role
    fewer wake-ups and less CPU than in any round before the change, and the page prints the
    recorded spreads."""
    docs, doc = _wakeup_rounds(name, ways)
    for figure in ("wakeups", "cpu_ms"):
        assert _below(doc, "lone", role, figure, ways[1])
    verdict = getattr(docs, f"{section}_verdict")(doc)
    assert (
        f"A lone request woke the {'API' if role == 'api' else role} "
        f"{verdict['lone_wakeups_before']} times before and "
        f"{verdict['lone_wakeups_after']} times after" in PROSE
    )
    assert getattr(docs, f"{section}_table")(doc) in DOC


def test_the_goals_today_answered_everyone_and_neither_run_collapsed_past_the_knee() -> None:
    """The section "on this page's machine again": both frontdoor runs answered every caller
    with its own answer, served both paths past 0.90 of the ideal at the top rate (no
    collapse), and their CPU a request at 100/s differs by less than the third the page says
    alternating runs of the same code move by."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    today, start = _run("frontdoor-today-head.json"), _run("frontdoor-today-start.json")
    for run in (today, start):
        assert all(
            r["answered"] == r["sent"] and r["wrong"] == r["errors"] == r["refused"] == 0
            for r in run["results"]
        )
        for path in ("longpoll", "sync"):
            assert frontdoor_docs.at(run, 340.0, path)["served_rps"] >= 0.9 * 320
    for path in ("longpoll", "sync"):
        now, was = (frontdoor_docs.roles_cpu(run, path) for run in (today, start))
        assert abs(now - was) < was / 3
    for name in ("frontdoor-ingest-today-head.json", "frontdoor-ingest-today-start.json"):
        assert all(step["errors"] == 0 for step in _run(name)["steps"])
    assert f"| {start['code']} | head | verdict, head |" in DOC
    verdict = frontdoor_docs.today_verdict(today, start)
    assert f"long-poll path served {verdict['longpoll_head']}/s" in PROSE
    assert "up to a third at 100/s in alternating runs of the same code" in PROSE


def test_the_load_boards_wait_for_redis_is_the_bound_the_page_gives() -> None:
    from batchserve.core.loadboard import LOAD_KEEPALIVE_S, READ_WAIT_S

    assert f"(`READ_WAIT_S`, {READ_WAIT_S * 1000:.0f} ms from the refresh's start" in PROSE
    assert f"older than the keep-alive ({LOAD_KEEPALIVE_S:g} s) refreshes it" in PROSE


def test_sealing_from_the_model_thread_and_waiting_for_the_write_shortened_the_slots_idle() -> None:
    """The section's claims from its three rounds of three ways: every caller answered; the
    slot's idle time between back-to-back batches fell with each change, by about a
    millisecond and a half at the median from the loop to both; goal 1's p50 met in no run."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-seal-ab.json")
    _every_caller_answered(doc)
    ways = frontdoor_docs.SEAL_WAYS
    assert [run["seal"] for run in doc["runs"]] == list(ways) * 3
    idle = {
        way: [
            r["slot_idle_ms"]["p50_ms"]
            for run in doc["runs"]
            if run["seal"] == way
            for r in run["results"]
            if r.get("slot_idle_ms")
        ]
        for way in ways
    }
    medians = [statistics.median(idle[way]) for way in ways]
    assert medians[0] > medians[1] > medians[2]
    assert medians[0] - medians[2] >= 1.2  # "about a millisecond and a half"
    low, high = min(idle[ways[2]]), max(idle[ways[2]])
    assert f"{low:g}-{high:g} ms from the thread with the wait" in PROSE
    gaps = [r["p50_ms"] - base["p50_ms"] for _, _, r, base in frontdoor_docs.join_rows(doc, "seal")]
    assert min(gaps) > 10.0  # goal 1's p50 still unmet


def test_the_token_log_in_one_script_call_cut_the_writer_and_the_workers_cpu_at_ingest() -> None:
    """The section's claims: in the write's own rounds every script round cost the writer
    less than every pipeline round, by about three quarters; live, the worker's CPU a
    request at both ingest rates was lower in every run with the script; the page prints the
    verdict its script computes."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_tokenlog_write
    import frontdoor_docs

    written, ways = _run("tokenlog-write.json"), _run("frontdoor-tokenlog-ab.json")
    assert written["summary"] == bench_tokenlog_write.summarize(written["rounds"])
    summary = {row["way"]: row for row in written["summary"]}
    old, new = summary["pipeline"], summary["script"]
    assert max(new["writer_us_per_entry"]) < min(old["writer_us_per_entry"])
    assert new["writer_median"] < old["writer_median"] / 3
    assert [run["written"] for run in ways["runs"]] == ["a pipeline", "one script call"] * 3
    for step in (step for run in ways["runs"] for step in run["ingest"]["steps"]):
        assert step["accepted"] == step["sent"] and step["errors"] == 0
    for rate in (750.0, 1000.0):
        worker = {
            way: [
                step["cpu_ms_per_request"]["worker"]
                for run in ways["runs"]
                if run["written"] == way
                for step in run["ingest"]["steps"]
                if step["rate"] == rate
            ]
            for way in ("a pipeline", "one script call")
        }
        assert max(worker["one script call"]) < min(worker["a pipeline"])
    verdict = frontdoor_docs.tokenlog_verdict(written, ways)
    assert "the worker's at ingest 750/s" in verdict["below"]
    said = f"every run as a pipeline: {verdict['below']}."
    assert " ".join(said.split()) in PROSE


def test_the_floor_section_says_what_its_runs_show() -> None:
    """The load generator's collector: running, it collected in every step; off (as the bench
    sends now), in none, and batchserve's own rounds ran with it off. The floors kept goal 3's
    p99 at 1,000/s in every round while batchserve's submit missed it in every round; two
    requests of the do-nothing FastAPI route cost more than goal 4's 1.0 ms at 100/s; the
    collecting run's pauses at 1,000/s are the ones quoted. The page prints the verdict its
    script computes."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc, collecting = _run("frontdoor-floor.json"), _run("frontdoor-floor-collecting.json")
    rounds = {run["round"] for run in doc["runs"]}
    assert len(rounds) >= 3
    for run in doc["runs"]:
        for step in run["steps"]:
            assert step["answered"] == step["sent"] and step["errors"] == 0
            if run["loadgen_gc"] == "off":
                assert step["loadgen_gc"]["collections"] == 0
            else:
                assert step["loadgen_gc"]["collections"] > 0
    assert {run["loadgen_gc"] for run in doc["runs"] if run["kind"] == "batchserve"} == {"off"}
    top = max(step["rate"] for run in doc["runs"] for step in run["steps"])
    for kind in ("asgi", "fastapi", "batchserve"):
        p99s = [s["p99_ms"] for s in frontdoor_docs.floor_steps(doc, kind, "off", top)]
        assert len(p99s) == len(rounds)
        if kind == "batchserve":
            assert min(p99s) > 50.0
        else:
            assert max(p99s) <= 50.0
    low = min(step["rate"] for run in doc["runs"] for step in run["steps"])
    fastapi = [s["server_cpu_ms"] for s in frontdoor_docs.floor_steps(doc, "fastapi", "off", low)]
    assert 2 * min(fastapi) > 1.0 > max(fastapi)
    paused = [
        s["loadgen_gc"]["longest_ms"]
        for s in frontdoor_docs.floor_steps(collecting, "batchserve", "tuned", 1000.0)
    ]
    assert max(paused) > 50.0
    verdict = frontdoor_docs.floor_verdict(doc, collecting)
    said = f"paused it for up to {verdict['bench_500']} ms at 500/s and {verdict['bench_1000']} ms"
    assert said in PROSE
    two = verdict["two_routes"]
    assert f"two requests of a FastAPI route that does nothing durable cost {two} ms" in PROSE


def test_the_carried_work_moved_no_figure_and_is_gone() -> None:
    """Three alternating rounds, every caller answered: no figure where every run of one way
    was below every run of the other, as the page says; and the change is reverted (a queue
    message carries no work)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-carry-ab.json")
    ways = [run["work"] for run in doc["runs"]]
    assert ways == [frontdoor_docs.CARRY_WAYS[1], frontdoor_docs.CARRY_WAYS[0]] * 3
    _every_caller_answered(doc)
    lower = frontdoor_docs.join_lower(doc, "work", frontdoor_docs.CARRY_WAYS)
    assert lower and not any(lower.values())
    assert "Nothing moved beyond the spread of the runs, so it was reverted" in PROSE
    assert "work" not in {f.name for f in fields(QueueMessage)}


def test_the_cores_section_says_what_its_rounds_show() -> None:
    """Single submits at 500-1,000/s: every request accepted; at 1,000/s the cores were nine
    tenths busy or more in every round, the API took the largest share of CPU a request of any
    process, and the only rounds within goal 3's p99 were the least busy ones; at 500/s the
    roles spent more a request than at 1,000/s. The page prints its script's verdict."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-ingest-cores.json")
    assert len(doc["runs"]) >= 3

    def at(rate: float) -> list[dict[str, Any]]:
        return [s for run in doc["runs"] for s in run["steps"] if s["rate"] == rate]

    for run in doc["runs"]:
        for step in run["steps"]:
            assert step["accepted"] == step["sent"] and step["refused"] == step["errors"] == 0
    top, low = at(1000.0), at(500.0)
    assert min(s["cores_busy"] for s in top) >= 0.9
    for step in top:
        api = step["cpu_ms_per_request"]["api"]
        others = {**step["cpu_ms_per_request"], **step["server_cpu_ms_per_request"]}
        others.pop("api")
        assert api > max(others.values()) and api > frontdoor_docs._loadgen_ms(step)
    within = [s for s in top if s["p99_ms"] <= 50.0]
    beyond = [s for s in top if s["p99_ms"] > 50.0]
    if within and beyond:
        assert max(s["cores_busy"] for s in within) <= min(s["cores_busy"] for s in beyond)

    def roles(step: dict[str, Any]) -> float:
        return sum(step["cpu_ms_per_request"].values())

    assert min(roles(s) for s in low) > max(roles(s) for s in top)
    verdict = frontdoor_docs.cores_verdict(doc)
    said = f"two cores were {verdict['busy_top']} busy while the step sent"
    assert said in PROSE
    assert f"within 50 ms in {verdict['within_top']} of {verdict['rounds']} rounds" in PROSE


def test_a_line_a_group_cost_the_api_less_in_every_round() -> None:
    """Alternating rounds at 1,000/s with the roles at INFO, every request accepted: every run
    with a line a group spent less of the API's CPU a submit than every run with a line each,
    as the page says; and the API logs a group's admissions on one line now."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-lines-ab.json")
    assert "--role-log-level INFO" in doc["command"]
    each, group = (
        [
            s["cpu_ms_per_request"]["api"]
            for run in doc["runs"]
            if run["lines"] == way
            for s in run["steps"]
            if s["accepted"] == s["sent"]
        ]
        for way in frontdoor_docs.LINES_WAYS
    )
    assert len(each) == len(group) >= 3
    assert max(group) < min(each)
    verdict = frontdoor_docs.lines_verdict(doc)
    each_said, group_said = verdict["each_api"], verdict["group_api"]
    assert f"{each_said} ms with a line each, {group_said} ms with a line a group" in PROSE
    source = (ROOT / "batchserve" / "api" / "group_commit.py").read_text()
    assert '"requests_accepted"' in source and '"request_accepted"' not in source


def test_the_running_notification_beside_the_hand_over_moved_nothing_and_is_gone() -> None:
    """Two alternating rounds: every request succeeded; at 2 % load the dispatch stage a few
    tenths lower with the notification beside the hand-over within each round, less than the
    rounds moved between them; at 30 % load neither way below the other in every round. The
    claim still awaits its notification (the change was not kept)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-running-ab.json")
    awaited_way, sent_way = frontdoor_docs.RUNNING_WAYS
    assert [run["running"] for run in doc["runs"]] == [awaited_way, sent_way] * 2
    for run in doc["runs"]:
        for row in run["results"]:
            assert row["succeeded"] == row["accepted"] and row["refused"] == row["errors"] == 0

    def dispatch(way: str, load: float) -> list[float]:
        rows = frontdoor_docs.running_rows(doc, way, load)
        return [r["breakdown"]["dispatch"]["p50_ms"] for r in rows]

    awaited, sent = dispatch(awaited_way, 0.02), dispatch(sent_way, 0.02)
    gaps = [a - s for a, s in zip(awaited, sent, strict=True)]
    assert all(0 < gap < 0.5 for gap in gaps)
    assert max(awaited) - min(awaited) > max(gaps)  # the rounds moved more
    awaited, sent = dispatch(awaited_way, 0.3), dispatch(sent_way, 0.3)
    assert not (max(awaited) < min(sent) or max(sent) < min(awaited))
    verdict = frontdoor_docs.running_verdict(doc)
    assert f"the dispatch stage was {verdict['low_sent']} ms with the notification" in PROSE
    source = (ROOT / "batchserve" / "core" / "store" / "batches.py").read_text()
    assert "await self._emit(\n                S.RUNNING, [c.id for c in claimed]" in source


def test_granian_cost_more_cpu_than_uvicorn_in_every_round_and_the_api_stays_on_uvicorn() -> None:
    """Three rounds of the two floors under each server: every round under granian cost the
    server more CPU a request than every round under uvicorn, for both apps at both rates,
    every request answered; the page says so with its script's figures, and the API still
    serves through uvicorn."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-servers.json")
    assert len({run["round"] for run in doc["runs"]}) >= 3
    assert {run["server"] for run in doc["runs"]} == set(frontdoor_docs.HTTP_SERVERS)
    rates = {step["rate"] for run in doc["runs"] for step in run["steps"]}
    assert rates == {100.0, 1000.0}
    for run in doc["runs"]:
        for step in run["steps"]:
            assert step["answered"] == step["sent"] and step["errors"] == 0
    for kind in frontdoor_docs.FLOOR_APPS:
        for rate in rates:
            granian = frontdoor_docs.http_server_cpu(doc, "granian", kind, rate)
            uvicorn = frontdoor_docs.http_server_cpu(doc, "uvicorn", kind, rate)
            assert len(granian) == len(uvicorn) >= 3
            assert min(granian) > max(uvicorn)
    verdict = frontdoor_docs.granian_verdict(doc)
    assert verdict["dearer"] == "each"
    said = f"at 1,000/s {verdict['granian_asgi']} ms against {verdict['uvicorn_asgi']} for the bare"
    assert said in PROSE
    server = (ROOT / "batchserve" / "api" / "server.py").read_text()
    assert "uvicorn.Server(server_config(" in server and "granian" not in server


def test_the_embedded_mode_spent_more_and_answered_later_than_the_full_stack(
    tmp_path: Path,
) -> None:
    """Every request of every round answered; at 30 and 100/s the embedded process spent more
    CPU a request, and answered later at p50, than the full stack's four roles on its long-poll
    path in the run the page compares with, and at 200/s it fell behind where the full stack
    kept up (the code of 8ef257c: its store then went through aiosqlite's threads; the next
    test has the change). The embedded mode is the store of settings without servers."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    from batchserve.core.db import create_engine
    from batchserve.core.settings import Settings

    doc, full = _run("frontdoor-embedded.json"), _run("frontdoor-today-head.json")
    assert len(doc["runs"]) >= 2
    for run in doc["runs"]:
        assert {step["rate"] for step in run["steps"]} == {30.0, 100.0, 200.0}
        for step in run["steps"]:
            assert step["answered"] == step["sent"] > 0
    for rate in (30.0, 100.0):
        steps = [s for run in doc["runs"] for s in run["steps"] if s["rate"] == rate]
        row = frontdoor_docs.full_stack_longpoll(full, rate)
        assert min(s["cpu_ms_per_request"] for s in steps) > sum(row["cpu_ms_per_request"].values())
        assert min(s["p50_ms"] for s in steps) > row["p50_ms"]
    behind = [s["p50_ms"] for run in doc["runs"] for s in run["steps"] if s["rate"] == 200.0]
    row = frontdoor_docs.full_stack_longpoll(full, 200.0)
    assert min(behind) > 1000.0 and row["served_rps"] >= 0.9 * 200 and row["p50_ms"] < 250
    verdict = frontdoor_docs.embedded_verdict(doc, full)
    assert f"spent {verdict['cpu_30']} ms of CPU a request" in PROSE
    embedded = Settings(database_url=None, broker_url=None, redis_url=None, home=tmp_path)
    assert embedded.embedded
    engine = create_engine(embedded.effective_database_url)
    assert engine.dialect.driver == "aiosqlite"


async def test_the_embedded_store_on_the_loops_thread_answered_sooner_and_spent_less(
    tmp_path: Path,
) -> None:
    """Alternating rounds of the same measuring script, every request answered: every run with
    the store's calls on the loop's thread came out below every run with aiosqlite's threads in
    each rate's p50, p99 and CPU a request and in a lone request's time to its answer, as the
    page says; its submit's round trip did not get shorter, as it says too. And the embedded
    settings' store is the inline one now: its statements run on the caller's thread."""
    import threading

    from sqlalchemy import text

    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    from batchserve.core.db import create_engine, transaction
    from batchserve.core.settings import Settings
    from batchserve.core.sqlite import InlineConnection

    doc = _run("frontdoor-embedded-ab.json")
    ways = frontdoor_docs.INLINE_WAYS
    assert [sum(1 for r in doc["runs"] if r["way"] == way) for way in ways] == [3, 3]
    for run in doc["runs"]:
        assert {s["rate"] for s in run["steps"]} == set(frontdoor_docs.INLINE_RATES)
        assert all(s["answered"] == s["sent"] > 0 for s in run["steps"])
    lower = dict(
        (label, frontdoor_docs.every_run_lower(doc, ways, read))
        for label, read in frontdoor_docs.inline_rows()
    )
    assert [label for label, is_lower in lower.items() if not is_lower] == [
        "a lone request: the submit's round trip, ms"
    ]
    verdict = frontdoor_docs.inline_verdict(doc)
    assert f"At 100/s the p50 went from {verdict['threads_p50_ms_100']} to" in PROSE
    assert "its submit's round trip did not get shorter" in PROSE
    embedded = Settings(database_url=None, broker_url=None, redis_url=None, home=tmp_path)
    engine = create_engine(embedded.effective_database_url)
    try:
        async with transaction(engine) as conn:
            driver = (await conn.get_raw_connection()).driver_connection
            assert isinstance(driver, InlineConnection)
            driver._conn.create_function("thread", 0, threading.get_ident)
            assert (await conn.execute(text("SELECT thread()"))).scalar_one() == (
                threading.get_ident()
            )
    finally:
        await engine.dispose()


def test_a_batch_job_beside_the_inline_store_held_its_callers_up_no_longer() -> None:
    """Alternating rounds of a 10,000-line job with lone requests beside it: every job completed
    with every line; the job's time and the callers' p50 within a few percent either way, and
    the longest wait beside it shorter inline in every round, as the page says."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-embedded-job.json")
    ways = frontdoor_docs.INLINE_WAYS
    jobs = {way: [run["job"] for run in doc["runs"] if run["way"] == way] for way in ways}
    assert [len(jobs[way]) for way in ways] == [2, 2]
    for job in jobs[ways[0]] + jobs[ways[1]]:
        assert job["status"] == "completed"
        assert job["request_counts"] == {"total": 10000, "completed": 10000, "failed": 0}
    for key in ("job_s", "lone_p50_ms"):
        threads, inline = ([job[key] for job in jobs[way]] for way in ways)
        assert max(inline) <= 1.02 * max(threads) and min(inline) >= 0.98 * min(threads)
    threads_max, inline_max = ([job["lone_max_ms"] for job in jobs[way]] for way in ways)
    assert max(inline_max) < min(threads_max)
    verdict = frontdoor_docs.job_verdict(doc)
    said = f"at the longest {verdict['threads_lone_max_ms']} and {verdict['inline_lone_max_ms']} ms"
    assert said in PROSE


def test_the_goals_for_the_embedded_mode_are_judged_from_its_rounds() -> None:
    """The embedded process and the baseline, every caller of every path answered with its own
    answer: goals 1, 2 and 4 are missed in every round, as the page's table says, and it
    served less than the full stack's run it is set beside."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc, full = _run("frontdoor-embedded-goals.json"), _run("frontdoor-today-head.json")
    assert len(doc["runs"]) >= 2
    _every_caller_answered(doc)
    for run in doc["runs"]:
        assert {r["path"] for r in run["results"]} == {"baseline", "longpoll", "sync"}
        p50, _ = frontdoor_docs.worst_gap(run)
        assert p50 > 10.0
        served = run["goals"]["served_vs_ideal"]
        best = max(served["longpoll"], served["sync"])
        assert best < 0.90 and best < min(full["goals"]["served_vs_ideal"].values())
        assert frontdoor_docs.roles_cpu(run, "longpoll") > 1.0
    verdict = frontdoor_docs.embedded_goals_verdict(doc, full)
    assert verdict["goal_1"] == verdict["goal_2"] == verdict["goal_4"] == "**not met**"
    row = f"| +{verdict['p50_gap']} / +{verdict['p99_gap']} ms | +{verdict['full_p50_gap']}"
    assert row in DOC


def test_carrying_the_requests_in_sqlites_results_notification_cut_the_embedded_cpu() -> None:
    """Alternating rounds, every caller of every path answered with its own answer: every run
    with the requests carried spent less of the embedded process's CPU a request, on both
    paths at 30 and 100/s, and answered sooner at p50, than every run where each caller read
    its own, as the page says; p99 not in every run, and a lone request's end to its answer
    overlapping, as it says too."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-embedded-readback.json")
    ways = frontdoor_docs.READBACK_WAYS
    rates = frontdoor_docs._runs_of(doc, "rate_runs")
    _every_caller_answered(rates)
    for kind, rounds in (("lone_runs", 3), ("rate_runs", 2)):
        assert [sum(1 for r in doc[kind] if r["way"] == way) for way in ways] == [rounds] * 2
    lower = {
        label
        for label, read in frontdoor_docs.readback_rate_rows()
        if frontdoor_docs.every_run_lower(rates, ways, read)
    }
    for rate in (30, 100):
        for path in ("longpoll", "sync"):
            assert f"{rate}/s, {path}: CPU ms a request" in lower
            assert f"{rate}/s, {path}: p50 ms" in lower
    assert "100/s, longpoll: p99 ms" not in lower
    lone = frontdoor_docs._runs_of(doc, "lone_runs")
    end = frontdoor_docs.lone_span("end_to_answer")
    assert not frontdoor_docs.every_run_lower(lone, ways, end)
    verdict = frontdoor_docs.readback_verdict(doc)
    said = (
        f"at 30/s went from {verdict['read_cpu_longpoll_30']} to "
        f"{verdict['carried_cpu_longpoll_30']} ms on the long-poll path"
    )
    assert said in PROSE and "(the rounds overlap)" in PROSE


def test_the_embedded_collector_tuned_as_the_roles_cut_its_p99_in_every_round() -> None:
    """Alternating rounds, every caller of every path answered with its own answer: every run
    with the embedded process's collector tuned had a lower p50 and p99 on both paths at 100
    and 200/s than every run at CPython's defaults, as the page says; its CPU not in every
    pair, as it says too."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-embedded-gc.json")
    ways = frontdoor_docs.EMBEDDED_GC_WAYS
    _every_caller_answered(doc)
    assert [sum(1 for r in doc["runs"] if r["way"] == way) for way in ways] == [2, 2]
    rows = frontdoor_docs.rate_rows(frontdoor_docs.EMBEDDED_GC_RATES)
    lower = {label for label, read in rows if frontdoor_docs.every_run_lower(doc, ways, read)}
    for rate in (100, 200):
        for path in ("longpoll", "sync"):
            assert {f"{rate}/s, {path}: p50 ms", f"{rate}/s, {path}: p99 ms"} <= lower
    assert "100/s, longpoll: CPU ms a request" not in lower
    verdict = frontdoor_docs.embedded_gc_verdict(doc)
    said = (
        f"At 100/s the p99 went from {verdict['defaults_p99_ms_longpoll_100']} to "
        f"{verdict['tuned_p99_ms_longpoll_100']} ms on the long-poll path"
    )
    assert said in PROSE


def test_the_apis_offers_lowered_the_worst_p50_gap_in_every_run_and_left_goal_one_unmet() -> None:
    """Alternating runs with and without the API's late-joiner offers, every caller answered:
    the worst path's p50 gap at 30 and 100/s lower in every run with them, the mean gap
    lower at both rates, as the page says; goal 1's p50 still unmet. The first version's runs
    are read the same way."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc, first = _run("frontdoor-api-joins-ab.json"), _run("frontdoor-api-joins-first-ab.json")
    for runs in (doc, first):
        assert [run["offers"] for run in runs["runs"]] == list(
            reversed(frontdoor_docs.API_JOIN_WAYS)
        ) * (len(runs["runs"]) // 2)
        _every_caller_answered(runs)
    verdict = frontdoor_docs.api_joins_verdict(doc, first)
    new, old = ([float(v) for v in verdict[k].split(", ")] for k in ("new_p50", "old_p50"))
    assert all(n < o for n, o in zip(new, old, strict=True))
    assert "lower in every run" in PROSE
    for rate in ("30", "100"):
        assert float(verdict[f"new_mean_{rate}"]) < float(verdict[f"old_mean_{rate}"])
    assert float(verdict["first_new_mean_100"]) < float(verdict["first_old_mean_100"])
    assert float(verdict["first_new_mean_30"]) > float(verdict["first_old_mean_30"])
    assert min(new) > 10.0 and "Goal 1's p50 (+10 ms) is still unmet" in PROSE
    said = (
        f"the mean p50 gap went from {verdict['old_mean_30']} to {verdict['new_mean_30']} ms "
        f"at 30/s and from {verdict['old_mean_100']} to {verdict['new_mean_100']} ms at 100/s"
    )
    assert said in PROSE


async def test_a_box_past_its_expected_start_was_left_alone_and_that_was_reverted() -> None:
    """The "not kept" runs: with boxes past their batch's expected start skipped, the
    long-poll p50 at 100/s was higher in every run and fewer requests joined late, as the page
    says; and the API offers to such a box again (the revert)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    from batchserve.api.joiners import JoinOffers
    from batchserve.core.domain import BatchJoinable
    from batchserve.core.events import MemoryEventBus
    from batchserve.core.joins import MemoryJoinBox
    from tests.support.stepped import command

    doc = _run("frontdoor-api-joins-skip-ab.json")
    _every_caller_answered(doc)
    lower = frontdoor_docs.join_lower(
        doc, "offers", frontdoor_docs.SKIP_WAYS, frontdoor_docs.API_JOIN_FIGURES
    )
    assert "higher with skipped past its start: longpoll at 100/s" in lower["p50 over the baseline"]
    verdict = frontdoor_docs.skip_verdict(doc)
    assert int(verdict["new_late"].split("-")[1]) < int(verdict["old_late"].split("-")[0])
    assert "Reverted: the API offers to a box until it refuses." in PROSE

    events, joins, now = MemoryEventBus(), MemoryJoinBox(), [1000.0]
    api = JoinOffers(joins, events, lambda: now[0])
    api.start()
    await events.publish(
        BatchJoinable(
            model="m", batch_id=str(uuid.uuid4()), room=4, starts_by=999.9, ends_by=1000.1
        )
    )
    made = command("x", model="m", now=now[0])
    assert await api.offer([made])  # past its expected start, before its end: offered
    await api.close()


def test_fewer_requests_miss_the_batch_ahead_with_the_offer_sent_with_the_commit() -> None:
    """The page's "Kept": at 100/s, on both paths, every run with the offer sent with the
    commit counted fewer requests that missed the batch ahead than every run without."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-offer-commit-ab.json")
    _every_caller_answered(doc)
    lower = frontdoor_docs.join_lower(
        doc, "offer", frontdoor_docs.OFFER_WAYS, frontdoor_docs.OFFER_FIGURES
    )
    assert lower["the requests that missed the batch ahead"] == [
        f"lower with offered with the commit: {path} at 100/s" for path in ("longpoll", "sync")
    ]
    assert "Kept: fewer requests wait a batch more, in every run at 100/s on both paths." in PROSE


def test_fewer_requests_miss_the_batch_ahead_with_the_batch_announced_once_claimed() -> None:
    """The page's "Kept": the probe found fewer requests the API never offered to the box of
    the batch they missed, and at 100/s, on both paths, the change's runs had fewer that
    missed the batch ahead on average, fewer than the run before them in most pairs; those
    that still missed came closer to the start on the long-poll path in every run."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-announce-claimed-ab.json")
    _every_caller_answered(doc)
    before, after = doc["probe"]["before"], doc["probe"]["after"]
    assert after["never"] < before["never"] and after["missed"] < before["missed"]
    assert after["first_offer"] < before["first_offer"]
    verdict = frontdoor_docs.claimed_verdict(doc)
    for path in ("longpoll", "sync"):
        assert int(verdict[f"new_{path}_mean"]) < int(verdict[f"old_{path}_mean"])
        assert int(verdict[f"fewer_{path}"]) > int(verdict["runs"]) // 2
    lower = frontdoor_docs.join_lower(
        doc, "announce", frontdoor_docs.CLAIMED_WAYS, frontdoor_docs.CLAIMED_FIGURES
    )
    came = "how long before its start a request that missed the batch ahead came, p50"
    assert "lower with announced once claimed: longpoll at 100/s" in lower[came]
    assert "Kept: the probe shows the mechanism" in PROSE


def test_goals_2b_and_3_on_the_intel_xeon_are_out_of_reach_as_the_page_says() -> None:
    """No seeds' run served either path, the API's accept queue overflowed where the
    baseline's never did, every unanswered caller's connection was reset (none refused, no
    answer wrong); no single submits' step kept p99 within 50 ms."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-edge-xeon.json")
    assert "Xeon" in doc["machine_note"]
    for run in doc["seeds_runs"]:
        assert run["workers"] == 4 and run["max_batch_size"] == 32
        for r in run["results"]:
            assert not r["refused"] and not r["wrong"]
            assert r["sent"] - r["answered"] == r["errors"] == r["tcp"]["resets"]
            overflows = r["tcp"]["listen_overflows"]
            assert overflows == 0 if r["path"] == "baseline" else overflows > 0
    verdict = frontdoor_docs.edge_verdict(doc)
    assert verdict["served"] == verdict["within_750"] == verdict["within_1000"] == "0"
    assert "goals 2b and 3 are out of reach" in PROSE


def test_the_joiners_claim_after_a_wait_clears_the_answers_of_the_batch_before() -> None:
    """The page's "Kept": in the probe the claim overlapped most results statements before
    the change and none with it, which then ran shorter, and the notification and the median
    answer came sooner; in most pairs at each rate the change's run answered sooner after the
    model than the run before it, its mean lower, while the p50 and p99 over the baseline and
    the roles' CPU overlapped."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-claim-delay-ab.json")
    _every_caller_answered(doc)
    before, after = doc["probe"]["before"], doc["probe"]["after"]
    assert before["beside_claim"] > before["batches"] // 2 and after["beside_claim"] == 0
    assert after["claim_begins"] > after["results_back"] and before["claim_begins"] < 2.0
    assert before["results_round_trip_beside_claim"] > before["results_round_trip_alone"]
    for step in ("results_round_trip", "published", "api_heard", "answered"):
        assert after[step] < before[step], step
    verdict = frontdoor_docs.delay_verdict(doc)
    for rate in (30, 100):
        sooner, of = (int(n) for n in verdict[f"sooner_{rate}"].split(" of "))
        assert sooner > of // 2
        assert float(verdict[f"new_after_{rate}"]) < float(verdict[f"old_after_{rate}"])
    lower = frontdoor_docs.join_lower(
        doc, "claim", frontdoor_docs.DELAY_WAYS, frontdoor_docs.DELAY_FIGURES
    )
    for figure in ("p50 over the baseline", "p99 over the baseline", "the roles' CPU a request"):
        assert lower[figure] == [], figure
    assert "Kept: the probe shows the mechanism and the runs lean its" in PROSE


def test_after_the_model_batchserve_answers_later_than_the_baseline_in_every_round() -> None:
    """The page's split of goal 1's gap: in every round batchserve's callers had their answers
    later after their batch's model than the baseline's (the same run and rate), every caller
    answered; and 30 s rounds did not bring every run's worst p50 within +10 ms."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-goal1-rounds.json")
    _every_caller_answered(doc)
    rows = frontdoor_docs.join_rows(doc, "rounds")
    assert {way for _, way, _, _ in rows} == {"10 s", "30 s"}
    for _, _, r, base in rows:
        assert r["after_model_ms"]["of"] == r["answered"]
        assert frontdoor_docs.after_model(r) - frontdoor_docs.after_model(base) >= 3.0
    assert max(frontdoor_docs.worst_gaps(doc, "30 s")) > 10.0
    assert "Rounds three times as long did not bring the p50 within +10 ms" in PROSE
    hops = doc["hops"]["after_model_end_ms_p50"]
    path = [
        "results statement sent",
        "results statement back",
        "the API has woken its waiters",
        "the batch's first caller has its answer",
        "the batch's median caller has its answer",
    ]
    assert [hops[step] for step in path] == sorted(hops[step] for step in path)


def test_results_heard_from_postgres_were_at_most_a_millisecond_sooner_and_not_kept() -> None:
    """Alternating runs with a batch's results also told on Postgres: in the first three pairs
    no figure of latency lower with it in every run; in the four pairs after, its answers
    sooner in most comparisons, by a millisecond at most (the long-poll path at 100/s) and a
    few tenths or less elsewhere, and the roles' CPU higher in most comparisons at 30/s."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-results-feed-ab.json")
    _every_caller_answered(doc)
    lower = frontdoor_docs.join_lower(
        doc, "results_heard", frontdoor_docs.FEED_WAYS, frontdoor_docs.FEED_FIGURES
    )
    for figure in ("answered after the model, p50", "p50 over the baseline"):
        assert lower[figure] == []
    assert not any(case.startswith("lower") for cases in lower.values() for case in cases)

    pairs = _run("frontdoor-results-feed-pairs.json")
    _every_caller_answered(pairs)
    assert [run["results_heard"] for run in pairs["runs"]] == list(frontdoor_docs.FEED_WAYS) * 4
    after = frontdoor_docs.paired(pairs, frontdoor_docs.after_model)
    medians = {name: statistics.median(gains) for name, gains in after.items()}
    assert max(medians, key=lambda name: medians[name]) == "longpoll at 100/s"
    assert 0 < medians["longpoll at 100/s"] <= 1.2
    assert all(m < 0.5 for name, m in medians.items() if name != "longpoll at 100/s")
    # less than runs of the same code move from one to the next
    alone = [
        frontdoor_docs.after_model(r)
        for run in pairs["runs"]
        if run["results_heard"] == "from Redis alone"
        for r in run["results"]
        if r["path"] == "longpoll" and r["offered_rps"] == 100.0
    ]
    assert max(alone) - min(alone) > medians["longpoll at 100/s"]
    roles = frontdoor_docs.paired(pairs, lambda r: sum(r["cpu_ms_per_request"].values()))
    light = [d for name, ds in roles.items() if name.endswith(" at 30/s") for d in ds]
    assert sum(d < 0 for d in light) > len(light) / 2  # without it less: higher with it
    assert "Not kept: the callers had their answers at most about a millisecond sooner" in PROSE


def test_goals_2b_and_3_at_the_head_are_what_the_page_says() -> None:
    """Every caller of every seeds' run answered, none refused, no listen overflow, yet not
    every run served both paths; single submits within 50 ms at 750/s in every run and at
    1,000/s in some runs and not all."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import frontdoor_docs

    doc = _run("frontdoor-edge.json")
    for run in doc["seeds_runs"]:
        assert run["workers"] == 4 and run["max_batch_size"] == 32
        for r in run["results"]:
            assert r["answered"] == r["sent"] and not r["refused"] and not r["wrong"]
            assert r["tcp"]["listen_overflows"] == 0
    verdict = frontdoor_docs.edge_verdict(doc)
    runs = len(doc["ingest_runs"])
    assert int(verdict["served"]) < len(doc["seeds_runs"])
    assert int(verdict["within_750"]) == runs and 0 < int(verdict["within_1000"]) < runs
    assert {step["rate"] for run in doc["ingest_runs"] for step in run["steps"]} == {750, 1000}
    assert "goal 3 stands at the edge" in PROSE and "goal 2b stays short of it" in PROSE
