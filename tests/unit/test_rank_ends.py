"""How a local run's processes end (securevfl.app.launcher, securevfl.app.rank_server,
securevfl.cli, securevfl.runtime.lifeline):

* a launching command stops once on SIGTERM or Ctrl-C: a second signal during the
  stop is ignored (exit code 143 or 130, no traceback), not raised inside the stop;
  one that lands in a weakref callback or a ``__del__`` (where its exception cannot
  propagate) is delivered again, silently, and still stops the command;
* the ranks' fork server starts with SIGINT blocked (a Ctrl-C while its interpreter
  starts prints no traceback), ignores it once ready, and ends the moment its
  launcher does, SIGKILL included;
* a rank ends the processes its user code started, orphans included.

Each runs in a subprocess of its own: this worker's signal handlers and fork server
are left alone."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from securevfl.runtime.lifeline import alive
from tests.support.protocols import ROOT

SIGINT_BIT = 1 << (signal.SIGINT - 1)

STOP_TWICE = """
import os, signal, sys
from securevfl import cli

def command(args):
    os.kill(os.getpid(), signal.{first})  # the first stop, raised here
    raise AssertionError("not stopped")

# the second signal arrives while the command stops (as it ends its fork server)
cli.start_rank_server = lambda: None
cli.stop_rank_server = lambda: os.kill(os.getpid(), signal.{second})
cli.COMMANDS.get = lambda name: command
sys.argv = ["securevfl", "run", "protocol.yaml", "--out", "out"]
sys.exit(cli.main())
"""


@pytest.mark.parametrize(
    ("first", "second", "code", "said"),
    [
        (
            "SIGTERM",
            "SIGTERM",
            143,
            "securevfl: terminated (SIGTERM); every rank this command started was stopped",
        ),
        ("SIGINT", "SIGINT", 130, "securevfl: interrupted"),
        (
            "SIGTERM",
            "SIGINT",
            143,
            "securevfl: terminated (SIGTERM); every rank this command started was stopped",
        ),
    ],
)
def test_a_second_signal_during_a_stop_is_ignored(first: str, second: str, code: int, said: str) -> None:
    """Before, the second signal raised again inside the stop, escaped the command
    with a traceback, and the process ended by the signal itself (-2, -15)."""
    out = subprocess.run(
        [sys.executable, "-c", STOP_TWICE.format(first=first, second=second)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stderr.strip() == said, out.stderr[-2000:]


STOP_IN_CALLBACK = """
import os, signal, sys, time, weakref
from securevfl import cli

class Held:
    def __del__(self):
        if {where!r} == "__del__":
            os.kill(os.getpid(), signal.{sig})  # its handler runs here, inside __del__

def callback(ref):
    if {where!r} == "weakref":
        os.kill(os.getpid(), signal.{sig})  # its handler runs here, inside the callback

def command(args):
    held = Held()
    ref = weakref.ref(held, callback)
    del held  # __del__, then the weakref callback: exceptions there are "unraisable"
    print("went on", file=sys.stderr)  # the stop was swallowed there
    for _ in range(200):
        time.sleep(0.05)
    raise AssertionError("not stopped")

