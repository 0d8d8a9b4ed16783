"""What a user installs: the wheel holds one top-level package, the base install brings no torch
(nor the benchmarks' libraries) and serves the API, and no role process imports the tooling."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchserve.testing.deployment import ROOT, free_port, terminate

HEAVY = {"torch", "transformers", "vllm", "accelerate", "matplotlib", "aiohttp"}
TOOLING = ("matplotlib", "aiohttp", "batchserve.bench", "batchserve.testing")
ECHO_ONLY = '[models.echo-100ms]\nbackend = "fixed"\nbatch_time_ms = 100\nmax_batch_size = 32\n'


def _run(*args: str | Path, timeout: float = 900) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@contextlib.contextmanager
def _serving(command: list[str], home: Path, **extra: str) -> Iterator[tuple[str, str, Path]]:
    """``serve`` embedded in ``home``, as a newcomer would run it; yields its URL, the first
    API key it printed and its log. A port another test took between its choice and the bind
    is chosen again: only this process's own answer counts as up."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    env.update(BATCHSERVE_HOME=str(home), **extra)
    log_path = home / "serve.log"
    home.mkdir(parents=True, exist_ok=True)
    for _ in range(3):
        port = free_port()
        with log_path.open("ab") as log:
            process = subprocess.Popen(
                [*command, "serve", "--host", "127.0.0.1", "--port", str(port)],
                env=env,
                cwd=home,  # not the source tree: only what was installed is importable
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        url = f"http://127.0.0.1:{port}"
        try:
            if _came_up(process, url, log_path):
                found = re.search(r"export BATCHSERVE_API_KEY=(\S+)", log_path.read_text())
                assert found, log_path.read_text()
                try:
                    yield url, found.group(1), log_path
                except httpx.HTTPError as error:  # say what became of the server
                    lines = log_path.read_text(errors="replace").splitlines()
                    tail = "\n".join(x for x in lines if not x.startswith("import time:"))
                    state = "runs" if process.poll() is None else f"exited {process.returncode}"
                    said = f"{error!r}; the server {state}:\n{tail[-3000:]}"
                    raise AssertionError(said) from error
                return
        finally:
            terminate(process, 30)
    raise AssertionError("every port chosen was taken first:\n" + log_path.read_text())


def _came_up(process: subprocess.Popen[bytes], url: str, log_path: Path) -> bool:
    """Whether ``process`` answers on ``url``; False when another took its port first."""
    give_up = time.monotonic() + 120
    while True:
        with contextlib.suppress(httpx.HTTPError):
            up = httpx.get(f"{url}/healthz", timeout=1).status_code == 200
            if up and process.poll() is None:
                return True
        if process.poll() is not None:
            if "address already in use" in log_path.read_text(errors="replace"):
                return False
            raise AssertionError(log_path.read_text())
        assert time.monotonic() < give_up, "the server did not come up"
        time.sleep(0.2)


def _echo_round_trip(url: str, key: str) -> None:
    headers = {"Authorization": f"Bearer {key}"}
    made = httpx.post(
        f"{url}/v1/requests",
        json={"model": "echo-100ms", "input": "light"},
        headers=headers,
        timeout=10,
    )
    assert made.status_code == 202, made.text
    done = httpx.get(
        f"{url}/v1/requests/{made.json()['id']}", params={"wait": 20}, headers=headers, timeout=30
    ).json()
    assert done["status"] == "succeeded", done
    assert done["output"]["text"] == "light"


def _imported(log: Path) -> set[str]:
    """The modules a process imported, from its ``PYTHONPROFILEIMPORTTIME`` lines."""
    names = set()
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("import time:") and "|" in line:
            names.add(line.rsplit("|", 1)[1].strip())
    assert names, "no import-time lines in the log"
    return names


@pytest.mark.timeout(1200)
def test_the_base_install_has_no_torch_and_serves_the_api(tmp_path: Path) -> None:
    # Built from a copy: setuptools leaves a build/ folder beside the sources it builds.
    source = tmp_path / "source"
    shutil.copytree(
        ROOT, source, ignore=shutil.ignore_patterns(".*", "build", "*.egg-info", "__pycache__")
    )
    dist = tmp_path / "dist"
    # With this environment's setuptools (no isolated build environment to install first).
    args = ("--no-deps", "--no-build-isolation", "-q", "-w", dist, source)
    _run(sys.executable, "-m", "pip", "wheel", *args)
    (wheel,) = dist.glob("batchserve-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        top = {name.split("/")[0] for name in archive.namelist()}
    assert {t for t in top if not t.endswith(".dist-info")} == {"batchserve"}

    venv = tmp_path / "venv"
    # No pip of its own (installing one takes seconds): this environment's pip installs into it.
    _run(sys.executable, "-m", "venv", "--without-pip", venv)
    pip = (sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"))
    # --no-compile: what is installed is the point, not byte-compiling all of it (half the time).
    _run(*pip, "install", "-q", "--no-compile", wheel)
    installed = {p["name"].lower() for p in json.loads(_run(*pip, "list", "--format=json"))}
    assert "batchserve" in installed and "tokenizers" in installed
    assert not HEAVY & installed, HEAVY & installed

    # The built-in registry names smollm2-135m too: this install says it cannot serve it and
    # serves the echo model.
    with _serving([str(venv / "bin" / "batchserve")], tmp_path / "home") as (url, key, log):
        _echo_round_trip(url, key)
        models = httpx.get(
            f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        ).json()
        assert [m["id"] for m in models["data"]] == ["echo-100ms"]
    text = log.read_text()
    assert "not serving smollm2-135m: the transformers backend needs torch" in text
    assert "pip install 'batchserve[transformers]'" in text


def test_no_role_imports_the_tooling(tmp_path: Path) -> None:
    """Every role runs in the embedded server's one process: none of them loads matplotlib,
    aiohttp, the benchmarks or the test harness, though all are installed here."""
    registry = tmp_path / "models.toml"
    registry.write_text(ECHO_ONLY)
    command = [sys.executable, "-m", "batchserve.cli"]
    with _serving(
        command, tmp_path / "home", BATCHSERVE_MODELS=str(registry), PYTHONPROFILEIMPORTTIME="1"
    ) as (url, key, log):
        _echo_round_trip(url, key)
    imported = _imported(log)
    assert "batchserve.api.main" in imported and "batchserve.workers.maintenance" in imported
    loaded = sorted(m for m in imported if m.split(".")[0] in TOOLING or m.startswith(TOOLING))
    assert not loaded, loaded


def test_the_roles_beside_the_api_load_no_web_framework() -> None:
    """The batcher, worker, maintenance and webhooks processes import no FastAPI (nor the
    benchmarks): they share the API's wire formats, not its framework."""
    roles = (
        "batchserve.cli.main",
        "batchserve.cli.roles",
        "batchserve.cli.webhooks_role",
        "batchserve.batching.batcher",
        "batchserve.workers.maintenance",
        "batchserve.workers.jobs",
        "batchserve.workers.worker_main",
        "batchserve.workers.engine_worker",
        "batchserve.workers.webhooks.delivery",
    )
    probe = (
        "import importlib, sys\n"
        f"for name in {roles!r}:\n"
        "    importlib.import_module(name)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'uvicorn',"
        " 'matplotlib', 'aiohttp') or m.startswith(('batchserve.bench', 'batchserve.testing'))))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
