"""Truncation under stress: no shared value wraps, however many are truncated.

Every training step of the ``mpc`` backend divides the momentum and the weight
step of every weight by a power of two in shares. A truncation that *wraps* adds
+-2^(64 - 16) units to its result (2^32 in real units), silently: SecureML's local
truncation (each party divides its own share; the pairwise layout's and CrypTen's
two-party ``div_``) and CrypTen's wraps protocol with more parties (which assumes
x + r does not wrap) both do so with probability about |x| / 2^64 per element.

One harness truncates shared values drawn at every magnitude a momentum takes at
32 fractional bits (2^16 to 2^48, uniform in the exponent), shares drawn from
secret streams, and counts results that are off by more than one unit:

* the product's exact truncation (:mod:`securevfl.exchange.truncation`, the
  dealer's material simulated from streams) with two parties (the pairwise layout)
  and three (the joint one): 10^8 elements in all (``slow``; 10^6 by default), no
  wrap, and the scaled second result (the weight step) exact too;
* positive controls: the old local truncation (``ring.truncate``) and CrypTen's
  wraps protocol (its ``beaver.truncate``, re-enacted on shares) on 10^7 elements
  each, which wrap.

The wiring of the exact truncation into both layouts is held by real runs: the
pairwise layout by tests/e2e/test_backends.py, the joint layout here, each
tracking ``plain`` step by step (a wrap would move a weight by 2^32).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from securevfl.csprng import SecretStream
from securevfl.exchange import truncation
from securevfl.exchange.crypten_api import count_wraps
from securevfl.exchange.mpc import ring
from tests.support.protocols import small_digits
from tests.support.runs import run_doc

FRAC = 16
LR = (104858, 29)  # 0.05 / 256 at 16 significant bits (ops.fixed_scalar)
CHUNK = 1 << 21

Truncate = Callable[[list[torch.Tensor], SecretStream], tuple[torch.Tensor, torch.Tensor | None]]


def exact(xs: list[torch.Tensor], g: SecretStream) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The product's truncation among len(xs) parties, the dealer's streams from ``g``."""
    n, shape = len(xs), tuple(xs[0].shape)
    rs = [g.ring(shape) for _ in range(n)]
    mat = torch.stack(truncation.material(sum(rs), FRAC, *LR))  # type: ignore[arg-type]
    others = [g.ring((4, *shape)) for _ in range(n - 1)]
    shares = [mat - sum(others), *others]
    c = sum(truncation.masked(x, r, j == 0) for j, (x, r) in enumerate(zip(xs, rs, strict=True)))
    outs = [truncation.finish(c, shares[j].unbind(0), FRAC, *LR, first=j == 0) for j in range(n)]  # type: ignore[arg-type]
    return sum(o[0] for o in outs), sum(o[1] for o in outs)  # type: ignore[return-value]


def local(xs: list[torch.Tensor], g: SecretStream) -> tuple[torch.Tensor, torch.Tensor | None]:
    """SecureML's local truncation, as the pairwise layout and CrypTen's two-party
    ``div_`` truncated before."""
    return sum(ring.truncate(x, FRAC) for x in xs), None  # type: ignore[return-value]