cli.stop_rank_server = lambda: None
cli.COMMANDS.get = lambda name: command
sys.argv = ["securevfl", "run", "protocol.yaml", "--out", "out"]
sys.exit(cli.main())
"""


@pytest.mark.parametrize("where", ["weakref", "__del__"])
@pytest.mark.parametrize(
    ("sig", "code", "said"),
    [
        ("SIGINT", 130, "securevfl: interrupted"),
        ("SIGTERM", 143, "securevfl: terminated (SIGTERM); every rank this command started was stopped"),
    ],
)
def test_a_stop_landing_where_it_cannot_propagate_still_stops_quietly(
    where: str, sig: str, code: int, said: str
) -> None:
    """A stop whose handler runs inside a weakref callback (an import lock's) or a
    ``__del__``: the exception ends the callback and is swallowed there, the command
    goes on, and the stop is raised again in the command moments later. Before,
    Python printed the swallowed stop ("Exception ignored in: ... Traceback ...
    KeyboardInterrupt") and the command ran on, not stopped (here: to its
    AssertionError, exit code 1)."""
    out = subprocess.run(
        [sys.executable, "-c", STOP_IN_CALLBACK.format(where=where, sig=sig)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == code, out.stderr[-2000:]
    assert out.stderr.strip() == f"went on\n{said}", out.stderr[-2000:]


UNRAISABLE = """
import signal, sys
from securevfl import cli

class Broken:
    def __del__(self):
        raise ValueError("a __del__ that fails")

def command(args):
    Broken()
    return 0

cli.COMMANDS.get = lambda name: command
sys.argv = ["securevfl", "run", "protocol.yaml", "--out", "out"]
code = cli.main()
print("hook restored:", sys.unraisablehook is sys.__unraisablehook__, file=sys.stderr)
sys.exit(code)
"""


def test_other_unraisable_exceptions_are_reported_as_before() -> None:
    """The stop's hook passes every other unraisable exception on unchanged, and
    is put back when the command ends."""
    out = subprocess.run(
        [sys.executable, "-c", UNRAISABLE], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "Exception ignored in: <function Broken.__del__" in out.stderr
    assert "ValueError: a __del__ that fails" in out.stderr
    assert "hook restored: True" in out.stderr


SERVER = """
import os, sys, time
import multiprocessing.forkserver as fs
from securevfl.app import rank_server

rank_server.RANK_MODULES.insert(0, "tests.support.sigprobe")  # before anything of the server's own
rank_server.start_rank_server()
print(fs._forkserver._forkserver_pid, flush=True)
time.sleep(120)
"""


def _masks(text: str) -> dict[str, int]:
    return {
        k: int(v, 16)
        for k, v in (line.split(":") for line in text.splitlines() if line.startswith(("SigBlk", "SigIgn")))
    }


@contextlib.contextmanager
def fork_server(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], int, dict[str, int]]]:
    """A process that started the ranks' fork server (:data:`SERVER`); the server's pid
    and the signals it had blocked and ignored as its interpreter started (its first
    preloaded module), once it ignores SIGINT."""
    probe = tmp_path / "probe"
    launcher = subprocess.Popen(
        [sys.executable, "-c", SERVER],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "SVFL_SIGPROBE": str(probe), "PYTHONPATH": str(ROOT)},
    )
    try:
        assert launcher.stdout is not None
        server = int(launcher.stdout.readline())
        deadline = time.monotonic() + 60
        while not (
            probe.exists() and _masks(Path(f"/proc/{server}/status").read_text())["SigIgn"] & SIGINT_BIT
        ):
            assert time.monotonic() < deadline, "the fork server never ignored SIGINT"
            time.sleep(0.05)
        yield launcher, server, _masks(probe.read_text())
    finally:
        launcher.kill()
        launcher.wait()


LINUX = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="/proc, the parent-death signal: Linux"
)


@LINUX
def test_the_fork_server_starts_with_sigint_blocked(tmp_path: Path) -> None:
    """The server's interpreter starts with SIGINT blocked (before, a Ctrl-C while it
    started printed a KeyboardInterrupt traceback from its imports); once its first
    module has run, SIGINT is ignored and unblocked."""
    with fork_server(tmp_path) as (_, server, at_start):
        assert at_start["SigBlk"] & SIGINT_BIT, at_start
        now = _masks(Path(f"/proc/{server}/status").read_text())
        assert now["SigIgn"] & SIGINT_BIT and not now["SigBlk"] & SIGINT_BIT, now


@LINUX
def test_the_fork_server_ends_with_its_launcher(tmp_path: Path) -> None:
    """SIGKILL of the process that started the server ends it at once (before: once
    its alive pipe closed, after an interpreter teardown with torch loaded: 6-7 s at
    load 20 on the 2-core box, with a run's ranks)."""
    with fork_server(tmp_path) as (launcher, server, _):
        time.sleep(0.5)  # the rest of the server's imports
        launcher.kill()
        t0 = time.monotonic()
        while alive(server) and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        took = time.monotonic() - t0
        assert took < 1.0, f"the fork server outlived its launcher by {took:.1f} s"


DESCENDANTS = """
import subprocess, sys
from securevfl.runtime.lifeline import adopt_descendants, end_descendants

adopt_descendants()
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
sh = subprocess.run(
    ["sh", "-c", "sleep 120 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True
)  # the shell has ended: its background job is an orphan, adopted by this process
ended = end_descendants()
print(child.pid, int(sh.stdout), *ended, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and the child subreaper: Linux")
def test_a_rank_ends_the_processes_it_started_orphans_included() -> None:
    out = subprocess.run(
        [sys.executable, "-c", DESCENDANTS], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    child, orphan, *ended = (int(p) for p in out.stdout.split())
    try:
        assert {child, orphan} <= set(ended), out.stdout
        assert not alive(child) and not alive(orphan)
    finally:
        for p in (child, orphan):
            if alive(p):
                os.kill(p, signal.SIGKILL)
