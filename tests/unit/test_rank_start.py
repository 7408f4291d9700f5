"""How the launcher starts ranks (securevfl.app.launcher.rank_context): forked from a
fork server by default, fresh interpreters on request, and either way with the
environment of the launch."""

from __future__ import annotations

import multiprocessing.forkserver
import os
import subprocess
import sys
from pathlib import Path

import pytest

from securevfl.app import rank_server
from securevfl.app.launcher import START_METHOD_ENV, _rank_main, rank_context
from securevfl.errors import ConfigError
from tests.support.protocols import ROOT


def report(path: str, key: str) -> None:
    """A stand-in rank: writes what it sees (the variable, its parent pid)."""
    Path(path).write_text(f"{os.environ.get(key, '<unset>')} {os.getppid()}")


def start(tmp_path: Path, name: str) -> tuple[str, int]:
    ctx = rank_context()
    out = tmp_path / name
    launcher = os.getpid()  # the rank ends with it
    p = ctx.Process(
        target=_rank_main, args=(report, dict(os.environ), launcher, str(out), "SVFL_PROBE_VALUE")
    )
    p.start()
    p.join(60)
    assert p.exitcode == 0
    value, ppid = out.read_text().split()
    return value, int(ppid)


def test_ranks_are_forked_from_a_fork_server_and_see_the_environment_of_their_launch(tmp_path, monkeypatch):
    monkeypatch.delenv(START_METHOD_ENV, raising=False)
    assert rank_context().get_start_method() == "forkserver"
    monkeypatch.setenv("SVFL_PROBE_VALUE", "first")
    first, server = start(tmp_path, "a")
    monkeypatch.setenv("SVFL_PROBE_VALUE", "second")  # after the server started
    second, server_again = start(tmp_path, "b")
    assert (first, second) == ("first", "second")
    assert server == server_again != os.getpid()  # the same server forked both


def test_spawn_on_request_starts_children_of_the_launcher(tmp_path, monkeypatch):
    monkeypatch.setenv(START_METHOD_ENV, "spawn")
    monkeypatch.setenv("SVFL_PROBE_VALUE", "x")
    assert rank_context().get_start_method() == "spawn"
    assert start(tmp_path, "c") == ("x", os.getpid())


@pytest.mark.parametrize("value", ["fork", "threads"])
def test_an_unknown_start_method_is_refused_naming_the_variable(monkeypatch, value):
    monkeypatch.setenv(START_METHOD_ENV, value)
    with pytest.raises(ConfigError, match=f"{START_METHOD_ENV}='{value}'.*forkserver"):
        rank_context()


STOP_SERVER = """
import multiprocessing.forkserver as fs, os, time
from securevfl.app.rank_server import stop_rank_server
from securevfl.runtime.lifeline import alive
stop_rank_server()  # no server yet: nothing to do
fs.ensure_running()
first = fs._forkserver._forkserver_pid
t0 = time.monotonic()
stop_rank_server()
took = time.monotonic() - t0
fs.ensure_running()  # a later launch in this process gets a fresh server
second = fs._forkserver._forkserver_pid
print(alive(first), round(took, 3), second not in (None, first), alive(second))
"""


def test_a_stopped_command_ends_its_fork_server_at_once():
    """securevfl.cli ends the fork server of a command stopped by Ctrl-C or SIGTERM
    with SIGKILL (no interpreter teardown, which would keep the command's stderr open
    for about 1 CPU s more); the server is gone and reaped when the call returns, and
    a later launch in that process starts a new one. (A subprocess: this worker's own
    fork server is left alone.)"""
    out = subprocess.run(
        [sys.executable, "-c", STOP_SERVER], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    gone, took, fresh, fresh_alive = out.stdout.split()
    assert (gone, fresh, fresh_alive) == ("False", "True", "True"), out.stdout
    assert float(took) < 1.0, out.stdout


def test_a_temporary_folder_too_long_for_the_servers_socket_is_said(monkeypatch: pytest.MonkeyPatch):
    """The fork server's socket lives in the temporary folder; a Unix socket's path holds at
    most 107 bytes, so a long TMPDIR is the user's to fix: said naming TMPDIR, no traceback."""

    def too_long() -> None:
        raise OSError("AF_UNIX path too long")

    monkeypatch.setattr(multiprocessing.forkserver, "ensure_running", too_long)
    with pytest.raises(ConfigError, match="set TMPDIR to a shorter folder") as err:
        rank_server.ensure_server()
    assert err.value.path == "TMPDIR"
