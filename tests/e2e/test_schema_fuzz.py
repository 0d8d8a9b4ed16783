"""Schema fuzzing: schemathesis generates requests from the API's own OpenAPI document and sends
them to a running API (on Postgres, RabbitMQ, Redis, with a batcher and a worker), with every
check it has: no 5xx, every response as declared, every schema-valid request accepted and every
invalid one refused (so the document states each limit the server enforces), 405s that name
the allowed methods, auth that is never ignored; and, following the document's links, sequences
of calls (submit -> get -> cancel, upload -> batch -> cancel) whose resources stay reachable."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from batchserve.testing.deployment import ROOT, Stack
from tests.support import keys

ECHO = "echo-100ms"
HERE = Path(__file__).parent
HOOKS = "tests.e2e.schemathesis_hooks"


def test_no_generated_request_gets_a_server_error_or_an_undeclared_response(
    stack: Stack, tmp_path: Path
) -> None:
    stack.start_all({ECHO: 1})
    report = tmp_path / "schemathesis.ndjson"
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "schemathesis.cli",
            "--config-file",
            str(HERE / "schemathesis.toml"),
            "run",
            f"{stack.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {keys.key()}",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            "30",
            "--seed",
            "20261130",
            # One worker: two threads building hypothesis strategies at once hit CPython's
            # "AST constructor recursion depth mismatch" (hypothesis describing its lambdas).
            "--workers",
            "1",
            "--request-timeout",
            "30",
            "--suppress-health-check",
            "all",
            "--report",
            "ndjson",
            "--report-ndjson-path",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=tmp_path,  # schemathesis keeps its state in ./.schemathesis
        env={
            **os.environ,
            "SCHEMATHESIS_HOOKS": "tests.e2e.schemathesis_hooks",
            "PYTHONPATH": str(ROOT),
        },
    )
    summary = run.stdout[-6000:]
    print(summary)
    assert run.returncode == 0, summary + run.stderr[-2000:]
    cases = _generated_cases(run.stdout, report)
    print(f"schemathesis: {cases} generated test cases, 0 failures")
    assert cases >= 200
    # The stateful phase ran sequences along the document's links (create -> get -> cancel).
    scenarios = re.search(r"Scenarios:\s+(\d+)", run.stdout)
    links = re.search(r"API Links:\s+(\d+) covered", run.stdout)
    assert scenarios and int(scenarios.group(1)) >= 10, summary
    assert links and int(links.group(1)) >= 2, summary


def _generated_cases(stdout: str, report: Path) -> int:
    match = re.search(r"Test cases:\s*\n?\s*(\d+)\s+generated", stdout)
    if match:
        return int(match.group(1))
    count = 0
    for line in report.read_text().splitlines():
        event = json.loads(line)
        count += sum(1 for key in event if "ScenarioFinished" in key)
    return count
