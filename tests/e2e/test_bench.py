"""Each ``batchserve bench`` scenario, run tiny against its own deployment: the JSON it prints
has every figure, and the figures are sane (not fast: timing is the benchmark's business)."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from batchserve.bench.client import AIPERF
from batchserve.bench.command import bench as bench_command
from batchserve.bench.drain import _BatchRow, drain_figures
from tests.support import servers
from tests.support.processes import running, signalled_mid_run

TINY = {
    "saturation": ["--variants", "adaptive,nobatch", "--backlog-s", "2", "--duration", "2"],
    "overhead": ["--variants", "adaptive", "--duration", "2", "--loads", "0.1"],
    "ingest": ["--rates", "40,80", "--step-s", "1"],
    "bulk": ["--requests", "600"],
    "mixed": ["--duration", "2", "--rate", "10"],
    "streaming": ["--stream-models", "echo-100ms:48", "--concurrency", "8", "--pairs", "1"],
    "frontdoor": ["--frontdoor-rates", "20", "--duration", "1.5"],
}


# `batchserve bench` as `batchserve` adds it when the command runs (batchserve.cli.main._TOOLS).
CLI = typer.Typer()
CLI.command("bench")(bench_command)


@CLI.callback()
def _batchserve() -> None:
    """batchserve, with its bench command."""


def bench(scenario: str, run_id: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    """``batchserve bench`` in this process (its deployment's roles fork from this process's
    warm template, as the other tests' do: a bench in a process of its own paid ~6 CPU-s of
    imports and a template of its own), as the command line would run it."""
    env = {
        "BATCHSERVE_DATABASE_URL": servers.pg_url(f"{servers.DB_PREFIX}{run_id}"),
        "BATCHSERVE_BROKER_URL": servers.BROKER_URL,
        "BATCHSERVE_REDIS_URL": servers.REDIS_URL,
    }
    plot = tmp_path / f"{scenario}.png"
    command = ["bench", "--scenario", scenario, *TINY[scenario], *extra]
    command += ["--workers", "1", "--batch", "8", "--json", "--plot", str(plot)]
    command += ["--log-dir", str(tmp_path)]
    done = CliRunner().invoke(CLI, command, env=env, catch_exceptions=False)
    assert done.exit_code == 0, done.stderr[-3000:]
    document: dict[str, Any] = json.loads(done.stdout)
    assert document["scenario"] == scenario
    assert document["machine"]["before"]["cores"] >= 1
    assert ("plot" in document) == plot.exists()
    # The deployment's logs in a folder of its own in --log-dir, kept (the roles' temporary
    # folder, their TMPDIR, removed once they stopped).
    (logs,) = tmp_path.glob("bench-*")
    assert Path(document["logs"]) == logs and (logs / "models.toml").exists()
    assert (logs / "api.log").exists() and not (logs / "tmp").exists()
    return document


@pytest.mark.usefixtures("live_servers")
def test_saturation_reports_drain_against_the_ideal(run_id: str, tmp_path: Path) -> None:
    doc = bench("saturation", run_id, tmp_path)
    adaptive, nobatch = doc["results"]
    assert (adaptive["variant"], nobatch["variant"]) == ("adaptive", "nobatch")
    assert adaptive["ideal_rps"] == 80 and nobatch["ideal_rps"] == 10
    for row in doc["results"]:
        assert row["drained"] and row["backlog"] >= 4 * row["max_batch_size"]
        assert 0 < row["ratio_to_ideal"] <= 1.1 and 0 < row["announced_ratio"] <= 1.1
        assert 1 <= row["mean_batch"] <= row["max_batch_size"]
        assert row["idle_gap_p50_ms"] >= 0 and row["timeline"]
    assert nobatch["mean_batch"] == 1
    http = doc["http"]
    assert http["accepted"] > 0 and 0 < http["ratio_to_ideal"] <= 1.5
    assert http["submit"]["p50_ms"] > 0


@pytest.mark.usefixtures("live_servers")
def test_overhead_compares_live_with_the_simulator(run_id: str, tmp_path: Path) -> None:
    doc = bench("overhead", run_id, tmp_path)
    # By default the roles log warnings only: a request's lines are not in the figures.
    assert doc["role_log_level"] == "WARNING"
    assert "requests_accepted" not in (Path(doc["logs"]) / "api.log").read_text()
    (row,) = doc["results"]
    assert row["variant"] == "adaptive" and row["load"] == 0.1 and row["succeeded"] > 0
    assert row["succeeded"] + row["not_succeeded"] == row["accepted"]
    # The simulator runs the same trace with zero overheads: never slower than live.
    assert row["sim_p50_ms"] >= 100 and row["live_p50_ms"] >= row["sim_p50_ms"]
    assert set(row["breakdown"]) == set(doc["stages"])
    assert row["breakdown"]["model"]["p50_ms"] >= 100
    assert all(stage["p50_ms"] >= -5 for stage in row["breakdown"].values())


@pytest.mark.usefixtures("live_servers")
def test_ingest_steps_through_rates(run_id: str, tmp_path: Path) -> None:
    doc = bench("ingest", run_id, tmp_path, "--role-log-level", "INFO")
    assert [s["rate"] for s in doc["steps"]] == [40, 80]
    # The roles logged at the service's default level: the requests' histories are there.
    assert doc["role_log_level"] == "INFO"
    assert "requests_accepted" in (Path(doc["logs"]) / "api.log").read_text()
    for step in doc["steps"]:
        assert step["accepted"] + step["refused"] + step["errors"] == step["sent"] > 0
        assert 0 < step["p50_ms"] <= step["p99_ms"] <= step["max_ms"]
        assert set(step["tcp"]) == {"accepted", "listen_overflows", "resets"}
        assert step["tcp"]["accepted"] >= 1
        # The API's garbage collections over the step, from its batchserve_gc_pause_seconds.
        gc = step["api_gc"]
        assert gc["collections"] >= gc["full"] >= 0 and gc["ms"] >= 0
        # The load generator's own: its collector is off while it sends.
        assert step["loadgen_gc"]["collections"] == 0
        # The servers' CPU beside the roles', and how busy the machine was while sending.
        assert set(step["server_cpu_ms_per_request"]) == {"postgres", "rabbitmq", "redis"}
        assert 0 < step["cores_busy"] <= 1
    assert sum(s["server_cpu_ms_per_request"]["postgres"] for s in doc["steps"]) > 0
    assert doc["max_rate_ok"] in (0, 40, 80)


@pytest.mark.usefixtures("live_servers")
def test_bulk_times_a_job_from_created_to_in_progress(run_id: str, tmp_path: Path) -> None:
    doc = bench("bulk", run_id, tmp_path)
    assert doc["requests"] == 600 and doc["chunks"] >= 1
    assert 0 < doc["created_to_first_chunk_s"] <= doc["created_to_in_progress_s"]
    assert doc["ingest_rps"] > 0


@pytest.mark.usefixtures("live_servers")
def test_mixed_measures_interactive_latency_beside_a_job(run_id: str, tmp_path: Path) -> None:
    doc = bench("mixed", run_id, tmp_path)
    assert doc["alone_n"] > 0 and doc["with_job_n"] > 0
    assert 100 <= doc["alone_p50_ms"] <= doc["alone_p99_ms"]
    assert 100 <= doc["with_job_p50_ms"] <= doc["with_job_p99_ms"]
    assert doc["job_requests"] >= 1000


@pytest.mark.usefixtures("live_servers")
def test_streaming_serves_the_same_requests_plain_and_streamed(run_id: str, tmp_path: Path) -> None:
    doc = bench("streaming", run_id, tmp_path, "--no-client")
    (echo,) = doc["models"]
    assert echo["model"] == "echo-100ms" and echo["kind"] == "batch"
    assert echo["order"] == ["plain", "stream"] and echo["client"] is None
    plain, stream = echo["rounds"]
    for row in (plain, stream):
        assert row["requests"] == 48 and row["errors"] == 0
        assert row["seconds"] > 0 and row["rps"] > 0
        # The echo model answers with its prompt: the same tokens whichever way delivered.
        assert row["completion_tokens"] == plain["completion_tokens"] > 48
        assert row["latency_p50_ms"] >= 100  # a batch takes 100 ms
        assert row["cpu_ms"]["api"] > 0 and row["cpu_ms"]["worker"] > 0
    assert plain["ttft_p50_ms"] is None
    # The fixed model emits its answer as one delta: one piece, after its batch.
    assert stream["pieces_mean"] == 1 and stream["ttft_p50_ms"] >= 100
    assert echo["rps_ratio"] == pytest.approx(stream["rps"] / plain["rps"], rel=0.01)
    assert echo["tokens_ratio"] > 0 and echo["cpu_ratio"] > 0
    assert echo["median_pair_rps_ratio"] == pytest.approx(echo["rps_ratio"], rel=1e-3)


@pytest.mark.skipif(
    not AIPERF.exists(), reason="the aiperf client's environment is not made (make bench-client)"
)
@pytest.mark.usefixtures("live_servers")
def test_streaming_runs_the_outside_client_against_the_deployment(
    run_id: str, tmp_path: Path
) -> None:
    doc = bench("streaming", run_id, tmp_path, "--stream-models", "echo-100ms:24")
    client = doc["models"][0]["client"]
    assert client["client"].startswith("aiperf") and client["requests"] == 24
    assert client["errors"] == 0
    assert 0 < client["ttft_p50_ms"] <= client["ttft_p99_ms"]
    assert client["request_throughput"] > 0 and client["output_token_throughput"] > 0


def test_drain_is_measured_per_slot_between_warm_up_and_the_last_full_batch() -> None:
    # Two slots, each a 16-request batch every 0.1 s from t=0, sent 50 ms before the one ahead
    # of it ends, then a half batch at the end.
    rows = [
        _BatchRow(f"w{slot}", 16, t - 0.15, t - 0.1, t, 0.1)
        for slot in (0, 1)
        for t in [0.1 * (k + 1) for k in range(30)]
    ]
    rows.append(_BatchRow("w0", 8, 3.0, 3.0, 3.1, 0.1))
    figures = drain_figures(sorted(rows, key=lambda r: r.finished), 16, 0.5, slots=2)
    assert figures["drain_rps"] == pytest.approx(320.0)
    assert figures["mean_batch"] == 16 and figures["slots"] == 2
    assert figures["idle_gap_p50_ms"] == pytest.approx(0.0, abs=1e-6)
    assert figures["sent_ahead_p50_ms"] == pytest.approx(50.0)
    begin, end = figures["window"]
    assert begin == pytest.approx(0.5) and end == pytest.approx(3.0)


def test_drain_lays_standby_processes_taking_turns_on_their_slot() -> None:
    # One slot, two processes: each leases its batch 40 ms before the other's model ends and
    # starts its model 1 ms after it.
    rows = [
        _BatchRow(f"p{k % 2}", 16, t - 0.101 - 0.05, t - 0.101 - 0.04, t, 0.1)
        for k, t in enumerate(0.101 * (k + 1) for k in range(30))
    ]
    figures = drain_figures(rows, 16, 0.5, slots=1)
    assert figures["slots"] == 1
    assert figures["drain_rps"] == pytest.approx(16 / 0.101, abs=0.1)
    assert figures["idle_gap_p50_ms"] == pytest.approx(1.0)
    assert figures["handover_p50_ms"] == pytest.approx(0.0)
    assert figures["lease_p50_ms"] == pytest.approx(1.0)


@pytest.mark.usefixtures("live_servers")
def test_frontdoor_answers_every_caller_on_each_path_beside_the_baseline(
    run_id: str, tmp_path: Path
) -> None:
    doc = bench("frontdoor", run_id, tmp_path)
    assert [r["path"] for r in doc["results"]] == ["baseline", "longpoll", "sync"]
    for row in doc["results"]:
        # Each caller checked the answer is its own: all answered, none wrong, none refused.
        assert row["sent"] > 10 and row["answered"] == row["sent"], row
        assert row["wrong"] == row["refused"] == row["errors"] == 0, row
        # The seeds' model holds each batch 100 ms: no answer comes sooner.
        assert 100 <= row["p50_ms"] <= row["p99_ms"], row
        cpu = row["cpu_ms_per_request"]
        servers = row["server_cpu_ms_per_request"]
        assert set(servers) == {"postgres", "rabbitmq", "redis"} and min(servers.values()) >= 0
        if row["path"] == "baseline":
            assert cpu["baseline"] > 0, row
        else:
            # The roles a request passes through spend CPU on it; maintenance need not in a
            # short round (one statement a tick when idle: it may use no whole clock tick).
            assert all(cpu[role] > 0 for role in ("api", "batcher", "worker")), row
            assert cpu["maintenance"] >= 0, row
        if row["path"] != "baseline":  # every durable request is written to Postgres
            assert servers["postgres"] > 0, row
            # Of the round's requests, those that joined a batch sent before they arrived.
            assert 0 <= row["joined"]["late"] <= row["joined"]["of"] == row["sent"], row
            # One slot: idle between back-to-back batches, far less than a batch (if any came
            # back to back in so short a round).
            idle = row["slot_idle_ms"]
            assert idle is None or (idle["batches"] >= 1 and 0 <= idle["p50_ms"] < 100), row
            # One slot: of the round's requests, those that waited a batch more than the
            # baseline's would have (each came at most a batch before the one it missed).
            missed = row["missed"]
            assert 0 <= missed["count"] <= missed["of"] == row["sent"], row
            assert missed["count"] == 0 or 0 < missed["by_ms_p50"] < 110, row
        else:
            assert row["joined"] is None and row["slot_idle_ms"] is None
            assert row["missed"] is None
        # From each answer's batch's model end to the answer: every answered caller timed,
        # after the model, mostly within a batch of it (the baseline's from its own clock).
        after = row["after_model_ms"]
        assert after["of"] == row["answered"], row
        assert 0 <= after["p50_ms"] <= after["p99_ms"] and after["p50_ms"] < 100, row
        # The kernel's counters over the round (the host's): its callers' connections at least.
        assert set(row["tcp"]) == {"accepted", "listen_overflows", "resets"}, row
        assert row["tcp"]["accepted"] >= 1, row
        assert row["loadgen_gc"]["collections"] == 0, row  # off while the generator sends
    assert set(doc["results"][0]["cpu_ms_per_request"]) == {"baseline"}
    assert {"api", "batcher", "worker"} <= set(doc["results"][1]["cpu_ms_per_request"])
    latency = doc["goals"]["latency"]
    assert [(g["path"], g["offered_rps"], g["met"]) for g in latency] == [
        ("longpoll", 20.0, None),  # 20/s is not one of the goals' rates
        ("sync", 20.0, None),
    ]
    assert set(doc["goals"]["served_vs_ideal"]) == {"baseline", "longpoll", "sync"}


def test_embeddings_measures_batched_against_one_at_a_time(run_id: str, tmp_path: Path) -> None:
    env = {
        "BATCHSERVE_DATABASE_URL": servers.pg_url(f"{servers.DB_PREFIX}{run_id}"),
        "BATCHSERVE_BROKER_URL": servers.BROKER_URL,
        "BATCHSERVE_REDIS_URL": servers.REDIS_URL,
    }
    command = ["bench", "--scenario", "embeddings", "--texts", "96", "--one-at-a-time", "8"]
    command += ["--log-dir", str(tmp_path)]
    done = CliRunner().invoke(CLI, [*command, "--json"], env=env, catch_exceptions=False)
    assert done.exit_code == 0, done.stderr[-3000:]
    document = json.loads(done.stdout)
    assert document["scenario"] == "embeddings" and document["model"] == "all-minilm-l6-v2"
    figures = {f["name"]: f for f in document["figures"]}
    assert figures.keys() == {
        "model-one-a-batch",
        "model-batched",
        "service-one-at-a-time",
        "service-concurrent",
        "service-batch-job",
    }
    for name, figure in figures.items():
        one = name in ("model-one-a-batch", "service-one-at-a-time")
        assert figure["vectors"] == (8 if one else 96), name
        assert figure["seconds"] > 0 and figure["vectors_per_s"] > 0, name
    assert all(value > 0 for value in document["ratios"].values())
    (logs,) = tmp_path.glob("bench-*")  # its deployment's, in --log-dir
    assert (logs / "api.log").exists() and not (logs / "tmp").exists()


MID_ROUND = ["bench", "--scenario", "frontdoor", "--frontdoor-rates", "20", "--duration", "120"]
MID_ROUND += ["--workers", "1", "--json"]


@pytest.mark.usefixtures("live_servers")
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["sigterm", "ctrl-c"])
def test_a_stopped_bench_stops_its_deployment_and_removes_what_it_made(
    run_id: str, sig: signal.Signals, tmp_path: Path
) -> None:
    """A Ctrl-C, or a ``kill`` (a CI timeout, systemd), stops a bench mid-round: every process
    it started ends, and its database, queues and keys are gone."""
    stopped = signalled_mid_run(run_id, MID_ROUND, sig, tmp_path)
    assert stopped.process.returncode == 128 + sig, stopped.err[-3000:]
    assert f"bench: stopped by {sig.name}" in stopped.err and stopped.out == ""
    assert len(stopped.started) >= 5  # its template, API, maintenance, batcher, worker, baseline
    assert running(stopped.started) == []
    assert not stopped.database_exists() and stopped.keys() == []
    assert stopped.queues(["bench-adaptive", "bench-nobatch", "bench-timer"]) == []
    # Its roles' logs stay, in --log-dir; their temporary folder (TMPDIR) went with them.
    (logs,) = tmp_path.glob("bench-*")
    assert (logs / "api.log").exists() and not (logs / "tmp").exists()


@pytest.mark.usefixtures("live_servers")
def test_a_bench_killed_outright_leaves_no_process_running(run_id: str, tmp_path: Path) -> None:
    """SIGKILL leaves a bench no cleanup of its own: its roles end with their template (which
    sees its user gone) and its baseline server with its parent. Its database, queues and keys
    stay, for the test to remove."""
    stopped = signalled_mid_run(run_id, MID_ROUND, signal.SIGKILL, tmp_path)
    try:
        assert stopped.process.returncode == -signal.SIGKILL
        assert len(stopped.started) >= 5 and running(stopped.started) == []
    finally:
        stopped.remove(["bench-adaptive"])
