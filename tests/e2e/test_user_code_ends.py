"""A rank whose user code does not end the way its work does still ends, soon,
and the launcher says which rank and where (docs/design.md §2, "Start-up and
liveness"; docs/extending.md, "User code and how a rank ends"):

* a factory that leaves a thread running (not a daemon): the rank exits once its
  work is done, and the command with it;
* a factory, or a defense's hook, that blocks: the run stops after
  ``runtime.user_code_timeout_s``, naming the rank and the call, not after the
  peers' ``runtime.op_timeout_s``;
* a rank that ends by itself (user code calling ``os._exit``), with any exit code,
  0 included, and every rank at once: the launcher names it and its exit code at
  once, rather than its peers' "stopped responding" a heartbeat timeout later or a
  missing ``result.json``;
* processes user code starts (and orphans) end with its rank.

The user code is tests/support/usercode_ends.py, copied beside each protocol file
(the local launcher allows a file's own modules)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from securevfl.runtime.lifeline import alive
from tests.support.protocols import ROOT, write_yaml

pytestmark = pytest.mark.timeout(240)

HOSTILE = Path(__file__).resolve().parents[1] / "support" / "usercode_ends.py"
#: how long a run may take to end once its user code has misbehaved (past the bound it
#: set): a rank's exit, its peers' notice through the store (a heartbeat, 0.5 s, and the
#: watchdog's 3 s grace), the launcher's report; a few seconds on an idle box, stretched
#: by load (measured: see each test). Without the fixes: never, or peer_timeout_s (60 s
#: here) or op_timeout_s (900 s) later.
BOUND_S = 30


def hostile_doc(mode: str = "plain", **extra: Any) -> dict[str, Any]:
    """Two passive parties on a small synthetic task; party 'left' builds its bottom
    model with the hostile factory in ``mode``. Three training steps."""
    doc: dict[str, Any] = {
        "name": f"hostile-{mode}",
        "dataset": {"name": "synthetic", "synthetic": {"rows": 240, "features": 8, "classes": 2}},
        "parties": {
            "active": {"name": "active"},
            "passive": [
                {
                    "name": "left",
                    "columns": {"index": [0, 4]},
                    "model": {"factory": "hostile:bottom", "params": {"mode": mode}, "out": 4},
                },
                {"name": "right", "columns": {"index": [4, 8]}, "model": {"out": 4}},
            ],
        },
        "interactive": {"out": 4},
        "training": {"epochs": 1, "batch_size": 64, "max_steps": 3},
    }
    doc.update(extra)
    return doc


def run(
    tmp_path: Path, doc: dict[str, Any], env: dict[str, str] | None = None
) -> tuple[subprocess.CompletedProcess[str], float]:
    """``securevfl run`` of ``doc`` (hostile.py beside it, marking into
    ``tmp_path/marks``); the finished process and the wall time it ended at."""
    shutil.copy(HOSTILE, tmp_path / "hostile.py")
    proto = write_yaml(tmp_path / "protocol.yaml", doc)
    (tmp_path / "marks").mkdir()
    proc = subprocess.run(
        [sys.executable, "-m", "securevfl", "run", str(proto), "--out", str(tmp_path / "out"), "--quiet"],
        capture_output=True,
        text=True,
        timeout=200,
        env={**os.environ, "SVFL_HOSTILE_MARKS": str(tmp_path / "marks"), **(env or {})},
        cwd=ROOT,
    )
    return proc, time.time()


def marked(tmp_path: Path, what: str) -> float:
    """When the hostile code began ``what`` (its one mark)."""
    (f,) = (tmp_path / "marks").glob(f"{what}-*")
    return float(f.read_text())


def said(proc: subprocess.CompletedProcess[str]) -> str:
    """The command's stderr, on one line."""
    return " ".join(proc.stderr.split())


