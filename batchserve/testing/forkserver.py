"""Role processes forked from a warm template instead of started from a bare interpreter.

A role process spends ~2 s of CPU importing FastAPI, SQLAlchemy, Celery and batchserve before
it does anything; the test suite starts hundreds of them on two cores. The template imports
that once, then forks a child per role: the child takes the role's environment, working
directory and log file, and runs ``python -m batchserve.cli <args>`` exactly as a started
process would (``runpy``, ``__main__``, exit code), as a real separate process with its own pid.

The template is a child of the process that uses it; since the roles are the template's
children, it reaps them and reports their exit codes back over its stdout, and
:class:`ForkedProcess` answers ``poll``/``wait``/``send_signal`` like ``subprocess.Popen``.
When its user goes away (its stdin closes: closed at exit, or the user killed) the template
ends the roles still running, each with what it started, as a deployment's stop would
(SIGTERM, SIGKILL after ``grace_s``): no role outlives the process that asked for it. It
ignores SIGINT: a Ctrl-C reaches the user, whose cleanup still needs it.

Only modules that read nothing from the environment when imported are imported in the
template (settings, metrics' multiprocess mode and the rest are read when a role starts), and
it forks only while it has a single thread. ``BATCHSERVE_FORKSERVER=0`` turns it off.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import importlib
import json
import os
import runpy
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import IO, Any

# What every role imports before its first line of work (measured with -X importtime).
WARM = (
    "batchserve.cli.main",
    "batchserve.cli.roles",
    "batchserve.cli.webhooks_role",
    "batchserve.workers.worker_main",
    "batchserve.models.plugins",
    "batchserve.models.registry",
    "batchserve.api.main",
    "uvicorn",
    "celery.apps.worker",
    "celery.worker",
    "celery.concurrency.prefork",
    "kombu.transport.pyamqp",
)

# How long roles left running when the user goes away have to stop before they are killed
# (a role's graceful stop takes seconds: a Celery worker's about four).
GRACE_S = 10.0


class ForkedProcess:
    """A role forked by the template: the parts of ``subprocess.Popen`` a deployment uses."""

    def __init__(self, server: Forkserver, pid: int, args: list[str]) -> None:
        self._server = server
        self.pid = pid
        self.args = args

    @property
    def returncode(self) -> int | None:
        return self._server.returncode(self.pid)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        code = self._server.wait(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:  # like Popen: never signal a pid that may be reused
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Forkserver:
    """The client side: starts the template, asks it for children, hears their exits."""

    def __init__(self, grace_s: float = GRACE_S) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "batchserve.testing.forkserver", f"{grace_s:g}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=Path(__file__).resolve().parents[2],
        )
        assert self._process.stdin is not None and self._process.stdout is not None
        self._requests: IO[bytes] = self._process.stdin
        self._replies: IO[bytes] = self._process.stdout
        self._lock = threading.Lock()  # one spawn at a time
        self._changed = threading.Condition()
        self._codes: dict[int, int] = {}
        self._spawned: list[int | str] = []
        self._closed = False
        self._grace_s = grace_s
        ready = json.loads(self._replies.readline() or b'{"error": "the template died"}')
        if "ready" not in ready:
            raise RuntimeError(f"forkserver: {ready.get('error')}")
        threading.Thread(target=self._read, name="forkserver-replies", daemon=True).start()

    def _read(self) -> None:
        for line in self._replies:
            message = json.loads(line)
            with self._changed:
                if "exit" in message:
                    self._codes[int(message["exit"])] = int(message["code"])
                else:
                    self._spawned.append(message.get("pid") or str(message.get("error")))
                self._changed.notify_all()
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def spawn(
        self,
        args: list[str],
        *,
        env: dict[str, str],
        cwd: Path,
        log: Path,
        module: str = "batchserve.cli",
    ) -> ForkedProcess:
        """``python -m module *args`` in ``cwd`` with exactly ``env``, output to ``log``."""
        request = {"module": module, "args": args, "env": env, "cwd": str(cwd), "log": str(log)}
        with self._lock:
            self._requests.write(json.dumps(request).encode() + b"\n")
            self._requests.flush()
            with self._changed:
                if not self._changed.wait_for(lambda: self._spawned or self._closed, 30):
                    raise RuntimeError("forkserver: no answer to a spawn in 30 s")
                if not self._spawned:
                    raise RuntimeError("forkserver: the template died")
                reply = self._spawned.pop(0)
        if isinstance(reply, str):
            raise RuntimeError(f"forkserver: {reply}")
        return ForkedProcess(self, reply, [module, *args])

    def returncode(self, pid: int) -> int | None:
        with self._changed:
            return self._codes.get(pid)

    def wait(self, pid: int, timeout: float | None) -> int | None:
        with self._changed:
            self._changed.wait_for(lambda: pid in self._codes or self._closed, timeout)
            return self._codes.get(pid)

    def alive(self) -> bool:
        return self._process.poll() is None and not self._closed

    def close(self) -> None:
        """End the template: it ends any role still running (the deployments stop theirs
        first, so there are none but what a failed test left)."""
        with contextlib.suppress(OSError):
            self._requests.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self._process.wait(timeout=self._grace_s + 10)


_shared: Forkserver | None = None
_shared_lock = threading.Lock()


def shared() -> Forkserver | None:
    """This process's template, started on first use; None when turned off or broken (the
    caller then starts a bare interpreter)."""
    global _shared
    if os.environ.get("BATCHSERVE_FORKSERVER", "1") == "0":
        return None
    with _shared_lock:
        if _shared is None or not _shared.alive():
            try:
                _shared = Forkserver()
            except (OSError, RuntimeError, ValueError):
                return None
            atexit.register(_shared.close)
        return _shared


# -- the template ----------------------------------------------------------------------------


def _reply(message: dict[str, Any]) -> None:
    with contextlib.suppress(BrokenPipeError):  # the user is gone: nobody to tell
        os.write(1, json.dumps(message).encode() + b"\n")


def _reap(running: set[int]) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        running.discard(pid)
        _reply({"exit": pid, "code": os.waitstatus_to_exitcode(status)})


def _end_roles(running: set[int], selector: selectors.BaseSelector, grace_s: float) -> None:
    """The user went away: SIGTERM each role still running and what it started (its process
    group; a role not yet reaped still holds its pid, so the group is the role's), and SIGKILL
    those left after ``grace_s``."""
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        for pid in running:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGCONT)  # a stopped role must be continued to hear it
                os.killpg(pid, sig)
        give_up = time.monotonic() + wait_s
        while running and time.monotonic() < give_up:
            for key, _ in selector.select(timeout=0.1):
                if key.data == "signal":
                    os.read(key.fd, 4096)
            _reap(running)
        if not running:
            return


def _child(request: dict[str, Any], selector: selectors.BaseSelector, wakeup: int) -> None:
    """In the forked child: become the role's process, as ``python -m <module>``, leading a
    process group of its own (what it starts can be ended with it)."""
    os.setsid()
    selector.close()
    signal.set_wakeup_fd(-1)
    os.close(wakeup)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    os.close(null)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # the role's TMPDIR, as an exec'd role would read it
    module = request.get("module", "batchserve.cli")
    sys.argv = [module, *request["args"]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    sys.exit(0)


def _serve(grace_s: float) -> None:
    # A process inherits the signal mask of the thread that started it, and an event loop's
    # executor threads block signals: a template started from one would hand every role a
    # blocked SIGTERM (no graceful stop, ever). Roles start with nothing blocked.
    signal.pthread_sigmask(signal.SIG_SETMASK, set())
    for module in WARM:
        importlib.import_module(module)
    if threading.active_count() != 1:
        _reply({"error": f"{threading.active_count()} threads after imports; forking is unsafe"})
        return
    # What the imports made lives as long as any role: out of the collector's sight, in every
    # role forked from here. A role's full collections then scan only what it made itself
    # (Celery's prefork pool runs one before forking each pool process: 0.12 s of CPU each on
    # this heap), and its pages stay shared with the template's.
    gc.collect()
    gc.freeze()
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd hears it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    running: set[int] = set()  # the roles forked and not yet reaped
    selector = selectors.DefaultSelector()
    selector.register(0, selectors.EVENT_READ, "request")
    selector.register(read_end, selectors.EVENT_READ, "signal")
    _reply({"ready": os.getpid()})
    requests = os.fdopen(0, "rb", buffering=0)
    pending = b""
    while True:
        for key, _ in selector.select():
            if key.data == "signal":
                os.read(read_end, 4096)
                _reap(running)
                continue
            chunk = requests.read(65536)
            if not chunk:  # the user went away
                selector.unregister(0)
                _end_roles(running, selector, grace_s)
                return
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as error:
                    _reply({"error": str(error)})
                    continue
                if pid == 0:
                    os.close(read_end)
                    _child(request, selector, write_end)
                running.add(pid)
                _reply({"pid": pid})
        _reap(running)


if __name__ == "__main__":
    _serve(float(sys.argv[1]) if len(sys.argv) > 1 else GRACE_S)
