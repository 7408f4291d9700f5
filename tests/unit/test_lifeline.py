"""Child processes end with their parent (securevfl.runtime.lifeline), however the
parent ends: a rank started through a fork server when its launcher is killed
with SIGKILL, a rank's PSI blinding workers when the rank is killed or ends with
``os._exit``."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from securevfl.app.launcher import STOP_GRACE_S, stop_ranks
from securevfl.runtime.lifeline import alive

ROOT = Path(__file__).resolve().parents[2]

STARTER = """
import multiprocessing as mp, os, sys, time
from securevfl.runtime.lifeline import die_with

def child(origin):
    if sys.argv[2] == "lifeline":
        die_with(origin)
    time.sleep(60)

if __name__ == "__main__":
    p = mp.get_context(sys.argv[1]).Process(target=child, args=(os.getpid(),))
    p.start()
    print(p.pid, flush=True)
    time.sleep(60)
"""

BLINDER = """
import os, sys, time
from securevfl.data import dh_psi

if __name__ == "__main__":
    blinder = dh_psi.Blinder(dh_psi.Key.fresh(), workers=2, min_parallel=1, slice_elements=64)
    blinder.multiply(dh_psi.hash_to_group([str(i) for i in range(256)]))  # the workers run
    print(" ".join(str(p) for p in blinder._pool._processes), flush=True)
    if sys.argv[1] == "exit":  # as a rank's watchdog ends it when a peer is lost
        sys.stdin.readline()
        os._exit(3)
    time.sleep(60)
"""


def _start(tmp_path: Path, code: str, *args: str) -> tuple[subprocess.Popen[str], list[int]]:
    script = tmp_path / "script.py"
    script.write_text(code)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tmp_path,
    )
    assert proc.stdout is not None
    pids = [int(p) for p in proc.stdout.readline().split()]
    assert pids and all(alive(p) for p in pids)
    return proc, pids


def _gone_within(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := [p for p in pids if alive(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_a_child_ends_when_its_launcher_is_killed(tmp_path: Path, method: str):
    proc, pids = _start(tmp_path, STARTER, method, "lifeline")
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert _gone_within(pids, 10) == []


@pytest.mark.parametrize("method", ["forkserver", "spawn"])
def test_without_the_lifeline_the_child_would_stay(tmp_path: Path, method: str):
    """The control: the same child without die_with outlives a killed parent (a
    fork server's child keeps the fork server running too: it holds the server's
    "alive" pipe)."""
    proc, pids = _start(tmp_path, STARTER, method, "none")
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert _gone_within(pids, 1.0) == pids
    finally:
        for p in pids:
            os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize("how", ["sigkill", "exit"])
def test_blinding_workers_end_with_their_owner(tmp_path: Path, how: str):
    proc, workers = _start(tmp_path, BLINDER, how)
    assert len(workers) == 2
    if how == "sigkill":
        proc.send_signal(signal.SIGKILL)
    else:
        proc.communicate("go\n")
    proc.wait()
    assert proc.returncode == (-signal.SIGKILL if how == "sigkill" else 3)
    assert _gone_within(workers, 10) == []


def test_alive():
    assert alive(os.getpid())
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    assert not alive(p.pid)


def test_stop_ranks_kills_a_rank_that_ignores_sigterm_after_the_grace():
    """README: a stopped command's ranks get SIGTERM, then SIGKILL after 2 s for any
    that ignore it. (The child inherits SIGTERM's "ignore" across its exec.)"""
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        p = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(60,))
        p.start()
    finally:
        signal.signal(signal.SIGTERM, previous)
    t0 = time.monotonic()
    stop_ranks([p])
    elapsed = time.monotonic() - t0
    assert p.exitcode == -signal.SIGKILL
    assert STOP_GRACE_S <= elapsed < STOP_GRACE_S + 1.0, elapsed


RANK_ENTRY = """
import os, signal, sys, time
from securevfl.app.launcher import _rank_main

def entry(kind):
    if kind == "interrupt":
        raise KeyboardInterrupt  # Ctrl-C while the rank is still starting up
    if kind == "interrupt-wrapped":
        # Ctrl-C inside code that turns the interrupt into its own error (pydantic's
        # schema builder, importing an options model, raises a SchemaError)
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt as exc:
            raise ValueError("SchemaError: KeyboardInterrupt") from None
    raise RuntimeError("a bug before the rank could report it")

_rank_main(entry, dict(os.environ), os.getppid(), sys.argv[1])
"""


@pytest.mark.parametrize(
    ("kind", "code", "traceback"),
    [("interrupt", 130, False), ("interrupt-wrapped", 130, False), ("bug", 70, True)],
)
def test_a_rank_interrupted_while_starting_stops_quietly(kind: str, code: int, traceback: bool):
    """Ctrl-C reaches a rank that has not yet entered its run (the terminal signals the
    whole group): it ends with 130 and prints nothing, where a traceback would reach
    the user's terminal (cut short by the launcher's SIGTERM, as it once was). A bug
    in the same window still keeps its traceback and exits 70."""
    p = subprocess.run(
        [sys.executable, "-c", RANK_ENTRY, kind], capture_output=True, text=True, cwd=ROOT, timeout=120
    )
    assert p.returncode == code, p.stderr
    assert ("Traceback" in p.stderr) is traceback, p.stderr
