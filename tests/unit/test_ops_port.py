"""`serve`'s operator port: the one after --port, or a free one when that is taken (a clean-clone
CI run's embedded server died binding its ops listener to a port another test's process held)."""

from __future__ import annotations

import socket

from batchserve.cli.main import _default_ops_port


def _free_pair() -> int:
    """A port whose next one is free too."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = int(probe.getsockname()[1])
        if port < 65535:
            with socket.socket() as after:
                try:
                    after.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port


def test_the_port_after_when_it_is_free() -> None:
    port = _free_pair()
    assert _default_ops_port("127.0.0.1", port) == port + 1


def test_another_free_port_when_the_one_after_is_taken() -> None:
    port = _free_pair()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port + 1))
        holder.listen()
        chosen = _default_ops_port("127.0.0.1", port)
        assert chosen not in (port, port + 1)
        with socket.socket() as check:
            check.bind(("127.0.0.1", chosen))  # free: the server can take it
