"""Test hosts on one machine: Linux network namespaces, each with its own address, joined to the
root namespace by a veth pair, so that roles run on separate hosts of a real (virtual) network
and a host's link can be cut, or the whole host killed, while the others go on.

::

    root namespace: the test process, tcp_forward, the shared servers on 127.0.0.1
      bs<tok>0r 10.213.X.1/30 ── veth ── bs<tok>0h 10.213.X.2/30   namespace bs-<run>-<n>-a
      bs<tok>1r 10.213.X.5/30 ── veth ── bs<tok>1h 10.213.X.6/30   namespace bs-<run>-<n>-b
      ...
      tcp_forward: 10.213.X.{1,5,...}:{5432,5672,6379} -> 127.0.0.1:{same port}

Each host has loopback and one link: a /30 of its own, with the root-side end as its gateway
(no routing between hosts: ip_forward is left alone). Roles in a host reach the servers only
through the forwarder on their gateway; the test process reaches the hosts' addresses directly.
``X`` is the first 10.213.X.0/24 that overlaps no address or route of this machine; ``<run>``
is ``t<pid>x<hex>`` (the pytest run's id) and ``<n>`` counts the Hosts this process made.

:meth:`Hosts.cut` sets the root-side end of the host's link down: every packet in flight either
way is dropped (the veth drops frames towards a down peer; the root side loses its route to the
host), TCP connections stall and resume after :meth:`Hosts.heal`, as on a real partition. The
host's processes get no error; only the host's own end of the link shows NO-CARRIER.
:meth:`Hosts.kill_host` SIGKILLs every process in the namespace (``ip netns pids``).

Names carry the owner's pid (``bs-t<pid>x<hex>-...``; links carry it in their alias): at start,
namespaces and links of runs whose process is gone (or was started after them: a reused pid)
are deleted with every process in them, so a rerun after a crash starts clean.
"""

from __future__ import annotations

import contextlib
import ipaddress
import itertools
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from batchserve.core.pids import alive
from batchserve.testing.deployment import ROOT, Role, Stack

NETNS_DIR = Path("/run/netns")
PREFIX = "bs-"
SUBNETS = ipaddress.IPv4Network("10.213.0.0/16")
SERVER_PORTS = (5432, 5672, 6379)
_NAME = re.compile(r"^bs-t?(\d+)x[0-9a-f]+-")
_SEQUENCE = itertools.count(1)  # Hosts made by this process


class HostsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no ``ip``)."""


def ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check, timeout=30)


@dataclass
class Host:
    name: str  # the test's name for it: "a", "api", ...
    netns: str
    root_link: str  # the root namespace's end of the veth pair (cut here)
    host_link: str
    gateway: str  # the root-side address: the forwarder listens here
    address: str  # the host's own address
    pids: list[int] = field(default_factory=list)  # processes started in it

    def url(self, url: str) -> str:
        """``url`` with the loopback address replaced by this host's way to the servers."""
        return url.replace("127.0.0.1", self.gateway).replace("localhost", self.gateway)


def _started_at(pid: int) -> float | None:
    """When ``pid`` started (seconds since the epoch), or None if it is gone (or a zombie)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        if fields[0] in ("Z", "X"):  # a zombie: dead, not yet reaped by its parent
            return None
        ticks = int(fields[19])
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return time.time() - uptime + ticks / os.sysconf("SC_CLK_TCK")


def _stale(label: str, made_at: float | None) -> bool:
    """Whether a namespace or link named/aliased ``label`` belongs to a run that is over."""
    match = _NAME.match(label)
    if match is None:
        return False  # not ours
    pid = int(match.group(1))
    if pid == os.getpid():
        return False
    started = _started_at(pid)
    if started is None or not alive(pid):
        return True
    # The pid was reused: the process now under it started after the namespace was made.
    return made_at is not None and started > made_at + 1.0


def netns_pids(netns: str) -> list[int]:
    out = ip("netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def _kill_netns(netns: str, timeout_s: float = 10.0) -> None:
    """SIGKILL every process in ``netns`` until none is left (a dying parent may fork)."""
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        pids = netns_pids(netns)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _forwarders_of(prefix: str) -> list[int]:
    """Pids of tcp_forward processes started for a run (their ``--tag`` starts with
    ``prefix``)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"batchserve.testing.tcp_forward" in argv and any(
            a.startswith(prefix.encode()) for a in argv
        ):
            found.append(int(proc.name))
    return found


