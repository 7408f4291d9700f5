"""Exact truncation of shared ring elements (securevfl.exchange.mpc.truncation): the
dealer's material, the masked opening and each party's result, simulated for two
parties (the pairwise layout) and three (the joint one) from secret streams."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import securevfl.exchange.mpc.truncation as truncation
from securevfl.csprng import SecretStream

LR = (104858, 29)  # 0.05 / 256 at 16 significant bits (ops.fixed_scalar)


def _shares(x: torch.Tensor, n: int, g: SecretStream) -> list[torch.Tensor]:
    parts = [g.ring(tuple(x.shape)) for _ in range(n - 1)]
    return [x - sum(parts), *parts] if parts else [x]


def truncate_shared(
    xs: list[torch.Tensor], g: SecretStream, frac: int = 16, scale: tuple[int, int] = LR
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Run the protocol among len(xs) parties (the dealer's streams drawn from ``g``):
    returns the opened c and the reconstructed V and scaled step."""
    n, shape = len(xs), tuple(xs[0].shape)
    rs = [g.ring(shape) for _ in range(n)]
    mat = torch.stack(truncation.material(sum(rs), frac, *scale))  # type: ignore[arg-type]
    others = [g.ring((4, *shape)) for _ in range(n - 1)]
    shares = [mat - sum(others), *others] if others else [mat]
    c = sum(truncation.masked(x, r, j == 0) for j, (x, r) in enumerate(zip(xs, rs, strict=True)))
    assert isinstance(c, torch.Tensor)
    outs = [truncation.finish(c, shares[j].unbind(0), frac, *scale, first=j == 0) for j in range(n)]
    return c, sum(o[0] for o in outs), sum(o[1] for o in outs)  # type: ignore[return-value]


@pytest.mark.parametrize("n", [2, 3])
def test_exact_for_every_value_within_half_the_ring(n: int):
    """V is floor(x / 2^16) or one more, the scaled step floor(L V / 2^s) or one more,
    for values spread over every magnitude up to 2^62, the edges included."""
    g = SecretStream.from_seed(1, "trunc", n)
    mags = g.integers((200_000,), 0, 62)
    x = g.ring((200_000,)) >> (63 - mags)  # |x| < 2^mags
    edges = torch.tensor([0, 1, -1, 2**16, -(2**16), 2**62 - 1, -(2**62), 2**61 + 12345, -(2**61) - 7])
    x = torch.cat([x, edges])
    _, v, step = truncate_shared(_shares(x, n, g), g)
    dv = v - torch.div(x, 2**16, rounding_mode="floor")
    assert set(dv.unique().tolist()) <= {0, 1}
    ds = step - ((LR[0] * v) >> LR[1])  # |L V| < 2^63: exact in int64
    assert set(ds.unique().tolist()) <= {0, 1}


def test_the_opening_is_uniform_whatever_the_value():
    """c = x + 2^62 + r for a uniform r: the opened values of a constant x look like
    uniform ring elements (every bit balanced)."""
    g = SecretStream.from_seed(2, "trunc")
    x = torch.full((100_000,), 2**40 + 3, dtype=torch.long)
    c, _, _ = truncate_shared(_shares(x, 2, g), g)
    bits = ((c.unsqueeze(1) >> torch.arange(64)) & 1).double().mean(0)
    assert float((bits - 0.5).abs().max()) < 0.01  # 5 sigma at 100k draws is 0.008


def test_rounding_is_unbiased():
    """The last unit is rounded up with probability (x mod 2^16) / 2^16."""
    g = SecretStream.from_seed(3, "trunc")
    x = torch.full((200_000,), 5 * 2**16 + 2**14, dtype=torch.long)  # 5.25 units
    _, v, _ = truncate_shared(_shares(x, 2, g), g)
    assert set(v.unique().tolist()) == {5, 6}
    assert float(v.double().mean()) == pytest.approx(5.25, abs=0.005)


def test_mul_shift_matches_python_integers():
    g = SecretStream.from_seed(4, "mul_shift")
    q = g.ring((5_000,))
    for scale in (104858, -3, 1, (1 << 31) - 1, -(1 << 31) + 1, 0):
        for shift in (0, 5, 29, 32, 40, 63):
            got = truncation.mul_shift(scale, q, shift).numpy().view(np.uint64)
            want = [((scale * int(v)) >> shift) % 2**64 for v in q.tolist()]
            assert got.tolist() == want, (scale, shift)
    with pytest.raises(ValueError):
        truncation.mul_shift(1 << 31, q, 0)


def test_material_refuses_out_of_range_bits():
    r = torch.zeros(3, dtype=torch.long)
    for bad in (0, 63):
        with pytest.raises(ValueError):
            truncation.material(r, bad, *LR)
    assert math.prod(truncation.material(r, 62, *LR)[0].shape) == 3
