"""The mpc backend's pairwise share layout, its pure parts in one process: the
two-party ring arithmetic, the dealer's pair triples against the parties' draws,
the bundle whitelist for them, and the step plan whose size is linear in k."""

from __future__ import annotations

import math

import pytest
import torch

from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.mpc import ring
from securevfl.exchange.mpc.crypten.bundle import parse_bundle
from securevfl.exchange.mpc.crypten.dealer import dealer_bundle
from securevfl.exchange.mpc.crypten.items import PairStep, StepShares, Triple, Trunc, plan_elements
from securevfl.exchange.mpc.plan import pair_ops, pair_plan, step_ops

LR = (104858, 29)  # 0.05 / 256 at 16 significant bits (ops.fixed_scalar)


def _ring(shape: tuple[int, ...], g: torch.Generator) -> torch.Tensor:
    return torch.randint(-(2**63), 2**63 - 1, shape, generator=g, dtype=torch.long)


def test_two_party_beaver_product_and_truncation():
    """x held by one party (the other's share zero), y shared: the two shares of
    x @ y from a triple reconstruct it exactly at 32 fractional bits, and the local
    truncation of the shares is within one unit of the truncated value."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(8, 5, generator=g)
    y = torch.randn(5, 4, generator=g)
    xs = [torch.zeros(8, 5, dtype=torch.long), ring.encode(x, 16)]
    y0 = _ring((5, 4), g)
    ys = [y0, ring.encode(y, 16) - y0]
    a = [_ring((8, 5), g), _ring((8, 5), g)]
    b = [_ring((5, 4), g), _ring((5, 4), g)]
    c1 = _ring((8, 4), g)
    c = [(a[0] + a[1]).matmul(b[0] + b[1]) - c1, c1]
    eps = sum(ring.masked(xs[p], a[p]) for p in (0, 1))
    delta = sum(ring.masked(ys[p], b[p]) for p in (0, 1))
    z = [ring.beaver_share(eps, delta, a[p], b[p], c[p], first=p == 0) for p in (0, 1)]
    exact = ring.encode(x, 16).matmul(ring.encode(y, 16))
    assert torch.equal(z[0] + z[1], exact)
    assert torch.allclose(ring.decode(z[0] + z[1], 32), (x @ y).double(), atol=1e-3)
    t = ring.truncate(z[0], 16) + ring.truncate(z[1], 16)
    assert (t - exact.div(2**16, rounding_mode="trunc")).abs().max() <= 1


def _dealer(seeds: list[int]):
    from securevfl.exchange.mpc.crypten.dealer import SecretDealer

    return SecretDealer([SecretStream.from_seed(s, "dealer") for s in seeds])


def test_pair_triples_match_the_two_holders_draws():
    """Rank 0 and rank i draw a, b (rank i also c) of a pair-i triple from the streams
    they share with the dealer; the other ranks draw nothing for it, so their streams
    stay where they are. The dealer's c_0 completes c = a b."""
    seeds = [5, 6, 7]
    plan = [
        Triple((4, 3), (3, 2), "matmul", 1),
        Triple((4, 3), (3, 2), "matmul", 2),
        Triple((3, 4), (4, 2), "matmul", 1),
    ]
    c0 = dealer_bundle(_dealer(seeds), plan)  # imports crypten through securevfl's shim
    from securevfl.exchange.mpc.crypten.rng import ring_element as draw

    assert c0.numel() == plan_elements(plan) == 8 + 8 + 6
    gens = [SecretStream.from_seed(s, "dealer") for s in seeds]
    at = 0
    for it in plan:
        m = math.prod(it.out)
        holders = it.holders(3)
        assert holders == (0, it.pair)
        a = b = c = 0
        for rank in holders:
            g = gens[rank]
            a = a + draw(torch.Size(it.size0), generator=g)
            b = b + draw(torch.Size(it.size1), generator=g)
            c = c + (c0[at : at + m].reshape(it.out) if rank == 0 else draw(torch.Size(it.out), generator=g))
        assert torch.equal(c, a.matmul(b))
        at += m