def clean_stale() -> list[str]:
    """Delete namespaces and links (with every process in them) of runs that are over; the
    names deleted."""
    deleted = []
    if NETNS_DIR.is_dir():
        for entry in NETNS_DIR.iterdir():
            if not entry.name.startswith(PREFIX):
                continue
            try:
                made_at = entry.stat().st_mtime
            except OSError:
                made_at = None
            if _stale(entry.name, made_at):
                _kill_netns(entry.name)
                ip("netns", "del", entry.name, check=False)
                deleted.append(entry.name)
    for line in ip("-o", "link", "show", check=False).stdout.splitlines():
        # "7: bsab12c0r@if6: <...> ... \    alias bs-t123x0a1b2c-a"
        match = re.match(r"^\d+:\s+([^:@\s]+)", line)
        alias = re.search(r"\balias (\S+)", line)
        if match and alias and alias.group(1).startswith(PREFIX) and _stale(alias.group(1), None):
            ip("link", "del", match.group(1), check=False)
            deleted.append(match.group(1))
    runs = {m.group(0) for m in (_NAME.match(d) for d in deleted) if m}
    for run in runs:
        for pid in _forwarders_of(run):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    return deleted


def _networks_in_use() -> list[ipaddress.IPv4Network]:
    """Networks of this machine's IPv4 addresses and routes (the default route aside)."""
    used = []
    for line in ip("-4", "-o", "addr", "show", check=False).stdout.splitlines():
        match = re.search(r"inet (\S+)", line)
        if match:
            used.append(ipaddress.IPv4Interface(match.group(1)).network)
    for line in ip("-4", "route", "show", "table", "all", check=False).stdout.splitlines():
        words = line.split()
        if words and words[0] in ("local", "broadcast", "unicast"):
            words = words[1:]
        with contextlib.suppress(ValueError, IndexError):
            used.append(ipaddress.IPv4Network(words[0], strict=False))
    return used


def _free_subnet() -> ipaddress.IPv4Network:
    used = _networks_in_use()
    for net in SUBNETS.subnets(new_prefix=24):
        if not any(net.overlaps(other) for other in used):
            return net
    raise HostsUnavailable(f"no free /24 in {SUBNETS}")