def test_a_thread_left_running_by_a_factory_does_not_keep_the_run_alive(tmp_path: Path) -> None:
    """Party 'left''s factory starts a thread that never ends (not a daemon). The run
    ends with exit code 0 a few seconds after ``result.json`` is written: the rank
    waits THREAD_GRACE_S (1 s) for it, says so and leaves (measured at load 7 on the
    2-core box: 4 s from result.json to the command's end; before, it never ended)."""
    proc, ended = run(tmp_path, hostile_doc("thread"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "rank 1: threads ['user-poller'] that its user code started were still running" in said(proc)
    took = ended - (tmp_path / "out" / "result.json").stat().st_mtime
    print(f"result.json to the command's end: {took:.1f} s")
    assert took < BOUND_S


@pytest.mark.parametrize("where", ["factory", "defense"])
def test_user_code_that_blocks_stops_the_run_naming_the_rank_and_the_call(tmp_path: Path, where: str) -> None:
    """A factory that sleeps (party 'left', building its model) or a defense whose
    ``embed`` hook sleeps at the first training step (party 'right'): with
    ``runtime.user_code_timeout_s`` = 3 the run stops with exit code 3, naming the
    rank and the call, long before the peers' ``op_timeout_s`` (900 s); before, the
    blocked rank's heartbeat kept its peers waiting that long."""
    doc = hostile_doc("sleep" if where == "factory" else "plain", runtime={"user_code_timeout_s": 3})
    if where == "defense":
        doc["plugins"] = ["hostile"]
        doc["parties"]["passive"][1]["defenses"] = [{"name": "test_blocking_embed"}]
    proc, ended = run(tmp_path, doc)
    assert proc.returncode == 3, proc.stderr[-2000:]
    # the rank reports how long the call had lasted when its watchdog looked: the bound
    # (3 s) or a little more (4 s at load 5, two e2e suites at once on 2 cores)
    expected = (
        r"securevfl: error: rank 1 \(passive 'left'\) stuck (\d+) s in bottom model of party 'left': "
        r"factory 'hostile:bottom'"
        if where == "factory"
        else r"securevfl: error: rank 2 \(passive 'right'\) stuck (\d+) s in defense 'test_blocking_embed' "
        r"of party 'right', hook 'embed'"
    )
    found = re.search(expected, said(proc))
    assert found, said(proc)[-2000:]
    assert 3 <= int(found.group(1)) < 3 + BOUND_S, found.group(0)
    assert "Traceback" not in proc.stderr
    took = ended - marked(tmp_path, "sleep" if where == "factory" else "embed")
    print(f"blocked call to the command's end: {took:.1f} s")
    assert took < 3 + BOUND_S


def test_a_rank_that_exits_by_itself_is_named_at_once_with_its_exit_code(tmp_path: Path) -> None:
    """Party 'left''s factory calls ``os._exit(7)``: the launcher names the rank and the
    code and stops the others at once, rather than the peers' "stopped responding"
    after ``peer_timeout_s`` (here 60 s: a run that waited for it would take longer
    than the bound). (Exit code 0 before finishing: the next test, and
    tests/unit/test_launcher_messages.py.)"""
    proc, ended = run(tmp_path, hostile_doc("exit", runtime={"peer_timeout_s": 60}))
    assert proc.returncode == 3, proc.stderr[-2000:]
    expected = (
        "securevfl: error: rank 1 (passive 'left') exited with code 7 by itself, without reporting an error"
    )
    assert expected in said(proc), said(proc)[-2000:]
    assert "the launcher stopped the other ranks" in said(proc)
    assert "stopped responding" not in proc.stderr
    took = ended - marked(tmp_path, "exit")
    print(f"the rank's exit to the command's end: {took:.1f} s")
    assert took < BOUND_S


def test_every_rank_exiting_0_without_finishing_is_named(tmp_path: Path) -> None:
    """A plugin whose import ends every rank with ``os._exit(0)``: the launcher says
    that rank 0 (and the others) exited with code 0 before finishing, not a missing
    ``result.json``."""
    proc, _ = run(tmp_path, hostile_doc(plugins=["hostile"]), env={"SVFL_HOSTILE_EXIT_ON_IMPORT": "1"})
    assert proc.returncode == 3, proc.stderr[-2000:]
    text = said(proc)
    assert (
        "securevfl: error: rank 0 (active 'active') exited with code 0 before finishing its work" in text
    ), text
    assert "so did rank 1 (passive 'left'), rank 2 (passive 'right')" in text, text
    assert "Traceback" not in proc.stderr and "FileNotFoundError" not in proc.stderr


def test_processes_user_code_starts_end_with_its_rank(tmp_path: Path) -> None:
    """Party 'left''s factory starts a child and a grandchild it orphans at once (a
    shell's background job): both are gone once the run has ended."""
    proc, _ = run(tmp_path, hostile_doc("children"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    (mark,) = (tmp_path / "marks").glob("children-*")
    started = [int(p) for p in mark.read_text().split()]
    assert len(started) == 2
    try:
        assert [p for p in started if alive(p)] == []
    finally:
        for p in started:
            with contextlib.suppress(OSError):
                os.kill(p, signal.SIGKILL)
