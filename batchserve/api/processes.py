"""``batchserve api --processes N``: one API, N processes, one port.

One Python process serves HTTP on one core: past it, requests queue in its event loop
(docs/frontdoor.md). Every API process is already a replica like any other (its own group commit,
pools and notifications), so N of them on one host share one listening socket: the parent binds
it and forks the N, the kernel hands each accepted connection to one of them. The parent only
supervises: it forwards SIGTERM and SIGINT (each process finishes what it has accepted), and
forks a process that dies unasked again, after a pause that grows while they keep dying. A
process also ends when the parent does (``PR_SET_PDEATHSIG``), so none outlives a killed parent
holding the port.

The operators' listener (``/metrics``, ``/dashboard``) runs in the first process. The
processes count into prometheus_client's multiprocess files, and its ``/metrics`` adds up every
process's.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import time
from pathlib import Path
from types import FrameType

from batchserve.core import loops
from batchserve.core.logs import get_logger
from batchserve.core.metrics import enable_multiprocess, multiprocess_dir, remove_multiprocess_dir
from batchserve.core.settings import Settings

log = get_logger("batchserve.api")

_PR_SET_PDEATHSIG = 1
# A process that dies within this long of its start counts as failing to start: the pause
# before the next fork doubles, up to the cap.
_QUICK_DEATH_S = 10.0
_MAX_PAUSE_S = 30.0


def listening_socket(host: str, port: int, backlog: int = 2048) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock


class ApiProcesses:
    def __init__(self, settings: Settings, host: str, port: int) -> None:
        self.settings = settings
        self.host = host
        self.port = port
        self.processes = settings.api_processes
        self._children: dict[int, int] = {}  # pid -> index
        self._started: dict[int, float] = {}  # index -> when its current process started
        self._pause_s: dict[int, float] = {}
        self._stopping = False
        self._metrics: Path | None = None

    def run(self) -> int:
        if self.settings.metrics_port is not None:
            self._metrics = multiprocess_dir("api")
            enable_multiprocess(self._metrics)  # before the first metric, before the forks
        sock = listening_socket(self.host, self.port)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._stop)
        log.info("api_processes", processes=self.processes, host=self.host, port=self.port)
        try:
            for index in range(self.processes):
                self._fork(index, sock)
            while self._children:
                try:
                    pid, status = os.wait()
                except ChildProcessError:
                    break
                if pid not in self._children:
                    continue
                index = self._children.pop(pid)
                if self._stopping:
                    continue
                self._respawn(index, os.waitstatus_to_exitcode(status), sock)
        finally:
            sock.close()
            if self._metrics is not None:
                remove_multiprocess_dir(self._metrics)
        return 0

    def _stop(self, signum: int, _frame: FrameType | None) -> None:
        self._stopping = True
        for pid in list(self._children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

    def _respawn(self, index: int, code: int, sock: socket.socket) -> None:
        lived_s = time.monotonic() - self._started.get(index, 0.0)
        pause = self._pause_s.get(index, 0.5) if lived_s < _QUICK_DEATH_S else 0.5
        log.error("api_process_died", index=index, exit_code=code, restart_in_s=pause)
        self._pause_s[index] = min(pause * 2, _MAX_PAUSE_S)
        time.sleep(pause)
        if not self._stopping:
            self._fork(index, sock)

    def _fork(self, index: int, sock: socket.socket) -> None:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child (its exit status is what the tests see)
            code = 1
            try:
                code = self._child(index, sock)
            finally:
                os._exit(code)
        self._children[pid] = index
        self._started[index] = time.monotonic()

    def _child(self, index: int, sock: socket.socket) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)  # uvicorn installs its own
        end_with_parent()
        from batchserve.api.main import create_app
        from batchserve.api.server import serve_api

        settings = self.settings
        if index > 0:  # the first process alone serves the operators' listener
            settings = settings.model_copy(update={"metrics_port": None})
        app = create_app(settings)
        loops.tune_gc()
        loops.run(
            serve_api(
                app,
                settings,
                self.host,
                self.port,
                sockets=[sock],
                timeout_graceful_shutdown=10,
            )
        )
        return 0


def end_with_parent() -> None:
    """SIGTERM this process when its parent dies (Linux), so none holds the port after it
    (an API process; the bench's baseline server)."""
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
