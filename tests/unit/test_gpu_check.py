"""``make gpu-check`` on a machine without CUDA: it says so, exits 0 and writes nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA device")
def test_gpu_check_without_cuda(tmp_path: Path):
    out = tmp_path / "check.json"
    p = subprocess.run(
        [sys.executable, "benchmarks/gpu_check.py", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode == 0, p.stderr
    assert "no CUDA device" in p.stdout
    assert not out.exists()
