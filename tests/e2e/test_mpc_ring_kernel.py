"""``mpc`` with its ring products on the float64 limb kernel, end to end in real
processes (SECUREVFL_RING_KERNEL=limbs, which every rank inherits): both share
layouts track ``plain`` step by step as closely as with torch's int64 products
(tests/e2e/test_backends.py), so the parties' Beaver terms and the dealer's
triples computed on the kernel are the exact ring products the protocol needs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from securevfl.exchange.mpc.ringmatmul import KERNEL_ENV
from tests.support.protocols import short_sgd_digits
from tests.support.runs import run_doc

pytestmark = pytest.mark.timeout(600)

TOL = 5e-4  # as test_backends.py: 16-bit fixed point, ~1e-4 per step observed


@pytest.fixture(scope="module")
def plain_trace(tmp_path_factory: pytest.TempPathFactory) -> list:
    out = tmp_path_factory.mktemp("plain")
    run_doc(short_sgd_digits(8), out)
    return torch.load(out / "ranks" / "rank0.trace.pt", weights_only=True)


@pytest.mark.parametrize("layout", ["pairwise", "joint"])
def test_limb_kernel_tracks_plain(tmp_path: Path, plain_trace: list, layout: str, monkeypatch):
    monkeypatch.setenv(KERNEL_ENV, "limbs")
    doc = short_sgd_digits(8)
    doc["exchange"] = {
        "backend": "mpc",
        "params": {"weight_init": "seeded", "insecure": True, "layout": layout},
    }
    result = run_doc(doc, tmp_path)
    trace = torch.load(tmp_path / "ranks" / "rank0.trace.pt", weights_only=True)
    assert result["backend"] == "mpc" and len(trace) == len(plain_trace) == 8
    for step, (a, b) in enumerate(zip(plain_trace, trace, strict=True)):
        assert float((a["z"] - b["z"]).abs().max()) <= TOL, (layout, step)
        assert abs(float(a["loss"]) - float(b["loss"])) <= TOL, (layout, step)
