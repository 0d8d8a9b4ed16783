"""The streaming benchmark's arithmetic and its reading of the outside client, without servers:
the round order, throughput and ratios, the workload option, aiperf's command and summary."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from batchserve.bench.client import (
    AIPERF,
    TOKENIZER_REPO,
    ClientRun,
    client_command,
    client_env,
    local_hub_cache,
    parse_summary,
)
from batchserve.bench.streaming import (
    PLAIN,
    STREAM,
    Answer,
    Round,
    Workload,
    abba,
    chat_bodies,
    comparison,
    parse_workloads,
    summarise,
)
from batchserve.bench.streaming_run import registry_toml
from batchserve.models.registry import load_registry, parse_registry


def test_rounds_alternate_so_a_linear_drift_weighs_on_both_variants_alike() -> None:
    assert abba(1) == [PLAIN, STREAM]
    assert abba(2) == [PLAIN, STREAM, STREAM, PLAIN]
    assert abba(3) == [PLAIN, STREAM, STREAM, PLAIN, PLAIN, STREAM]
    # Rounds at positions 0..3 of a machine slowing down linearly: the positions each variant
    # holds add up to the same, so a linear drift costs both the same.
    order = abba(4)
    assert sum(i for i, v in enumerate(order) if v == PLAIN) == sum(
        i for i, v in enumerate(order) if v == STREAM
    )


def _round(variant: str, requests: int, seconds: float, tokens: int, cpu: float) -> Round:
    return Round(variant, requests, 0, seconds, tokens, 120.0, cpu_ms={"api": cpu, "worker": 1.0})


def test_throughput_is_requests_over_summed_time_and_the_ratio_streamed_over_plain() -> None:
    rounds = [
        _round(PLAIN, 100, 0.5, 1000, 2.0),
        _round(STREAM, 100, 0.52, 1000, 2.4),
        _round(STREAM, 100, 0.56, 1000, 2.6),
        _round(PLAIN, 100, 0.5, 1000, 2.0),
    ]
    figures = comparison(rounds)
    assert figures[PLAIN]["rps"] == 200.0 and figures[PLAIN]["tokens_per_s"] == 2000.0
    assert figures[STREAM]["rps"] == pytest.approx(200 / 1.08, abs=0.01)
    assert figures["rps_ratio"] == pytest.approx(1.0 / 1.08, abs=1e-4)
    assert figures["tokens_ratio"] == pytest.approx(1.0 / 1.08, abs=1e-4)
    assert figures[STREAM]["cpu_ms"] == {"api": 2.5, "worker": 1.0}
    assert figures[PLAIN]["cpu_ms_total"] == 3.0 and figures[PLAIN]["rounds"] == 2
    assert figures["cpu_ratio"] == pytest.approx(3.0 / 3.5, abs=1e-4)
    # Each neighbouring pair (plain, stream) then (stream, plain), streamed over plain.
    assert figures["pair_rps_ratios"] == [pytest.approx(0.5 / 0.52, abs=1e-4), 0.8929]
    assert figures["median_pair_rps_ratio"] == pytest.approx(
        (0.5 / 0.52 + 0.5 / 0.56) / 2, abs=1e-3
    )


def test_a_variant_that_served_nothing_has_no_ratio() -> None:
    figures = comparison([_round(PLAIN, 10, 1.0, 10, 1.0)])
    assert figures[STREAM]["rounds"] == 0 and math.isnan(figures["rps_ratio"])
    assert figures["pair_rps_ratios"] == [] and math.isnan(figures["median_pair_rps_ratio"])


def test_a_round_counts_only_answered_requests_and_the_streams_first_text() -> None:
    answers = [
        Answer(True, 8, 0.3, 0.1, 8),
        Answer(True, 8, 0.5, 0.2, 4),
        Answer(False),
    ]
    figures = summarise(STREAM, answers, 2.0)
    assert (figures.requests, figures.errors, figures.completion_tokens) == (2, 1, 16)
    assert figures.rps == 1.0 and figures.tokens_per_s == 8.0
    assert figures.ttft_p50_ms == 100.0 and figures.pieces_mean == 6.0
    plain = summarise(PLAIN, [Answer(True, 8, 0.3)], 1.0)
    assert plain.ttft_p50_ms is None and plain.pieces_mean is None


def test_both_variants_send_the_same_requests_one_asking_for_a_stream() -> None:
    workload = Workload("echo-100ms", 3, 16)
    plain, stream = chat_bodies(workload, False), chat_bodies(workload, True)
    assert len(plain) == 3 and len({b["messages"][0]["content"] for b in plain}) == 3
    for a, b in zip(plain, stream, strict=True):
        assert {k: v for k, v in b.items() if k not in ("stream", "stream_options")} == a
        assert b["stream"] is True and b["stream_options"] == {"include_usage": True}


def test_workloads_are_model_and_requests_pairs() -> None:
    assert parse_workloads("echo-100ms:640, smollm2-135m:64", 32) == [
        Workload("echo-100ms", 640, 32),
        Workload("smollm2-135m", 64, 32),
    ]
    for bad in ("echo-100ms", "echo-100ms:0", ":5", ""):
        with pytest.raises(ValueError):
            parse_workloads(bad, 32)


def test_the_deployment_serves_each_model_as_the_registry_defines_it() -> None:
    for spec in load_registry(None).specs():
        again = parse_registry(registry_toml(spec)).get(spec.name)
        assert again is not None
        assert (again.backend, again.max_batch_size, again.batch_time_ms, again.policy) == (
            spec.backend,
            spec.max_batch_size,
            spec.batch_time_ms,
            spec.policy,
        )
        assert again.options == spec.options


def test_the_client_streams_a_bounded_load_to_the_given_url_with_a_local_tokenizer(
    tmp_path: Path,
) -> None:
    run = ClientRun("http://127.0.0.1:5123", "bsk_x", "echo-100ms", tmp_path, 20, 4, 48, 16)
    argv = client_command(run, tmp_path / "out")
    assert argv[:2] == [str(AIPERF), "profile"]
    flag = {argv[i]: argv[i + 1] for i in range(2, len(argv) - 1) if argv[i].startswith("--")}
    assert "--streaming" in argv and flag["--endpoint-type"] == "chat"
    assert flag["--url"] == "http://127.0.0.1:5123" and flag["--tokenizer"] == TOKENIZER_REPO
    assert flag["--request-count"] == "20" and flag["--concurrency"] == "4"
    assert flag["--isl"] == "48" and flag["--osl"] == "16"
    assert "--no-server-metrics" in argv and "--no-gpu-telemetry" in argv
    env = client_env(tmp_path / "hub")
    assert env["HF_HUB_OFFLINE"] == "1" and env["TRANSFORMERS_OFFLINE"] == "1"
    assert env["HF_HUB_CACHE"] == str(tmp_path / "hub")


def test_the_tokenizer_directory_is_served_offline_from_a_hub_cache_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (model / name).write_text(name)
    (model / "model.safetensors").write_bytes(b"weights")
    cache = local_hub_cache(model, tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from huggingface_hub import snapshot_download

    found = Path(snapshot_download(TOKENIZER_REPO, cache_dir=cache, local_files_only=True))
    assert sorted(p.name for p in found.iterdir()) == [
        "chat_template.jinja",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    assert (found / "tokenizer.json").read_text() == "tokenizer.json"
    # Made again over the same directory: the same snapshot, nothing duplicated.
    assert local_hub_cache(model, tmp_path / "hub") == cache
    assert (
        len(list((cache / f"models--{TOKENIZER_REPO.replace('/', '--')}/snapshots").iterdir())) == 1
    )


def test_aiperf_summary_gives_ttft_itl_and_throughput_in_milliseconds_and_per_second() -> None:
    doc = {
        "aiperf_version": "0.13.0",
        "request_count": {"unit": "requests", "avg": 20.0},
        "time_to_first_token": {"unit": "ms", "avg": 150.0, "p50": 140.5, "p99": 310.25},
        "inter_token_latency": {"unit": "ms", "p50": 12.5, "p99": 40.0},
        "request_latency": {"unit": "s", "p50": 0.9},
        "request_throughput": {"unit": "requests/sec", "avg": 22.5},
        "output_token_throughput": {"unit": "tokens/sec", "avg": 360.0},
    }
    figures = parse_summary(doc)
    assert figures.client == "aiperf 0.13.0"
    assert (figures.requests, figures.errors) == (20, 0)
    assert (figures.ttft_p50_ms, figures.ttft_p99_ms) == (140.5, 310.25)
    assert (figures.itl_p50_ms, figures.itl_p99_ms) == (12.5, 40.0)
    assert figures.latency_p50_ms == 900.0
    assert (figures.request_throughput, figures.output_token_throughput) == (22.5, 360.0)
    empty = parse_summary({})
    assert empty.requests == 0 and math.isnan(empty.ttft_p50_ms)


@pytest.mark.parametrize("scenario", ["model", "embeddings", "streaming"])
def test_a_scenario_with_its_own_deployment_refuses_a_role_log_level(scenario: str) -> None:
    """``--role-log-level`` reaches the roles BenchOptions deploys; the scenarios that deploy
    their own way refuse it, naming the option, before they deploy anything."""
    import typer
    from typer.testing import CliRunner

    from batchserve.bench.command import bench

    app = typer.Typer()
    app.command("bench")(bench)
    app.callback()(lambda: None)  # a group, as batchserve is: `bench` is a subcommand
    env = {
        "BATCHSERVE_DATABASE_URL": "postgresql+psycopg://nobody@127.0.0.1:9/none",
        "BATCHSERVE_BROKER_URL": "amqp://nobody:none@127.0.0.1:9//",
        "BATCHSERVE_REDIS_URL": "redis://127.0.0.1:9/0",
    }
    args = ["bench", "--scenario", scenario, "--role-log-level", "INFO"]
    result = CliRunner().invoke(app, args, env=env)
    assert result.exit_code == 2
    assert "--role-log-level" in result.output and "applies to" in result.output