def test_pair_items_are_validated():
    wire = [it.to_wire() for it in pair_plan(16, [8, 8], 4, [1, 2], train=True, lr=LR)]
    assert parse_bundle(wire) == pair_plan(16, [8, 8], 4, [1, 2], train=True, lr=LR)
    for bad in (
        [["pair", 0, torch.Size([2, 3]), torch.Size([3, 4])]],
        [["pair", "1", torch.Size([2, 3]), torch.Size([3, 4])]],
        [["pair", 1, torch.Size([2, 3]), torch.Size([4, 4])]],
        [["pair", 1 << 20, torch.Size([2, 3]), torch.Size([3, 4])]],
    ):
        with pytest.raises(ValueError):
            parse_bundle(bad)
    for bad in (
        [["step", 0, 16, 8, 4]],
        [["step", 1, 0, 8, 4]],
        [["step", 1, 16, 8.0, 4]],
        [["step", 1, 16, 8]],
        [["step", 1, 1 << 20, 1 << 20, 4]],
    ):
        with pytest.raises(ValueError):
            parse_bundle(bad)
    with pytest.raises(ProtocolError, match="rank 5"):
        dealer_bundle(_dealer([1, 2, 3]), [Triple((2, 3), (3, 4), "matmul", 5)])
    with pytest.raises(ProtocolError, match="rank 3"):
        dealer_bundle(_dealer([1, 2, 3]), [PairStep(2, 3, 4, 3)])


def _step_shares(seeds: list[int], it: PairStep) -> list[StepShares]:
    """Rank 0's and rank it.pair's parts of one PairStep, drawn as SecretTTP draws
    them (rank 0: its share of v, g whole; rank i: u whole, its share of v, then its
    shares of c, e, f; rank 0 receives its shares of those)."""
    c0 = dealer_bundle(_dealer(seeds), [it])
    g0, gi = (SecretStream.from_seed(seeds[r], "dealer") for r in (0, it.pair))
    v0, gm = (g0.ring(x) for x in it.draws(True))
    sizes = [math.prod(x) for x in it.products]
    c, e, f = (t.reshape(x) for t, x in zip(c0.split(sizes), it.products, strict=True))
    u, vi = (gi.ring(x) for x in it.draws(False))
    ci, ei, fi = (gi.ring(x) for x in it.products)
    return [StepShares(None, v0, gm, c, e, f), StepShares(u, vi, None, ci, ei, fi)]


def test_a_pair_step_gives_the_three_products_from_three_openings():
    """A training step's products from one PairStep: h' (P_i's) opened once under
    u, which P_i alone holds, W (shared) once under v, dL/dz (A's) once under g,
    which A alone holds. The forward and both backward products reconstruct
    exactly from each party's product_share, which skips the products with the
    one-sided masks' zero shares: 4 ring products a party where 3 Beaver products
    take 6, and 3 openings where 3 Beaver triples need 6."""
    g = torch.Generator().manual_seed(11)
    b, d, o = 8, 5, 3
    it = PairStep(b, d, o, 2)
    a_part, p_part = _step_shares([4, 9, 13], it)
    u, v, gm = p_part.u, a_part.v + p_part.v, a_part.g
    assert u is not None and gm is not None and a_part.u is None and p_part.g is None
    assert torch.equal(a_part.c + p_part.c, u @ v)
    assert torch.equal(a_part.e + p_part.e, gm @ v.t())
    assert torch.equal(a_part.f + p_part.f, u.t() @ gm)
    h, w, grad = (ring.encode(torch.randn(*shape, generator=g), 16) for shape in ((b, d), (d, o), (b, o)))
    w_a = _ring((d, o), g)
    w_p = w - w_a
    eps = h - u  # P_i's alone: it sends eps to A
    delta = (w_a - a_part.v) + (w_p - p_part.v)  # opened both ways
    phi = grad - gm  # A's alone: it sends phi to P_i
    ut = p_part.u.t()
    z = [ring.product_share(eps, delta, None, a_part.v, a_part.c, True)]
    z.append(ring.product_share(eps, delta, u, p_part.v, p_part.c, False))
    dh = [ring.product_share(phi, delta.t(), gm, a_part.v.t(), a_part.e, True)]
    dh.append(ring.product_share(phi, delta.t(), None, p_part.v.t(), p_part.e, False))
    dw = [ring.product_share(eps.t(), phi, None, gm, a_part.f, True)]
    dw.append(ring.product_share(eps.t(), phi, ut, None, p_part.f, False))
    assert torch.equal(z[0] + z[1], h @ w)
    assert torch.equal(dh[0] + dh[1], grad @ w.t())
    assert torch.equal(dw[0] + dw[1], h.t() @ grad)


