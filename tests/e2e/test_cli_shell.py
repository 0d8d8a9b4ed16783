"""A newcomer's shell beside `batchserve serve` on another port: the commands they type next
talk to that server and open its database, with no flags; one that cannot reach a server says
so in one line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from batchserve.testing.deployment import ROOT, free_port
from tests.e2e.test_contract import embedded_service


def _cli(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("BATCHSERVE_")}
    env.update(BATCHSERVE_HOME=str(home), BATCHSERVE_MODELS=str(home / "models.toml"), **extra)
    return subprocess.run(
        [sys.executable, "-m", "batchserve.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_shell_and_the_server_agree_without_flags(tmp_path: Path) -> None:
    with embedded_service(tmp_path) as service:
        assert not service.url.endswith(":8000")
        made = _cli(tmp_path, "keys", "create", "--tenant", "shell", "--json")
        assert made.returncode == 0, made.stderr
        database = f"sqlite+aiosqlite:///{tmp_path}/batchserve.sqlite3"
        assert f"batchserve: database {database} (embedded)" in made.stderr
        key = json.loads(made.stdout)["key"]

        # No --url: the port the server chose; the key made above is one the server knows.
        done = _cli(tmp_path, "submit", "from the shell", "--wait", "20", BATCHSERVE_API_KEY=key)
        assert done.returncode == 0, done.stderr
        request = json.loads(done.stdout)
        assert request["status"] == "succeeded"
        assert request["output"]["text"] == "from the shell"
        status = _cli(tmp_path, "status", "--json")
        assert status.returncode == 0, status.stderr
        assert "echo-100ms" in {m["model"] for m in json.loads(status.stdout)["models"]}

        # BATCHSERVE_URL (BATCHSERVE_OPS_URL for status) names another server: nobody there is
        # one line, no traceback.
        nobody = f"http://127.0.0.1:{free_port()}"
        for args in (("submit", "hi"), ("status",), ("batch", "status", "batch_x")):
            failed = _cli(
                tmp_path,
                *args,
                BATCHSERVE_URL=nobody,
                BATCHSERVE_OPS_URL=nobody,
                BATCHSERVE_API_KEY=key,
            )
            assert failed.returncode == 1, (args, failed.stdout, failed.stderr)
            assert failed.stderr.startswith(f"batchserve: cannot reach {nobody}"), failed.stderr
            assert failed.stderr.count("\n") == 1 and "Traceback" not in failed.stderr
