"""The mpc backend's pairwise share layout, its pure parts in one process: the
two-party ring arithmetic, the dealer's pair triples against the parties' draws,
the bundle whitelist for them, and the step plan whose size is linear in k."""

from __future__ import annotations

import math

import pytest
import torch

from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.crypten_pool import Triple, Trunc, dealer_bundle, parse_bundle, plan_elements
from securevfl.exchange.mpc import ring
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
    from securevfl.exchange.crypten_dealer import SecretDealer

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
    from securevfl.exchange.crypten_rng import ring_element as draw

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
    with pytest.raises(ProtocolError, match="rank 5"):
        dealer_bundle(_dealer([1, 2, 3]), [Triple((2, 3), (3, 4), "matmul", 5)])


def test_pair_plan_is_linear_in_parties_and_truncates_per_pair():
    for k in (1, 2, 4):
        plan = pair_plan(256, [64] * k, 64, range(1, k + 1), train=True, lr=LR)
        triples = [it for it in plan if isinstance(it, Triple)]
        assert len(triples) == 3 * k and all(it.pair for it in triples)
        # one exact truncation's material per pair (momentum and weight step), no wraps pairs
        assert [it for it in plan if not isinstance(it, Triple)] == [
            Trunc((64 * 64,), 16, *LR, r) for r in range(1, k + 1)
        ]
        assert pair_ops(256, [64] * k, 64).rounds == 4
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
    from securevfl.exchange.mpc import MpcOptions, layout_of
    from tests.support.protocols import small_digits

    assert layout_of(MpcOptions(), "cpu") == "pairwise"
    assert layout_of(MpcOptions(), "cuda") == "joint"
    assert layout_of(MpcOptions(provider="TFP", insecure=True), "cpu") == "joint"
    assert layout_of(MpcOptions(layout="joint"), "cpu") == "joint"
    doc = small_digits()
    doc["exchange"] = {
        "backend": "mpc",
        "params": {"provider": "TFP", "insecure": True, "layout": "pairwise"},
    }
    where = r"exchange\.params\.layout"
    with pytest.raises(ConfigError, match=where), pytest.warns(UserWarning, match="TFP"):
        load_protocol_dict(doc)
