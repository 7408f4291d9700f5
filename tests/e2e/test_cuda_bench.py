"""The exchange benchmark on a CUDA device (skipped without one): ``plain`` and
``mpc`` (its joint layout: CrypTen's CUDA ring products) run a few steps each on
the device and report them, as ``make gpu-check`` runs them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.cuda
@pytest.mark.timeout(600)
def test_exchange_benchmark_on_cuda(tmp_path: Path):
    out = tmp_path / "bench.json"
    cmd = [sys.executable, "benchmarks/exchange.py", "--quick", "--backends", "plain,mpc"]
    cmd += ["--device", "cuda", "--batch", "64", "--mpc-steps", "2", "--plain-steps", "2"]
    cmd += ["--channel-ab", "0", "--no-op-counts", f"--json={out}"]
    p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(out.read_text())
    rows = {r["backend"]: r for r in doc["rows"]}
    assert doc["device"] == "cuda" and set(rows) == {"plain", "mpc"}
    assert all(r["device"] == "cuda" and r["steps"] == 2 and r["s_per_step"] > 0 for r in rows.values())
    # the joint layout: each product's masked operands travel among all k + 1 = 3 parties
    assert rows["mpc"]["bytes_per_step"] > 10 * rows["plain"]["bytes_per_step"]