class Hosts:
    """Test hosts; use as a context manager (:func:`hosts`)."""

    def __init__(
        self, names: Sequence[str], run: str | None = None, log_dir: Path | None = None
    ) -> None:
        self.run_id = run or f"t{os.getpid()}x{secrets.token_hex(3)}"
        if not _NAME.match(f"{PREFIX}{self.run_id}-"):
            raise ValueError(f"run {self.run_id!r}: t<pid>x<hex>, the pid of this process")
        self.label = f"{PREFIX}{self.run_id}-{next(_SEQUENCE)}"
        self.token = secrets.token_hex(3)
        self.names = list(names)
        self.log_dir = log_dir  # the forwarder's log (its errors: else on this stderr)
        self.hosts: dict[str, Host] = {}
        self.forwarder: subprocess.Popen[bytes] | None = None
        self.started: list[subprocess.Popen[bytes]] = []

    def __getitem__(self, name: str) -> Host:
        return self.hosts[name]

    # -- making and unmaking -------------------------------------------------------------

    def create(self) -> None:
        clean_stale()
        probe = f"{self.label}-probe"
        made = ip("netns", "add", probe, check=False)
        if made.returncode != 0:
            raise HostsUnavailable(f"ip netns add: {made.stderr.strip() or made.returncode}")
        ip("netns", "del", probe, check=False)
        subnet = _free_subnet()
        for index, name in enumerate(self.names):
            base = subnet.network_address + 4 * index
            host = Host(
                name=name,
                netns=f"{self.label}-{name}",
                root_link=f"bs{self.token}{index}r",
                host_link=f"bs{self.token}{index}h",
                gateway=str(base + 1),
                address=str(base + 2),
            )
            self.hosts[name] = host
            ip("netns", "add", host.netns)
            ip("-n", host.netns, "link", "set", "lo", "up")
            ip(
                "link", "add", host.root_link, "type", "veth",
                "peer", "name", host.host_link, "netns", host.netns,
            )  # fmt: skip
            ip("link", "set", host.root_link, "alias", host.netns)
            ip("addr", "add", f"{host.gateway}/30", "dev", host.root_link)
            ip("link", "set", host.root_link, "up")
            ip("-n", host.netns, "addr", "add", f"{host.address}/30", "dev", host.host_link)
            ip("-n", host.netns, "link", "set", host.host_link, "up")
            ip("-n", host.netns, "route", "add", "default", "via", host.gateway)
        self._start_forwarder()

    def _start_forwarder(self) -> None:
        argv = [
            sys.executable, "-m", "batchserve.testing.tcp_forward",
            "--parent", str(os.getpid()), "--tag", self.label,
            "--ports", ",".join(str(p) for p in SERVER_PORTS),
            *(h.gateway for h in self.hosts.values()),
        ]  # fmt: skip
        log = open(self.log_dir / "tcp_forward.log", "ab") if self.log_dir else None  # noqa: SIM115
        try:
            self.forwarder = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=log, start_new_session=True, cwd=ROOT
            )
        finally:
            if log is not None:
                log.close()
        assert self.forwarder.stdout is not None
        line = self.forwarder.stdout.readline()
        if line.strip() != b"ready":
            raise RuntimeError(f"tcp_forward did not start (exit {self.forwarder.poll()})")

    def close(self) -> None:
        """Kill what was started here and everything in our namespaces; delete them."""
        for host in self.hosts.values():
            _kill_netns(host.netns)
        for process in self.started:
            if process.poll() is None:  # not reaped yet: the pid is still this one's
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=10)
        if self.forwarder is not None:
            self.forwarder.kill()
            self.forwarder.wait(timeout=10)
            if self.forwarder.stdout is not None:
                self.forwarder.stdout.close()
        for host in self.hosts.values():
            ip("link", "del", host.root_link, check=False)  # deletes both ends
            ip("netns", "del", host.netns, check=False)

    # -- processes -----------------------------------------------------------------------

    def run(
        self,
        host: str,
        argv: Sequence[str],
        env: dict[str, str] | None = None,
        log: Path | IO[bytes] | None = None,
        cwd: Path | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside ``host`` (``ip netns exec``, which execs it: the pid is the
        program's), in its own session, output appended to ``log``."""
        target = self.hosts[host]
        out: IO[bytes] | int = subprocess.DEVNULL
        opened = None
        if isinstance(log, Path):
            out = opened = open(log, "ab")  # noqa: SIM115 - the child owns it
        elif log is not None:
            out = log
        try:
            process = subprocess.Popen(
                ["ip", "netns", "exec", target.netns, *argv],
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        finally:
            if opened is not None:
                opened.close()
        self.started.append(process)
        target.pids.append(process.pid)
        return process

    def pids(self, host: str) -> list[int]:
        """Every process now in ``host``'s namespace."""
        return netns_pids(self.hosts[host].netns)

    def host_of(self, pid: int) -> str | None:
        for name, host in self.hosts.items():
            if pid in netns_pids(host.netns):
                return name
        return None

    # -- faults --------------------------------------------------------------------------

    def cut(self, host: str) -> None:
        """Take ``host``'s link down at the root-side end: packets either way are dropped."""
        ip("link", "set", self.hosts[host].root_link, "down")

    def heal(self, host: str) -> None:
        ip("link", "set", self.hosts[host].root_link, "up")

    def kill_host(self, host: str) -> list[int]:
        """SIGKILL every process in ``host``; the pids killed."""
        pids = self.pids(host)
        _kill_netns(self.hosts[host].netns)
        for process in self.started:
            process.poll()  # reap the ones that died
        return pids

    def reachable(self, host: str, port: int, timeout_s: float = 0.5) -> bool:
        """Whether ``host``'s address answers on ``port`` from the root namespace."""
        try:
            with socket.create_connection((self.hosts[host].address, port), timeout=timeout_s):
                return True
        except OSError:
            return False


@contextlib.contextmanager
def hosts(
    names: Sequence[str], run: str | None = None, log_dir: Path | None = None
) -> Iterator[Hosts]:
    """Hosts named ``names`` (namespaces ``bs-<run>-<name>``), deleted at the end with every
    process in them and the forwarder to the servers on 127.0.0.1."""
    made = Hosts(names, run, log_dir)
    try:
        made.create()
        yield made
    finally:
        made.close()


# -- a deployment across hosts -----------------------------------------------------------------

SERVER_URLS = ("BATCHSERVE_DATABASE_URL", "BATCHSERVE_BROKER_URL", "BATCHSERVE_REDIS_URL")


@dataclass
class HostStack(Stack):
    """A :class:`Stack` whose roles run on :class:`Hosts`: each role is exec'd in its host
    (``ip netns exec``; no warm fork: a fork would stay in the test's namespace), with the
    servers' URLs pointing at the host's gateway (the forwarder). ``env`` keeps the loopback
    URLs, for the test process; :attr:`url` is the API's address on its host."""

    net: Hosts | None = None
    placement: dict[str, str] = field(default_factory=dict)  # role -> host
    api_host: str | None = None

    @property
    def hosts(self) -> Hosts:
        assert self.net is not None, "HostStack(net=...)"
        return self.net

    @property
    def url(self) -> str:
        if self.api_host is None:
            return super().url
        return f"http://{self.hosts[self.api_host].address}:{self.port}"

    def host_env(self, host: str) -> dict[str, str]:
        where = self.hosts[host]
        return {k: where.url(self.env[k]) for k in SERVER_URLS if k in self.env}

    def start(
        self,
        name: str,
        *args: str,
        env: dict[str, str] | None = None,
        python: str | None = None,
        host: str | None = None,
    ) -> Role:
        """Start a role on ``host`` (the one it ran on, on a restart without ``host``)."""
        if host is not None:
            self.placement[name] = host
        where = self.placement.get(name)
        if where is None:
            return super().start(name, *args, env=env, python=python)
        role = self.roles.get(name)
        if role is None or args:
            argv = [python or sys.executable, "-m", "batchserve.cli", *args]
            role = Role(name, argv, self.log_dir / f"{name.replace(':', '_')}.log")
            self.roles[name] = role
        environment = self.role_env(self.host_env(where), env)
        role.process = self.hosts.run(where, role.argv, environment, role.log_path, cwd=ROOT)
        return role

    def start_api_on(self, host: str, name: str = "api", env: dict[str, str] | None = None) -> Role:
        """The API on ``host``'s address (its operator endpoints on the host's loopback)."""
        self.api_host = host
        env = {"BATCHSERVE_METRICS_PORT": str(self.ops_port), **(env or {})}
        address = ("--host", self.hosts[host].address, "--port", str(self.port))
        role = self.start(name, "api", *address, env=env, host=host)
        self.wait_http()
        return role

    def host_of_worker(self, worker: str) -> str | None:
        """The host of a ``batches.worker`` (``model@hostname:pid``): whose namespace holds
        the pid (every host shares this machine's hostname and pid space)."""
        pid = worker.rsplit(":", 1)[-1]
        return self.hosts.host_of(int(pid)) if pid.isdigit() else None
