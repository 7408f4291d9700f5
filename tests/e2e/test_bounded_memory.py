"""Memory does not grow with the number of epochs, with real processes: a run of a
billion epochs cut at 50 steps, and one without a step limit stopped after 60 s of
training, keep every rank's peak memory within 10% of a one-epoch run's.

What grew before: the plan of batch sizes each rank gives its exchange listed every
step of the run (a billion epochs of 23 steps), so the ranks grew by hundreds of
MiB a second before training began. Peak memory is the kernel's high-water mark
of each rank process (``VmHWM``), which the ranks also report at the end
(``peak_rss_mib``)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.support.protocols import PROTOCOLS, ROOT
from tests.support.runs import cli

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

PROTOCOL = PROTOCOLS / "plain.yaml"  # digits, cnn bottoms: 23 steps an epoch
MARGIN = 1.10
TRAIN_S = 60.0


def _peaks(out: Path) -> dict[str, float]:
    return {r: float(v) for r, v in json.loads((out / "result.json").read_text())["peak_rss_mib"].items()}


def _hwm_mib(pid: int) -> float | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next((x for x in status.splitlines() if x.startswith("VmHWM:")), None)
    return None if line is None else int(line.split()[1]) / 1024


def test_memory_does_not_grow_with_epochs(tmp_path):
    one = cli("run", str(PROTOCOL), "--out", str(tmp_path / "one"), "--quiet", "--set", "training.epochs=1")
    assert one.returncode == 0, one.stderr[-2000:]
    limit = {r: MARGIN * v for r, v in _peaks(tmp_path / "one").items()}

    capped = cli(
        *("run", str(PROTOCOL), "--out", str(tmp_path / "capped"), "--quiet"),
        *("--set", "training.epochs=1000000000", "--set", "training.max_steps=50"),
    )
    assert capped.returncode == 0, capped.stderr[-2000:]
    assert json.loads((tmp_path / "capped" / "result.json").read_text())["train_steps"] == 50
    for r, peak in _peaks(tmp_path / "capped").items():
        assert peak <= limit[r], (r, peak, limit)

    out = tmp_path / "open"
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "securevfl", "run", str(PROTOCOL), "--out", str(out), "--quiet"),
            *("--set", "training.epochs=1000000000"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
    )
    pids = out / "ranks" / "launcher_pids.json"
    peak: dict[str, float] = {}
    try:
        deadline = time.monotonic() + 300
        while not pids.exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[1][-2000:]
            time.sleep(0.2)
        ranks = {r: int(p) for r, p in json.loads(pids.read_text()).items()}
        end = time.monotonic() + TRAIN_S
        while time.monotonic() < end:
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            for r, pid in ranks.items():
                hwm = _hwm_mib(pid)
                if hwm is not None:
                    peak[r] = max(peak.get(r, 0.0), hwm)
            if any(peak[r] > limit[r] for r in peak):
                break  # growing: stop now rather than let it take the machine's memory
            time.sleep(1.0)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
    assert sorted(peak) == sorted(limit), peak
    for r, value in peak.items():
        assert value <= limit[r], (r, value, limit)
