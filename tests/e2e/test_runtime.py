"""Multi-command runs and failure handling with real processes:
ranks started one per ``securevfl party`` command reproduce ``securevfl run``;
a rank killed mid-training ends every other rank with an error naming it, and
heartbeats or ``done`` flags forged into the rendezvous store do not hide it."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from securevfl.app.launcher import free_port
from tests.support.protocols import ROOT, small_digits, write_yaml
from tests.support.runs import CliRun, party_process, wait_for

pytestmark = pytest.mark.timeout(300)

# a killed or stopped rank is noticed after this many seconds without its heartbeat
# (sent every 0.5 s); the default is 15, each test below waits it out once
PEER_TIMEOUT_S = 5


def test_party_commands_reproduce_run(small_cli_run: CliRun, tmp_path: Path):
    """The three ranks of the shared ``securevfl run`` (tests/conftest.py), started
    again as three ``securevfl party`` commands, end where that run ended."""
    proto, run = small_cli_run.proto, small_cli_run.out
    port = free_port()
    procs = [party_process(proto, r, port, tmp_path / f"host{r}", "--quiet") for r in range(3)]
    outs = [p.communicate(timeout=240) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], [o[1][-2000:] for o in outs]
    # rank 0 names the result; the other ranks say in one line that they are done
    assert f"result: {tmp_path / 'host0' / 'result.json'}" in outs[0][0]
    for r, name in ((1, "left"), (2, "right")):
        assert outs[r][0].startswith(f"done: rank {r} (passive '{name}'): 3 training steps on 1797"), outs[r][
            0
        ]
    a = small_cli_run.result
    b = json.loads((tmp_path / "host0" / "result.json").read_text())
    assert a["train_steps"] > 1
    for key in ("test_accuracy", "train_steps", "bytes_per_step", "digest", "rows", "history"):
        hist = lambda r: [{k: v for k, v in e.items()} for e in r["history"]]  # noqa: E731
        assert (hist(a) if key == "history" else a[key]) == (hist(b) if key == "history" else b[key]), key
    # every rank ended with identical parameters (bitwise: same seeds, same batches)
    for r in range(3):
        sa = torch.load(run / "ranks" / f"rank{r}.state.pt", weights_only=True)
        sb = torch.load(tmp_path / f"host{r}" / "ranks" / f"rank{r}.state.pt", weights_only=True)
        assert sa.keys() == sb.keys()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)
    # the three commands were three distinct processes, none of them this one
    pids = set(b["party_pids"].values())
    assert len(pids) == 3 and os.getpid() not in pids


def _long_cli_run(tmp_path: Path, out: Path, **runtime: float) -> subprocess.Popen[str]:
    """``securevfl run`` of a 400-epoch small protocol into ``out``, in the background
    (its stderr piped, for :func:`~tests.support.runs.wait_for`)."""
    doc = small_digits(epochs=400, batch_size=32)
    if runtime:
        doc["runtime"] = runtime
    proto = write_yaml(tmp_path / "p.yaml", doc)
    return subprocess.Popen(
        [sys.executable, "-m", "securevfl", "run", str(proto), "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )


@pytest.mark.parametrize("victim", [2, 0])
def test_killed_rank_ends_all_others_naming_it(tmp_path: Path, victim: int):
    doc = small_digits(epochs=400, batch_size=32)
    doc["runtime"] = {"peer_timeout_s": PEER_TIMEOUT_S}
    proto = write_yaml(tmp_path / "p.yaml", doc)
    port = free_port()
    procs = [party_process(proto, r, port, tmp_path / f"host{r}") for r in range(3)]
    try:
        wait_for(procs[0], "epoch 2/400", timeout=120)  # training is under way
        os.kill(procs[victim].pid, signal.SIGKILL)
        t0 = time.monotonic()
        survivors = [r for r in range(3) if r != victim]
        errs = {}
        for r in survivors:
            _, err = procs[r].communicate(timeout=60)
            errs[r] = err
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert elapsed < 60, elapsed
    for r in survivors:
        assert procs[r].returncode not in (0, None), (r, errs[r][-1500:])
        assert f"rank {victim}" in errs[r], (r, errs[r][-1500:])
        assert "Traceback" not in errs[r]
        note = json.loads((tmp_path / f"host{r}" / "ranks" / f"rank{r}.error.json").read_text())
        assert note["lost_rank"] == victim


def test_launcher_reports_killed_rank(tmp_path: Path):
    """Under ``securevfl run`` the launcher's own message names the killed rank."""
    out = tmp_path / "out"
    proc = _long_cli_run(tmp_path, out, peer_timeout_s=PEER_TIMEOUT_S)
    try:
        wait_for(proc, "epoch 2/400", timeout=120)
        pids = json.loads((out / "ranks" / "launcher_pids.json").read_text())
        os.kill(pids["1"], signal.SIGKILL)
        t0 = time.monotonic()
        _, err = proc.communicate(timeout=90)
        elapsed = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 3, err[-1500:]
    assert elapsed < 60
    assert "rank 1 (passive 'left')" in err and "SIGKILL" in err, err[-1500:]
    for r in (0, 2):
        note = json.loads((out / "ranks" / f"rank{r}.error.json").read_text())
        assert note["lost_rank"] == 1


