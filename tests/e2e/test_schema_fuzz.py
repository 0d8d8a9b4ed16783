"""Schema fuzzing: schemathesis generates requests from the API's own OpenAPI document and sends
them to a running API (on Postgres, RabbitMQ, Redis, with a batcher and a worker). Every
response must be a non-5xx that matches the schema the document declares for it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from batchserve.testing.deployment import Stack
from tests.support import keys

ECHO = "echo-100ms"
CHECKS = "not_a_server_error,response_schema_conformance,content_type_conformance"


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
            "run",
            f"{stack.url}/openapi.json",
            "--checks",
            CHECKS,
            "--header",
            f"Authorization: Bearer {keys.key()}",
            "--phases",
            "examples,coverage,fuzzing",
            "--max-examples",
            "30",
            "--seed",
            "20261130",
            "--workers",
            "2",
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
    )
    summary = run.stdout[-6000:]
    print(summary)
    assert run.returncode == 0, summary + run.stderr[-2000:]
    cases = _generated_cases(run.stdout, report)
    print(f"schemathesis: {cases} generated test cases, 0 failures")
    assert cases >= 200


def _generated_cases(stdout: str, report: Path) -> int:
    match = re.search(r"Test cases:\s*\n?\s*(\d+)\s+generated", stdout)
    if match:
        return int(match.group(1))
    count = 0
    for line in report.read_text().splitlines():
        event = json.loads(line)
        count += sum(1 for key in event if "ScenarioFinished" in key)
    return count
