"""An outside benchmark client against a deployment: NVIDIA's aiperf, in its own environment.

aiperf rather than guidellm: both speak OpenAI's streaming chat API and both take a local
tokenizer directory, but guidellm 0.8 requires torch (a CUDA build of several GB unless the
CPU one is installed first) while aiperf needs none, so its environment is ~1.2 GB and
installs in about two minutes; and aiperf's ``profile`` command takes plain flags (concurrency,
request count, input and output lengths) and writes one JSON summary whose metrics
(``time_to_first_token``, ``inter_token_latency``, ``request_throughput``,
``output_token_throughput``) are read here.

The environment is ``.venv-bench-client`` (``make bench-client``, made on first use). The client
runs with ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` set, so nothing is fetched from a hub,
and its targets are the deployment's API on 127.0.0.1 and nothing else (server-metric scraping
and GPU telemetry, which would probe other ports, are off). Its tokenizer is the converted
model's (``batchserve/models/hf.py``), laid out as a Hugging Face cache of its own: offline,
aiperf 0.13 looks every tokenizer name up in the hub cache
(``snapshot_download(local_files_only=True)``) and refuses a plain directory path, so the run
gets a cache holding that one snapshot.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import signal
import subprocess
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from batchserve.testing.deployment import ROOT

CLIENT_VENV = ROOT / ".venv-bench-client"
AIPERF = CLIENT_VENV / "bin" / "aiperf"
SUMMARY = "profile_export_aiperf.json"
TOKENIZER_REPO = "batchserve/tokenizer"  # the name it has in the run's own hub cache
# What a tokenizer needs of a model directory (not its weights).
_TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "chat_template.jinja",
                    "vocab.*", "merges.txt", "config.json", "generation_config.json")  # fmt: skip


@dataclass(frozen=True, slots=True)
class ClientRun:
    """What to ask of the client: a bounded, closed-loop streaming chat load."""

    url: str
    api_key: str
    model: str
    tokenizer: Path
    requests: int
    concurrency: int
    input_tokens: int
    output_tokens: int
    seed: int = 1


@dataclass(frozen=True, slots=True)
class ClientFigures:
    """The client's summary: its own clock on its own connections."""

    client: str
    requests: int
    errors: int
    ttft_p50_ms: float
    ttft_p99_ms: float
    itl_p50_ms: float
    itl_p99_ms: float
    latency_p50_ms: float
    request_throughput: float  # requests/s
    output_token_throughput: float  # tokens/s, as the client's tokenizer counts them
    wall_s: float = math.nan

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def client_command(run: ClientRun, out_dir: Path, tokenizer: str = TOKENIZER_REPO) -> list[str]:
    """The aiperf command line for ``run``, writing its artifacts under ``out_dir``, counting
    tokens with ``tokenizer`` (a name in its hub cache)."""
    return [
        str(AIPERF),
        "profile",
        *("--model-names", run.model, "--url", run.url, "--endpoint-type", "chat"),
        "--streaming",
        *("--api-key", run.api_key, "--tokenizer", tokenizer),
        *("--concurrency", str(run.concurrency), "--request-count", str(run.requests)),
        *("--isl", str(run.input_tokens), "--isl-stddev", "0"),
        *("--osl", str(run.output_tokens), "--osl-stddev", "0"),
        # Every answer the asked length on a real model (vLLM's extension, which we honour).
        *("--extra-inputs", "ignore_eos:true", "--extra-inputs", "temperature:0"),
        *("--random-seed", str(run.seed), "--output-artifact-dir", str(out_dir)),
        *("--ui-type", "none", "--no-server-metrics", "--no-gpu-telemetry"),
        # Two cores: one worker process and one record processor are plenty for this load.
        *("--workers-max", "1", "--record-processors", "1"),
    ]


