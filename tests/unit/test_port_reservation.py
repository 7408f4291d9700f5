"""The local launcher's rendezvous port is held from the moment it is chosen until
the launch has ended (securevfl.app.launcher.reserve_port): choosing a free port and
releasing it before rank 0 listens let another process take it in between, and a
local `predict` once failed after a minute of start-up with "Address already in
use"."""

from __future__ import annotations

import errno
import socket

import pytest

from securevfl.app.launcher import RankGroup, reserve_port
from securevfl.runtime.rendezvous import listen_socket


def _bind(port: int) -> None:
    """Another process's plain bind of ``port`` on loopback (no SO_REUSEADDR)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))


def test_a_reserved_port_goes_to_rank_0_and_no_one_else():
    group = RankGroup([], reserve_port())
    assert group.reservation is not None
    port = group.reservation.getsockname()[1]
    with pytest.raises(OSError) as exc:
        _bind(port)  # what took the port in the race
    assert exc.value.errno == errno.EADDRINUSE
    listener = listen_socket("127.0.0.1", port)  # rank 0 still listens there
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    finally:
        listener.close()
    with pytest.raises(OSError):
        _bind(port)  # rank 0 closed its store; the launch has not ended
    group.release()
    _bind(port)  # the launch has ended: the port is free again
    group.release()  # releasing twice is harmless