def test_product_share_skips_a_one_sided_masks_zero_share_and_agrees_with_beaver():
    """With both mask shares given, product_share is Beaver's share; with a mask
    share None it equals Beaver's share with that share zero, for either party."""
    g = torch.Generator().manual_seed(5)
    eps, delta, a, b, c = (
        _ring((6, 4), g),
        _ring((4, 3), g),
        _ring((6, 4), g),
        _ring((4, 3), g),
        _ring((6, 3), g),
    )
    zero_a, zero_b = torch.zeros_like(a), torch.zeros_like(b)
    for first in (True, False):
        assert torch.equal(
            ring.product_share(eps, delta, a, b, c, first), ring.beaver_share(eps, delta, a, b, c, first)
        )
        assert torch.equal(
            ring.product_share(eps, delta, None, b, c, first),
            ring.beaver_share(eps, delta, zero_a, b, c, first),
        )
        assert torch.equal(
            ring.product_share(eps, delta, a, None, c, first),
            ring.beaver_share(eps, delta, a, zero_b, c, first),
        )
        assert torch.equal(
            ring.product_share(eps, delta, None, None, c, first),
            ring.beaver_share(eps, delta, zero_a, zero_b, c, first),
        )


def test_pair_plan_is_linear_in_parties_and_truncates_per_pair():
    for k in (1, 2, 4):
        plan = pair_plan(256, [64] * k, 64, range(1, k + 1), train=True, lr=LR)
        # a training step: one PairStep per pair (its three products), then one exact
        # truncation's material per pair (momentum and weight step), no wraps pairs
        assert plan == [PairStep(256, 64, 64, r) for r in range(1, k + 1)] + [
            Trunc((64 * 64,), 16, *LR, r) for r in range(1, k + 1)
        ]
        # a forward pass alone: one Beaver triple per pair
        assert pair_plan(256, [64] * k, 64, range(1, k + 1), train=False) == [
            Triple((256, 64), (64, 64), "matmul", r) for r in range(1, k + 1)
        ]
        ops = pair_ops(256, [64] * k, 64)
        assert (ops.rounds, ops.matmuls, ops.openings) == (4, 3 * k, 3 * k)
    # each pair holds its own three products; the joint layout's ring elements per
    # step grow with k + 1 holders, the pairwise with 2
    one, four = (
        plan_elements(pair_plan(256, [64] * k, 64, range(1, k + 1), train=True, lr=LR)) for k in (1, 4)
    )
    assert four == 4 * one
    # the joint layout's truncations travel with the reveal of dL/dh_i too
    assert step_ops(256, [64] * 4, 64, 5).rounds == 4


def test_layout_auto_and_refusals():
    from securevfl.app.loader import load_protocol_dict
    from securevfl.errors import ConfigError
    from securevfl.exchange.mpc import MpcOptions, share_layout
    from tests.support.protocols import small_digits

    assert share_layout(MpcOptions(), "cpu") == "pairwise"
    assert share_layout(MpcOptions(), "cuda") == "joint"
    assert share_layout(MpcOptions(provider="TFP", insecure=True), "cpu") == "joint"
    assert share_layout(MpcOptions(layout="joint"), "cpu") == "joint"
    doc = small_digits()
    doc["exchange"] = {
        "backend": "mpc",
        "params": {"provider": "TFP", "insecure": True, "layout": "pairwise"},
    }
    where = r"exchange\.params\.layout"
    with pytest.raises(ConfigError, match=where), pytest.warns(UserWarning, match="TFP"):
        load_protocol_dict(doc)
