"""The warm template the deployments start their roles from: a forked role is a real process
with its own environment, directory and log, and answers like ``subprocess.Popen``."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from batchserve.testing.deployment import ROOT, free_port, terminate
from batchserve.testing.forkserver import GRACE_S, Forkserver
from tests.support.processes import ended


@pytest.fixture(scope="module")
def template() -> Iterator[Forkserver]:
    server = Forkserver()
    yield server
    server.close()


def wait_listening(port: int, timeout_s: float = 20.0) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"nothing listens on {port}")


def test_a_role_runs_the_command_line_with_its_own_environment_and_log(
    template: Forkserver, tmp_path: Path
) -> None:
    log = tmp_path / "help.log"
    helped = template.spawn(["api", "--help"], env={"PATH": "/usr/bin"}, cwd=tmp_path, log=log)
    assert helped.wait(timeout=30) == 0
    assert "--port" in log.read_text()
    # The environment is the one asked for, not the template's: a bad setting is seen.
    bad = tmp_path / "bad.log"
    refused = template.spawn(
        ["maintenance"], env={"BATCHSERVE_LOG_FORMAT": "xml"}, cwd=tmp_path, log=bad
    )
    assert refused.wait(timeout=30) == 2
    assert "bad settings" in bad.read_text() and "log_format" in bad.read_text()


def test_a_forked_process_is_signalled_and_waited_for_like_popen(
    template: Forkserver, tmp_path: Path
) -> None:
    (tmp_path / "here.txt").write_text("served from the role's directory")
    port = free_port()
    env = {"PATH": os.environ.get("PATH", "")}
    served = template.spawn(
        [str(port), "--bind", "127.0.0.1"],
        env=env,
        cwd=tmp_path,
        log=tmp_path / "http.log",
        module="http.server",
    )
    assert served.pid != os.getpid() and served.poll() is None
    wait_listening(port)
    assert httpx.get(f"http://127.0.0.1:{port}/here.txt").text.startswith("served from")
    with pytest.raises(subprocess.TimeoutExpired):
        served.wait(timeout=0.2)
    served.send_signal(signal.SIGTERM)
    assert served.wait(timeout=10) == -signal.SIGTERM
    assert served.returncode == served.poll() == -signal.SIGTERM
    served.kill()  # like Popen: a process already waited for is not signalled again

    frozen = template.spawn(
        [str(free_port())], env=env, cwd=tmp_path, log=tmp_path / "h2.log", module="http.server"
    )
    os.kill(frozen.pid, signal.SIGSTOP)
    frozen.kill()
    assert frozen.wait(timeout=10) == -signal.SIGKILL


def test_a_deployment_forks_its_roles_and_starts_another_interpreter_bare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batchserve.testing.deployment import Stack
    from batchserve.testing.forkserver import ForkedProcess

    stack = Stack(env={"PATH": os.environ.get("PATH", "")}, log_dir=tmp_path)
    forked = stack.start("help", "batcher", "--help")
    assert isinstance(forked.process, ForkedProcess)
    assert forked.process.wait(timeout=30) == 0 and "--help" in stack.logs("help")
    # An engine's own environment (another interpreter) cannot share the template's imports.
    here = Path(sys.executable)
    other = next(n for n in ("python", "python3") if n != here.name)  # the same venv's
    bare = stack.start("bare", "batcher", "--help", python=str(here.with_name(other)))
    assert isinstance(bare.process, subprocess.Popen)
    assert bare.process.wait(timeout=30) == 0
    monkeypatch.setenv("BATCHSERVE_FORKSERVER", "0")  # turned off: every role starts bare
    off = stack.start("off", "batcher", "--help")
    assert isinstance(off.process, subprocess.Popen) and off.process.wait(timeout=30) == 0


def test_a_role_takes_its_temporary_directory_from_its_environment(
    template: Forkserver, tmp_path: Path
) -> None:
    """As an exec'd role would read it, whatever the template's own is."""
    log = tmp_path / "probe.log"
    env = {"PATH": os.environ.get("PATH", ""), "TMPDIR": str(tmp_path)}
    probe = template.spawn([], env=env, cwd=ROOT, log=log, module="tests.support.tempdir_probe")
    assert probe.wait(timeout=30) == 0
    assert log.read_text().split() == ["tempdir", str(tmp_path)]


def test_a_deployments_roles_keep_their_temporary_files_in_its_log_directory(
    tmp_path: Path,
) -> None:
    """What a killed role leaves in its TMPDIR (scratch folders, multiprocessing's ``pymp-*``)
    goes with the deployment, not into ``/tmp``: the folder is removed once no role runs."""
    from batchserve.testing.deployment import Stack

    stack = Stack(env={"PATH": os.environ.get("PATH", "")}, log_dir=tmp_path)
    assert stack.role_env({"A": "1"}) == {**stack.env, "TMPDIR": str(tmp_path / "tmp"), "A": "1"}
    assert stack.role_env({"TMPDIR": "/elsewhere"})["TMPDIR"] == "/elsewhere"
    held = stack.start("held", "batcher", "--help")
    (stack.scratch_dir / "pymp-left").mkdir()
    assert held.process is not None and held.process.wait(timeout=30) == 0
    stack.stop_all()
    assert not stack.scratch_dir.exists() and stack.roles["held"].log_path.exists()


def test_roles_hear_signals_whichever_thread_started_the_template(tmp_path: Path) -> None:
    """A thread may block signals (an event loop's executor threads do), and a process started
    from it inherits the mask: the template must not pass it on to every role it forks."""
    made: list[Forkserver] = []

    def start_blocked() -> None:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
        made.append(Forkserver())

    starter = threading.Thread(target=start_blocked)
    starter.start()
    starter.join()
    (server,) = made
    try:
        port = free_port()
        served = server.spawn(
            [str(port), "--bind", "127.0.0.1"],
            env={"PATH": os.environ.get("PATH", "")},
            cwd=tmp_path,
            log=tmp_path / "http.log",
            module="http.server",
        )
        wait_listening(port)
        served.send_signal(signal.SIGTERM)
        assert served.wait(timeout=10) == -signal.SIGTERM
    finally:
        server.close()


_READY = "import time; print('ready', flush=True); time.sleep(60)"
_STUBBORN = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); " + _READY


def test_terminate_asks_first_and_kills_what_does_not_listen() -> None:
    """``terminate``: a process that stops on SIGTERM exits by it; one that ignores it is
    killed at the deadline; either way it is reaped, and one already gone is left alone."""
    polite = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    terminate(polite, 10)
    assert polite.returncode == -signal.SIGTERM

    stubborn = subprocess.Popen([sys.executable, "-c", _STUBBORN], stdout=subprocess.PIPE)
    assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
    started = time.monotonic()
    terminate(stubborn, 0.5)
    assert stubborn.returncode == -signal.SIGKILL
    assert 0.5 <= time.monotonic() - started < 10
    stubborn.stdout.close()

    terminate(polite, 10)  # already reaped: nothing to send, nothing raised
    assert polite.returncode == -signal.SIGTERM

    # Signalled once its interpreter has started: a SIGINT that lands while it is still
    # starting can be taken for an error of its start (exit 1) or lost.
    interrupted = subprocess.Popen([sys.executable, "-c", _READY], stdout=subprocess.PIPE)
    assert interrupted.stdout is not None and interrupted.stdout.readline() == b"ready\n"
    terminate(interrupted, 10, signal.SIGINT)
    assert interrupted.returncode == -signal.SIGINT  # it stopped by the signal asked for
    interrupted.stdout.close()


_USER = """
import os, sys, time
from pathlib import Path
from batchserve.testing.forkserver import GRACE_S, Forkserver
from tests.support.processes import ended
from batchserve.testing.deployment import free_port
logs = Path(sys.argv[1])
server = Forkserver(grace_s=1.0)
env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": os.getcwd()}
polite = server.spawn([str(free_port())], env=env, cwd=logs, log=logs / "polite.log",
                      module="http.server")
stubborn = server.spawn([], env=env, cwd=logs, log=logs / "stubborn.log",
                        module="tests.support.stubborn_role")
print(server._process.pid, polite.pid, stubborn.pid, flush=True)
time.sleep(120)
"""


def test_the_roles_end_when_their_user_is_killed(tmp_path: Path) -> None:
    """A test process killed mid-run (a CI timeout, SIGKILL) cannot stop its deployments: the
    template, seeing its user gone, ends each role still running and what the role started,
    SIGKILL for one that ignores SIGTERM once the grace is out."""
    user = subprocess.Popen(
        [sys.executable, "-c", _USER, str(tmp_path)], stdout=subprocess.PIPE, cwd=ROOT
    )
    assert user.stdout is not None
    template, polite, stubborn = (int(p) for p in user.stdout.readline().split())
    started = time.monotonic()
    helper = 0
    while not helper and time.monotonic() - started < 30:
        log = tmp_path / "stubborn.log"
        text = log.read_text() if log.exists() else ""
        helper = int(text.split()[1]) if text.startswith("pids ") else 0
        time.sleep(0.05)
    assert helper and not any(ended(p) for p in (template, polite, stubborn, helper))
    user.kill()
    user.wait(timeout=10)
    user.stdout.close()
    give_up = time.monotonic() + 30
    while time.monotonic() < give_up and not all(
        ended(p) for p in (template, polite, stubborn, helper)
    ):
        time.sleep(0.1)
    assert ended(polite) and ended(stubborn) and ended(helper) and ended(template)
    assert GRACE_S == 10.0  # the grace a role has by default, as the README says


def test_the_template_leaves_a_ctrl_c_to_its_user(template: Forkserver, tmp_path: Path) -> None:
    """Ctrl-C signals the terminal's whole process group, the template with its user: the
    template lives on for the user's cleanup (its roles lead groups of their own)."""
    os.kill(template._process.pid, signal.SIGINT)
    time.sleep(0.2)
    assert template.alive()
    helped = template.spawn(
        ["api", "--help"], env={"PATH": "/usr/bin"}, cwd=tmp_path, log=tmp_path / "h.log"
    )
    assert helped.wait(timeout=30) == 0