def local_hub_cache(tokenizer_dir: Path, root: Path) -> Path:
    """A Hugging Face hub cache under ``root`` whose one model, :data:`TOKENIZER_REPO`, is
    the tokenizer files of ``tokenizer_dir`` (linked, not copied); the cache's path."""
    files = sorted({f for pattern in _TOKENIZER_FILES for f in tokenizer_dir.glob(pattern)})
    digest = hashlib.sha1()
    for path in files:
        digest.update(f"{path.name}:{path.stat().st_size}:{path.stat().st_mtime_ns}".encode())
    commit = digest.hexdigest()
    repo = root / f"models--{TOKENIZER_REPO.replace('/', '--')}"
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True, exist_ok=True)
    for path in files:
        link = snapshot / path.name
        if not link.exists():
            link.symlink_to(path.resolve())
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)
    return root


def client_env(hub_cache: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}
    if hub_cache is not None:
        env["HF_HUB_CACHE"] = str(hub_cache)
    env.update(
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
        NO_PROXY="127.0.0.1,localhost",
    )
    return env


def parse_summary(doc: dict[str, Any]) -> ClientFigures:
    """aiperf's ``profile_export_aiperf.json``: each metric a key holding ``avg``, ``p50``,
    ``p99`` and so on in its ``unit``."""

    def stat(tag: str, name: str) -> float:
        metric = doc.get(tag) or {}
        value = metric.get(name)
        if value is None:
            return math.nan
        return round(float(value) * _to_ms(metric.get("unit", "ms")), 3)

    def count(tag: str) -> int:
        metric = doc.get(tag) or {}
        value = metric.get("avg")
        return int(value) if value is not None else 0

    return ClientFigures(
        client=f"aiperf {doc.get('aiperf_version', '?')}",
        requests=count("request_count"),
        errors=count("error_request_count"),
        ttft_p50_ms=stat("time_to_first_token", "p50"),
        ttft_p99_ms=stat("time_to_first_token", "p99"),
        itl_p50_ms=stat("inter_token_latency", "p50"),
        itl_p99_ms=stat("inter_token_latency", "p99"),
        latency_p50_ms=stat("request_latency", "p50"),
        request_throughput=_plain(doc, "request_throughput"),
        output_token_throughput=_plain(doc, "output_token_throughput"),
    )


def _to_ms(unit: str) -> float:
    return {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1000.0, "sec": 1000.0}.get(unit, 1.0)


def _plain(doc: dict[str, Any], tag: str) -> float:
    value = (doc.get(tag) or {}).get("avg")
    return round(float(value), 3) if value is not None else math.nan


def ensure_client() -> None:
    """Make the client's environment if it is not there (``make bench-client``)."""
    if AIPERF.exists():
        return
    subprocess.run(["make", "-C", str(ROOT), "bench-client"], check=True, timeout=1200)


def run_client(run: ClientRun, out_dir: Path, timeout_s: float) -> ClientFigures:
    """Run the client once, bounded by ``run.requests`` and ``timeout_s``; its figures."""
    out_dir.mkdir(parents=True, exist_ok=True)
    hub_cache = local_hub_cache(run.tokenizer, out_dir / "hf-hub")
    log_path = out_dir / "aiperf.log"
    started = time.perf_counter()
    with log_path.open("wb") as log:
        # Its own process group: aiperf runs its services as child processes, and a client
        # past its time is stopped with all of them.
        client = subprocess.Popen(
            client_command(run, out_dir),
            cwd=out_dir,
            env=client_env(hub_cache),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            returncode = client.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(client.pid, signal.SIGKILL)
            client.wait()
            returncode = -signal.SIGKILL
    wall_s = round(time.perf_counter() - started, 1)
    found = sorted(out_dir.rglob(SUMMARY))
    if returncode != 0 or not found:
        tail = log_path.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"aiperf failed ({returncode}); see {log_path}:\n{tail}")
    figures = parse_summary(json.loads(found[0].read_text()))
    return ClientFigures(**{**figures.as_dict(), "wall_s": wall_s})
