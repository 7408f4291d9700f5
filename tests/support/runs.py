"""Running securevfl from tests: the real launcher (one OS process per rank), the
command line as a subprocess, and one rank as its own ``securevfl party`` process."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support.protocols import ROOT


def run_doc(doc: dict[str, Any], out: Path, **kw: Any) -> dict[str, Any]:
    """Validate a protocol mapping and run it with the real launcher."""
    from securevfl.app.launcher import launch
    from securevfl.app.loader import load_checked_dict

    return launch(load_checked_dict(copy.deepcopy(doc)), out, progress=False, **kw)


def own_reports(out: Path) -> dict[str, dict[str, Any]]:
    """Each party's own defense statistics in a local run's folder, by party and
    defense name (``ranks/rank<R>.defense_report.json``: what ``result.json``
    no longer carries, since no party sends them)."""
    from securevfl.report.result import read_own_reports

    return {party: rep.defenses for party, rep in read_own_reports(out).items()}


def cli(
    *args: str, timeout: float = 300, env: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``securevfl ARGS`` in a fresh interpreter, as ``python -m securevfl``:
    under the 'spawn' start method a rank re-runs its parent's main module first
    unless that module is a package's ``__main__`` (``python -m securevfl.cli``
    would make every rank import the whole command line again)."""
    e = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "securevfl", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=e,
        cwd=cwd or ROOT,
    )


def party_process(
    proto: Path, rank: int, port: int, out: Path, *extra: str, host: str = "127.0.0.1", cwd: Path = ROOT
) -> subprocess.Popen[str]:
    """One rank as its own ``securevfl party`` process (multi-host mode on one machine)."""
    return subprocess.Popen(
        [
            *(sys.executable, "-m", "securevfl", "party", str(proto), "--rank", str(rank)),
            *("--rendezvous", f"tcp://{host}:{port}", "--out", str(out), *extra),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


@dataclass(frozen=True)
class CliRun:
    """A finished ``securevfl run``: its protocol file, the CLI process (stderr holds
    the progress lines), result.json and the output folder."""

    proto: Path
    proc: subprocess.CompletedProcess[str]
    result: dict[str, Any]
    out: Path


def wait_for(proc: subprocess.Popen[str], needle: str, timeout: float) -> str:
    """Read proc's stderr until a line contains needle."""
    assert proc.stderr is not None
    seen: list[str] = []
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        line = proc.stderr.readline()
        if not line:
            break
        seen.append(line)
        if needle in line:
            return "".join(seen)
    raise AssertionError(f"never saw {needle!r}: {''.join(seen)[-2000:]}")
