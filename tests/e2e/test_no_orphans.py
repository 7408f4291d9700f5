"""No process of a local run outlives it, however the run ends: SIGTERM to the
launcher while rank 0's PSI blinding workers run, a peer that stalls during PSI
(rank 0 then ends itself), SIGKILL of the launcher (which stops nothing itself).

Every process a ``securevfl run`` starts (the fork server, the ranks, rank 0's
blinding workers) is in the session of the launcher, which each test starts in a
session of its own; "the run's processes" are the live members of that session.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from securevfl.app.launcher import STOP_GRACE_S
from securevfl.cli import main
from tests.support.protocols import ROOT, small_digits, write_yaml
from tests.support.runs import CliRun, wait_for

pytestmark = pytest.mark.timeout(300)

LINGER_S = 10  # no process of the run may be alive this long after the launcher exits
# a stopped command has ended (exit code, stderr closed) this long after the signal at most:
# the ranks' grace period, then the launcher's own few steps (securevfl.cli._stopped).
# `securevfl run` on the 2-core test box (2026-11-28), Ctrl-C and SIGTERM, 10 stops each at
# load 36-53: every process of its session gone 0.5-1.2 s after the signal. Before the
# launcher ended its fork server and its own process at once (two interpreter teardowns, one
# after the other, about 1 CPU s each), 10.5-17.5 s at that load, 1.2-2.1 s at load 3.
STOP_BOUND_S = STOP_GRACE_S + 3.0


def session_processes(sid: int) -> list[str]:
    """``pid command`` of every live (not zombie) process in session ``sid``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            _, tail = (d / "stat").read_text().rsplit(")", 1)
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:150]
        except OSError:
            continue
        fields = tail.split()
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(f"{d.name} {cmd}")
    return found


def lingering(sid: int, seconds: float = LINGER_S) -> list[str]:
    """The session's processes still alive after up to ``seconds`` (empty: none)."""
    deadline = time.monotonic() + seconds
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def start_run(proto: Path, out: Path, *extra: str) -> subprocess.Popen[str]:
    """``securevfl run`` in a session of its own, stderr piped."""
    return subprocess.Popen(
        [sys.executable, "-m", "securevfl", "run", str(proto), "--out", str(out), *extra],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )


def kill_session(sid: int) -> None:
    for entry in session_processes(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(entry.split()[0]), signal.SIGKILL)


def psi_protocol(tmp_path: Path, **runtime: Any) -> Path:
    """60,000 synthetic rows on two passive parties: rank 0 blinds on worker
    processes (securevfl.data.dh_psi.Blinder: from 50,000 IDs)."""
    doc = {
        "name": "psi-orphans",
        "dataset": {"name": "synthetic", "synthetic": {"rows": 60_000, "features": 8}},
        "parties": {
            "passive": [
                {"name": "p1", "columns": {"index": [0, 4]}, "model": {"out": 4}},
                {"name": "p2", "columns": {"index": [4, 8]}, "model": {"out": 4}},
            ]
        },
        "interactive": {"out": 4},
        "training": {"epochs": 1, "max_steps": 1},
        "runtime": {"peer_timeout_s": 3, **runtime},
    }
    return write_yaml(tmp_path / "psi.yaml", doc)


