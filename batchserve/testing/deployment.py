"""A local deployment of batchserve roles as real processes, started and stopped by pid.

Used by ``batchserve chaos`` and by the end-to-end and chaos tests: each role is a process
(``python -m batchserve.cli <role>``, forked from a warm template when it runs on this
interpreter: :mod:`batchserve.testing.forkserver`) with its own log file, on one database, one
queue and key namespace, and one API port.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import httpx
import redis

from batchserve.testing import forkserver
from batchserve.testing.forkserver import ForkedProcess

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


STARTUP_ENV = frozenset({"LD_PRELOAD", "PYTHONPATH"})


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def new_log_dir(prefix: str, root: Path | None = None) -> Path:
    """A new folder named ``prefix``* for a deployment's logs, in ``root`` (made if missing),
    else in the temporary directory."""
    if root is not None:
        root.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=prefix, dir=root))


def terminate(
    process: subprocess.Popen[Any] | ForkedProcess,
    timeout_s: float,
    sig: int = signal.SIGTERM,
) -> None:
    """Stop a process this code started: ``sig`` (SIGTERM: a graceful stop), then SIGKILL if it
    has not exited within ``timeout_s``. Returns once it has exited and been reaped."""
    if process.poll() is not None:
        return
    process.send_signal(sig)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=10)


@dataclass
class Role:
    name: str
    argv: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | ForkedProcess | None = None

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class Stack:
    """A deployment of batchserve roles on its own database, queues and port."""

    env: dict[str, str]
    log_dir: Path
    port: int = field(default_factory=free_port)
    ops_port: int = field(default_factory=free_port)  # the API's /metrics and dashboard
    roles: dict[str, Role] = field(default_factory=dict)
    keys: dict[str, str] = field(default_factory=dict)  # tenant -> API key
    # Set by :meth:`interrupt`: no role starts any more and every wait gives up.
    interrupted: threading.Event = field(default_factory=threading.Event)

    def interrupt(self) -> None:
        """Whoever uses the deployment is stopping (a SIGTERM, a Ctrl-C) while a thread may be
        starting roles or waiting for them: that thread gives up at its next step, so the
        deployment's stop, after it, finds every role it will ever have."""
        self.interrupted.set()

    def _check_interrupted(self) -> None:
        if self.interrupted.is_set():
            raise RuntimeError("the deployment is stopping")

    @property
    def scratch_dir(self) -> Path:
        """The roles' temporary directory (their ``TMPDIR``), in the log directory: what a role
        killed mid-run leaves there (its scratch folders, multiprocessing's ``pymp-*``) goes
        with the deployment (:meth:`remove_scratch`) instead of piling up in ``/tmp``."""
        return self.log_dir / "tmp"

    def role_env(self, *layers: dict[str, str] | None) -> dict[str, str]:
        """A role's environment: the deployment's, its temporary directory, then ``layers``."""
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        environment = {**self.env, "TMPDIR": str(self.scratch_dir)}
        for layer in layers:
            environment.update(layer or {})
        return environment

    def remove_scratch(self) -> None:
        """Remove the roles' temporary directory once none of them runs."""
        if not any(role.alive() for role in self.roles.values()):
            shutil.rmtree(self.scratch_dir, ignore_errors=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def ops_url(self) -> str:
        return f"http://127.0.0.1:{self.ops_port}"

    def make_key(self, tenant: str = "default", **quotas: Any) -> str:
        """A new API key for ``tenant`` in this deployment's (migrated) database."""
        from batchserve.cli.keys import create_key_blocking

        return create_key_blocking(self.env["BATCHSERVE_DATABASE_URL"], tenant, **quotas)

    def auth(self, tenant: str = "default") -> dict[str, str]:
        """``Authorization`` for ``tenant``, one key per tenant made on first use."""
        if tenant not in self.keys:
            self.keys[tenant] = self.make_key(tenant)
        return {"Authorization": f"Bearer {self.keys[tenant]}"}

    def start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        python: str | None = None,
    ) -> Role:
        """Start a role (``api``, ``batcher``, ``worker``, ``maintenance``) under ``name``,
        with this interpreter or ``python`` (an engine's own environment).

        Without ``args`` a known role restarts with the arguments it had."""
        self._check_interrupted()
        role = self.roles.get(name)
        log_path = self.log_dir / f"{name.replace(':', '_')}.log"
        if role is None or args:
            role = Role(name, [python or sys.executable, "-m", "batchserve.cli", *args], log_path)
            self.roles[name] = role
        environment = self.role_env(env)
        # A warm fork cannot take what acts at an interpreter's start (a preload, a
        # sitecustomize on PYTHONPATH: a host with a skewed clock): such a role is exec'd.
        warm = role.argv[0] == sys.executable and not STARTUP_ENV & (env or {}).keys()
        template = forkserver.shared() if warm else None
        if template is not None:  # this interpreter, warm: the imports are done once
            role.process = template.spawn(
                role.argv[3:], env=environment, cwd=ROOT, log=role.log_path
            )
            return role
        log = open(role.log_path, "ab")  # noqa: SIM115 - the child owns it
        role.process = subprocess.Popen(
            role.argv,
            env=environment,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        return role

    def start_api(
        self, name: str = "api", env: dict[str, str] | None = None, *options: str
    ) -> Role:
        """The API on this deployment's port, its operator endpoints on ``ops_port``."""
        env = {"BATCHSERVE_METRICS_PORT": str(self.ops_port), **(env or {})}
        address = ("--host", "127.0.0.1", "--port", str(self.port))
        role = self.start(name, "api", *address, *options, env=env)
        self.wait_http()
        return role

    def start_all(self, models: dict[str, int]) -> None:
        """API, batcher, maintenance and one worker per model with the given slots."""
        self.start("batcher", "batcher")
        self.start("maintenance", "maintenance")
        for model, slots in models.items():
            self.start(f"worker:{model}", "worker", "--model", model, "--slots", str(slots))
        self.start_api()
        for model, slots in models.items():
            self.wait_slots(model, slots)

    def wait_http(self, timeout_s: float = 30.0) -> None:
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            self._check_interrupted()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            time.sleep(0.1)
        raise RuntimeError(f"the API did not come up; see {self.log_dir}")

    def wait_slots(self, model: str, slots: int, timeout_s: float = 180.0) -> None:
        """Wait until workers of ``model`` announce ``slots`` in total. An engine worker loads
        its model and measures itself first: over a minute on a loaded 2-core machine."""
        client = redis.Redis.from_url(self.env["BATCHSERVE_REDIS_URL"])
        prefix = self.env["BATCHSERVE_NAMESPACE"]
        give_up = time.monotonic() + timeout_s
        try:
            while time.monotonic() < give_up:
                self._check_interrupted()
                live = client.zrangebyscore(f"{prefix}.workers.{model}", time.time(), "+inf")
                names = [str(w, "utf-8") if isinstance(w, bytes) else str(w) for w in live]
                values = client.hmget(f"{prefix}.worker_slots.{model}", names) if names else []
                # A batch worker announces "slots", an engine worker "sequences/tokens".
                announced = [v.decode() if isinstance(v, bytes) else str(v) for v in values if v]
                if sum(int(v.partition("/")[0]) for v in announced) >= slots:
                    return
                time.sleep(0.1)
        finally:
            client.close()
        raise RuntimeError(
            f"workers of {model} did not announce {slots} slot(s) in {timeout_s:.0f} s;"
            f" see {self.log_dir}"
        )

    def signal(self, name: str, sig: int) -> None:
        os.kill(self.roles[name].pid, sig)

    def kill(self, name: str) -> None:
        role = self.roles[name]
        if role.alive():
            os.kill(role.pid, signal.SIGKILL)
            assert role.process is not None
            role.process.wait(timeout=10)

    def stop(self, name: str, timeout_s: float = 20.0) -> None:
        role = self.roles[name]
        if not role.alive():
            return
        assert role.process is not None
        terminate(role.process, timeout_s)

    def child_pids(self, name: str) -> list[int]:
        """Pids of a role's child processes (a Celery worker's pool)."""
        out = subprocess.run(
            ["pgrep", "-P", str(self.roles[name].pid)], capture_output=True, text=True, check=False
        ).stdout
        return [int(p) for p in out.split()]

    def stop_all(self, timeout_s: float = 10.0) -> None:
        """SIGTERM every live role at once, then wait for them together (each role's graceful
        stop takes up to seconds: one after another, a deployment took that many times longer),
        and SIGKILL whatever is left at the deadline."""
        live = [role for role in self.roles.values() if role.alive()]
        for role in live:
            with contextlib.suppress(ProcessLookupError):
                # A stopped (SIGSTOP) process must be continued to hear SIGTERM.
                os.kill(role.pid, signal.SIGCONT)
                os.kill(role.pid, signal.SIGTERM)
        give_up = time.monotonic() + timeout_s
        for role in live:
            assert role.process is not None
            try:
                role.process.wait(timeout=max(0.1, give_up - time.monotonic()))
            except subprocess.TimeoutExpired:
                role.process.kill()
                role.process.wait(timeout=10)
        self.remove_scratch()

    def remove_namespace(self, models: list[str]) -> None:
        """Delete what the deployment made on RabbitMQ (its queues: a quorum queue left behind
        costs RabbitMQ a Raft log) and on Redis (its keys), once its roles are stopped."""
        namespace = self.env["BATCHSERVE_NAMESPACE"]
        delete_queues(self.env["BATCHSERVE_BROKER_URL"], namespace_queues(namespace, models))
        try:
            delete_keys(self.env["BATCHSERVE_REDIS_URL"], namespace)
        except redis.RedisError as error:
            print(f"deployment: its Redis keys not removed: {error}", file=sys.stderr)

    def discard(self) -> None:
        """SIGKILL every role and whatever it started (each role leads its own process group),
        for a test that is done with its deployment: a graceful stop costs a Celery worker 4 s
        (its pool processes sleep a second on exit), and nothing after the test looks at how
        the roles ended."""
        for role in self.roles.values():
            if role.process is not None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(role.pid, signal.SIGKILL)
        for role in self.roles.values():
            if role.process is not None:
                role.process.wait(timeout=10)
        self.remove_scratch()

    def logs(self, name: str) -> str:
        path = self.roles[name].log_path
        return path.read_text(errors="replace") if path.exists() else ""


def namespace_queues(namespace: str, models: list[str]) -> list[str]:
    """Every queue a deployment under ``namespace`` may declare for ``models``: each model's
    request queues (both lanes) and batch queue, and the webhooks' queue."""
    from batchserve.core.broker import requests_queue_name
    from batchserve.core.domain import Lane
    from batchserve.core.settings import Settings
    from batchserve.workers.celery_app import batches_queue_name, webhooks_queue_name

    # The roles' own naming, from the namespace alone (nothing else of the settings is read).
    settings = Settings.model_construct(namespace=namespace)
    names = [webhooks_queue_name(settings)]
    for model in models:
        names += [requests_queue_name(namespace, model, lane) for lane in Lane]
        names.append(batches_queue_name(settings, model))
    return names


def delete_queues(broker_url: str, names: list[str]) -> None:
    """Delete these RabbitMQ queues, over AMQP (best effort: the broker unreachable, nothing)."""
    from kombu import Connection

    with contextlib.suppress(OSError), Connection(broker_url, connect_timeout=5) as amqp:
        channel = amqp.channel()
        for name in names:
            try:
                channel.queue_delete(name)
            except Exception:  # a closed channel: open another and go on
                channel = amqp.channel()


def delete_keys(redis_url: str, prefix: str) -> None:
    """Delete the Redis keys whose names start with ``prefix``."""
    client = redis.Redis.from_url(redis_url)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


async def settled(stack: Stack, call: Callable[..., T], *args: Any) -> T:
    """``call(*args)`` in a thread, as ``asyncio.to_thread``, except that a caller cancelled
    meanwhile (a SIGTERM, a Ctrl-C) interrupts the stack (its starts and waits give up at their
    next step) and waits for the thread to end before its cancellation goes on: the cleanup
    that follows finds every role the thread started."""
    running = asyncio.ensure_future(asyncio.to_thread(call, *args))
    try:
        return await asyncio.shield(running)
    except asyncio.CancelledError:
        stack.interrupt()
        with contextlib.suppress(Exception):
            await running
        raise


def run_stoppable(
    main: Coroutine[Any, Any, T],
    command: str,
    run: Callable[[Coroutine[Any, Any, T]], T] = asyncio.run,
) -> T:
    """``run(main)`` for a command that runs a deployment of its own (``bench``, ``chaos``): a
    Ctrl-C or a SIGTERM cancels ``main``, whose cleanup stops and removes the deployment (its
    starts and faults in flight waited out first: :func:`settled`), and the command exits
    128 + the signal's number (a second signal cuts that cleanup short)."""
    import typer

    stopped_by: list[signal.Signals] = []
    try:
        return run(_stopped_by_signals(main, stopped_by))
    except asyncio.CancelledError:
        if not stopped_by:
            raise
        name = stopped_by[0].name
        typer.echo(f"{command}: stopped by {name}; its deployment is stopped", err=True)
        raise typer.Exit(128 + stopped_by[0]) from None


async def _stopped_by_signals(main: Coroutine[Any, Any, T], stopped_by: list[signal.Signals]) -> T:
    """``main``, cancelled by SIGINT or SIGTERM (where signals can be heard: the main thread),
    the handlers there before put back after."""
    if threading.current_thread() is not threading.main_thread():
        return await main
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None

    def stop(sig: signal.Signals) -> None:
        stopped_by.append(sig)
        task.cancel()

    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in before:
        loop.add_signal_handler(sig, stop, sig)
    try:
        return await main
    finally:
        for sig, handler in before.items():
            loop.remove_signal_handler(sig)
            if handler is not None:  # None: not set from Python, nothing to put back
                signal.signal(sig, handler)