def crypten_wraps(xs: list[torch.Tensor], g: SecretStream) -> tuple[torch.Tensor, torch.Tensor | None]:
    """CrypTen's truncation with more than two parties (``beaver.truncate``): the
    dealer's [r] and [theta_r], z = x + r gathered at rank 0, theta_x = theta_z +
    beta_xr - theta_r, the eta_xr term left out as CrypTen leaves it."""
    n, shape = len(xs), tuple(xs[0].shape)
    rs = [g.ring(shape) for _ in range(n)]
    others = [g.ring(shape) for _ in range(n - 1)]
    theta_r = [count_wraps(rs) - sum(others), *others]
    zs = [x + r for x, r in zip(xs, rs, strict=True)]
    theta_x = [count_wraps([x, r]) - t for x, r, t in zip(xs, rs, theta_r, strict=True)]
    theta_x[0] = theta_x[0] + count_wraps(zs)
    out = [
        x.div(2**FRAC, rounding_mode="trunc") - t * 4 * (2**62 // 2**FRAC)
        for x, t in zip(xs, theta_x, strict=True)
    ]
    return sum(out), None  # type: ignore[return-value]


def stress(fn: Truncate, parties: int, elements: int, seed: int) -> dict[str, Any]:
    """Truncate ``elements`` shared values in chunks. A wrap is a result off by 2^32
    units or more (a wrap moves it by 2^48); ``rounding`` is the largest error of the
    others (the exact truncation's is 0 or 1, floor(x / 2^16) or one more)."""
    g = SecretStream.from_seed(seed, "truncation-stress", parties)
    wraps = done = rounding = 0
    example: tuple[int, int] = (0, 0)
    while done < elements:
        m = min(CHUNK, elements - done)
        mags = g.integers((m,), 16, 49)
        x = g.ring((m,)) >> (63 - mags)  # |x| < 2^mags, every magnitude as likely
        parts = [g.ring((m,)) for _ in range(parties - 1)]
        xs = [x - sum(parts), *parts] if parts else [x]
        v, step = fn(xs, g)  # type: ignore[arg-type]
        off = (v - torch.div(x, 2**FRAC, rounding_mode="floor")).abs()
        if step is not None:  # the weight step: floor(L V / 2^s) or one more, of the V found
            off = torch.maximum(off, (step - ((LR[0] * v) >> LR[1])).abs())
        bad = off >= 2**32
        wraps += int(bad.sum())
        if bad.any():
            i = int(bad.nonzero()[0])
            example = (int(x[i]), int(off[i]))
        rounding = max(rounding, int(off[~bad].max()) if (~bad).any() else 0)
        done += m
    return {"elements": done, "wraps": wraps, "rounding": rounding, "example": example}


@pytest.mark.parametrize(
    "elements",
    [pytest.param(10**6, id="1e6"), pytest.param(5 * 10**7, id="5e7", marks=pytest.mark.slow)],
)
@pytest.mark.parametrize("parties", [2, 3], ids=["pairwise", "joint"])
def test_exact_truncation_never_wraps(parties: int, elements: int):
    """10^8 truncated elements over both layouts (the slow parameters): none off by
    more than one unit, in the momentum or in the weight step."""
    got = stress(exact, parties, elements, seed=parties)
    print(f"exact, {parties} parties: {got}")
    assert got["elements"] == elements and got["wraps"] == 0 and got["rounding"] <= 1, got


@pytest.mark.parametrize("fn, parties", [(local, 2), (crypten_wraps, 3)], ids=["local", "crypten-wraps"])
def test_positive_control_the_old_truncations_wrap(fn: Truncate, parties: int):
    """The same harness, the truncations securevfl used before: on 10^7 elements
    (each wrapping with probability about |x| / 2^64) some wrap, each by 2^48 units."""
    got = stress(fn, parties, 10**7, seed=10 + parties)
    print(f"{fn.__name__}, {parties} parties: {got}")
    assert got["wraps"] > 0, got
    assert got["example"][1] >= 2**47


# -- the wiring: the joint layout tracks plain step by step ---------------------------------


def _doc(backend: str, params: dict[str, Any]) -> dict[str, Any]:
    doc = small_digits(epochs=1, batch_size=32, max_steps=8, optimizer="sgd", lr=0.05)
    doc["exchange"] = {"backend": backend, "params": params}
    doc["runtime"] = {"trace_steps": 8}
    return doc


@pytest.mark.timeout(600)
def test_joint_layout_truncates_exactly_in_a_real_run(tmp_path: Path):
    """Two passive parties, three MPC parties sharing every product (the joint
    layout): every step's z and loss within 16-bit fixed point of plain's."""
    run_doc(_doc("plain", {}), tmp_path / "plain")
    result = run_doc(
        _doc("mpc", {"weight_init": "seeded", "insecure": True, "layout": "joint"}), tmp_path / "mpc"
    )
    assert result["backend"] == "mpc"
    plain = torch.load(tmp_path / "plain" / "ranks" / "rank0.trace.pt", weights_only=True)
    mpc = torch.load(tmp_path / "mpc" / "ranks" / "rank0.trace.pt", weights_only=True)
    assert len(plain) == len(mpc) == 8
    for step, (a, b) in enumerate(zip(plain, mpc, strict=True)):
        assert float((a["z"] - b["z"]).abs().max()) <= 5e-4, step
        assert abs(float(a["loss"]) - float(b["loss"])) <= 5e-4, step