def _workers_started(sid: int, timeout: float = 60) -> None:
    """Wait until rank 0's blinding workers run (spawned processes in the session)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if sum("spawn_main" in p for p in session_processes(sid)) >= 2:
            return
        time.sleep(0.1)
    raise AssertionError(f"no blinding workers: {session_processes(sid)}")


@pytest.mark.slow
def test_sigterm_during_psi_leaves_no_process(tmp_path: Path):
    """(Default suite: tests/unit/test_lifeline.py, the workers of a killed owner.)"""
    proc = start_run(psi_protocol(tmp_path), tmp_path / "out", "--quiet")
    try:
        _workers_started(proc.pid)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
        assert lingering(proc.pid) == []
    finally:
        kill_session(proc.pid)


@pytest.mark.slow
def test_a_peer_stalled_during_psi_leaves_no_process(tmp_path: Path):
    """A passive rank stopped (SIGSTOP) while rank 0 blinds: rank 0 declares it lost
    and ends itself (os._exit, from its watchdog), the launcher kills the stalled
    rank once its grace period is over, and says that it stalled.
    (Default suite: tests/unit/test_lifeline.py, the workers of an owner that ends
    with os._exit; tests/unit/test_launcher_messages.py, the message.)"""
    out = tmp_path / "out"
    proc = start_run(psi_protocol(tmp_path), out)
    try:
        wait_for(proc, "(PSI)", timeout=120)
        _workers_started(proc.pid)
        pids = json.loads((out / "ranks" / "launcher_pids.json").read_text())
        os.kill(pids["2"], signal.SIGSTOP)
        _, err = proc.communicate(timeout=120)
        text = " ".join(err.split())
        assert proc.returncode == 3, err[-2000:]
        assert "killed by SIGKILL" not in text, text[-2000:]
        stopped = "rank 2 (passive 'p2') did not end by itself and was stopped by the launcher"
        assert stopped in text, text[-2000:]
        assert lingering(proc.pid) == []
    finally:
        kill_session(proc.pid)


def test_sigkill_of_the_launcher_ends_every_rank(small_cli_run: CliRun, tmp_path: Path):
    """SIGKILL of ``securevfl run --overwrite`` mid-training: the ranks end with
    it (they would otherwise train to the end, writing into a staging folder
    nobody commits); the earlier result stays, and the next command in that
    folder removes the dead launch's staging folder."""
    out = tmp_path / "run"
    shutil.copytree(small_cli_run.out, out)
    before = (out / "result.json").read_bytes()
    proto = write_yaml(tmp_path / "long.yaml", small_digits(epochs=400, batch_size=32))
    proc = start_run(proto, out, "--overwrite")
    try:
        wait_for(proc, "epoch 2/400", timeout=120)
        staging = out / f".securevfl-staging-{proc.pid}"
        assert (staging / "ranks" / "launcher_pids.json").is_file()
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert lingering(proc.pid) == []
    finally:
        kill_session(proc.pid)
    assert (out / "result.json").read_bytes() == before
    assert staging.is_dir()
    assert main(["run", str(proto), "--out", str(out), "--quiet"]) == 2  # refused: an earlier result
    assert not staging.exists() and (out / "result.json").read_bytes() == before


def _ranks_running(out: Path, timeout: float = 120) -> list[int]:
    """The rank pids of the launch writing under ``out``, once every rank runs."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        found = list(out.rglob("launcher_pids.json"))
        if found:
            pids = list(json.loads(found[0].read_text()).values())
            if pids and all(Path(f"/proc/{p}").exists() for p in pids):
                return pids
        time.sleep(0.1)
    raise AssertionError(f"no ranks under {out}")


@pytest.mark.parametrize(
    ("command", "sig", "code", "said"),
    [
        ("run", signal.SIGINT, 130, "interrupted"),  # Ctrl-C: the terminal signals the whole group
        ("compare", signal.SIGTERM, 143, "terminated (SIGTERM)"),
    ],
)
def test_ctrl_c_and_sigterm_stop_every_rank(tmp_path: Path, command: str, sig: int, code: int, said: str):
    """README: Ctrl-C or SIGTERM stops every rank a run, compare or predict started
    (exit 130 and 143), within :data:`STOP_BOUND_S` of the signal however loaded
    the machine; no process of the command outlives it."""
    proto = write_yaml(tmp_path / "long.yaml", small_digits(epochs=400, batch_size=32))
    out = tmp_path / "out"
    proc = subprocess.Popen(
        [sys.executable, "-m", "securevfl", command, str(proto), "--out", str(out), "--quiet"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        _ranks_running(out)
        signalled = time.monotonic()
        if sig == signal.SIGINT:
            os.killpg(proc.pid, sig)
        else:
            proc.send_signal(sig)
        _, err = proc.communicate(timeout=60)
        took = time.monotonic() - signalled  # the command has exited and its stderr is closed
        assert proc.returncode == code, err[-2000:]
        assert took <= STOP_BOUND_S, f"stopped {took:.1f} s after the signal (bound {STOP_BOUND_S} s)"
        assert said in err and "Traceback" not in err, err[-2000:]
        assert lingering(proc.pid) == []
    finally:
        kill_session(proc.pid)