def test_stalled_rank_ends_all_others_naming_it(tmp_path: Path):
    """A rank that stops responding (SIGSTOP: alive, connections open, silent) is
    declared lost by every other rank's watchdog after peer_timeout_s."""
    doc = small_digits(epochs=400, batch_size=32)
    doc["runtime"] = {"peer_timeout_s": PEER_TIMEOUT_S}
    proto = write_yaml(tmp_path / "p.yaml", doc)
    port = free_port()
    procs = [party_process(proto, r, port, tmp_path / f"host{r}") for r in range(3)]
    try:
        wait_for(procs[0], "epoch 2/400", timeout=120)
        os.kill(procs[2].pid, signal.SIGSTOP)
        t0 = time.monotonic()
        errs = {r: procs[r].communicate(timeout=60)[1] for r in (0, 1)}
        elapsed = time.monotonic() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()  # reap it and close its pipes
    assert elapsed < 60, elapsed
    for r in (0, 1):
        assert procs[r].returncode == 3, (r, errs[r][-1500:])
        assert "rank 2 (passive 'right')" in errs[r] and "stopped responding" in errs[r], errs[r][-1500:]


def test_forged_heartbeats_and_done_flags_do_not_hide_a_stalled_rank(tmp_path: Path):
    """Anyone who reaches the rendezvous port can write into its store: while
    rank 2 is stopped, a process keeps writing fresh heartbeats and a ``done``
    flag for it. They are not signed by rank 2 for this run, so the other ranks
    still declare it lost after peer_timeout_s (they used to stop watching it,
    then wait in a receive for ``runtime.op_timeout_s``)."""
    doc = small_digits(epochs=400, batch_size=32)
    doc["runtime"] = {"peer_timeout_s": PEER_TIMEOUT_S}
    proto = write_yaml(tmp_path / "p.yaml", doc)
    port = free_port()
    procs = [party_process(proto, r, port, tmp_path / f"host{r}") for r in range(3)]
    stop = threading.Event()

    def forge(store: dist.TCPStore) -> None:
        beat = 1_000_000
        while not stop.is_set():
            beat += 1
            with contextlib.suppress(RuntimeError):  # rank 0 has gone
                store.set("hb/2", str(beat))
                store.set("done/2", "1")
            stop.wait(0.1)

    forger: threading.Thread | None = None
    try:
        wait_for(procs[0], "epoch 2/400", timeout=120)
        store = dist.TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=10))
        os.kill(procs[2].pid, signal.SIGSTOP)
        forger = threading.Thread(target=forge, args=(store,), daemon=True)
        forger.start()
        t0 = time.monotonic()
        errs = {r: procs[r].communicate(timeout=60)[1] for r in (0, 1)}
        elapsed = time.monotonic() - t0
    finally:
        stop.set()
        if forger is not None:
            forger.join(timeout=30)
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.communicate()
    assert elapsed < 60, elapsed
    for r in (0, 1):
        assert procs[r].returncode == 3, (r, errs[r][-1500:])
        assert "rank 2 (passive 'right')" in errs[r] and "stopped responding" in errs[r], errs[r][-1500:]


def test_launch_from_a_script_without_a_main_guard_says_so(tmp_path: Path):
    """Each rank is a 'spawn' process that re-imports the caller's main module: a
    script calling launch() at top level would launch again inside every rank.
    The ranks refuse, and the launcher's error points at the cause."""
    script = tmp_path / "unguarded.py"
    script.write_text(
        "from securevfl.app.loader import load_checked\n"
        "from securevfl.app.launcher import launch\n"
        f"launch(load_checked({str(ROOT / 'protocols' / 'plain.yaml')!r}), {str(tmp_path / 'out')!r}, "
        "progress=False)\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env
    )
    assert proc.returncode != 0
    assert "launch() was called inside a rank process" in proc.stderr
    assert "before writing an error report" in proc.stderr and "__main__" in proc.stderr
    assert not (tmp_path / "out" / "result.json").exists()


def _running(pid: int) -> bool:
    """The process exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_sigterm_to_the_launcher_stops_every_rank(tmp_path: Path):
    """``kill`` (SIGTERM, as ``timeout`` or a job scheduler sends it) to ``securevfl
    run`` stops the ranks it started, as Ctrl-C does: none outlives the command,
    which exits 143 and says so."""
    out = tmp_path / "out"
    proc = _long_cli_run(tmp_path, out)
    try:
        wait_for(proc, "epoch 2/400", timeout=120)
        pids = list(json.loads((out / "ranks" / "launcher_pids.json").read_text()).values())
        assert all(_running(p) for p in pids)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err[-1500:]
    assert "terminated (SIGTERM)" in err and "Traceback" not in err, err[-1500:]
    deadline = time.monotonic() + 10
    while any(_running(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_running(p) for p in pids), [p for p in pids if _running(p)]
    assert not (out / "result.json").exists()
