"""The mpc backend's offline phase and step plan: pure parts, checked in one
process (the parties' draws and the dealer's bundle stay aligned; the bundle
request whitelist; the public fixed-point scalars)."""

from __future__ import annotations

import itertools
import math
from collections import Counter

import pytest
import torch

from securevfl._compat import import_crypten
from securevfl.csprng import SecretStream
from securevfl.errors import ProtocolError
from securevfl.exchange.base import RunPlan
from securevfl.exchange.crypten_pool import (
    Triple,
    Trunc,
    Wraps,
    dealer_bundle,
    parse_bundle,
    plan_elements,
    product_shape,
)
from securevfl.exchange.crypten_runtime import decode_obj, encode_obj, parse_dealer_request
from securevfl.exchange.mpc.ops import fixed_scalar
from securevfl.exchange.mpc.plan import Lookahead, chunk_steps, pair_plan, step_ops, step_plan, top_up

LR = (104858, 29)  # 0.05 / 256 at 16 significant bits (fixed_scalar)


@pytest.mark.parametrize("x", [0.9, 0.05 / 32, 0.003 / 256, 1.0, 3.7, -2e-4])
def test_fixed_scalar_keeps_16_significant_bits(x):
    val, shift = fixed_scalar(x)
    assert shift >= 16
    assert abs(val / 2**shift - x) <= 2.0 ** -(shift + 1) + 1e-18
    assert abs(val) >= 2**15  # 16 significant bits, whatever the magnitude
    assert abs(val / 2**shift - x) / abs(x) < 2**-15


def test_fixed_scalar_of_zero():
    assert fixed_scalar(0.0) == (0, 16)


def test_step_plan_shapes_and_truncation_material():
    plan = step_plan(256, [64, 32], 16, 3, train=True, lr=LR)
    triples = [it for it in plan if isinstance(it, Triple)]
    assert [t.out for t in triples] == [(256, 16), (256, 16), (256, 64), (256, 32), (64, 16), (32, 16)]
    # one exact truncation (momentum and weight step) of every weight, whatever the
    # number of MPC parties; evaluation needs the forward products only
    for n_mpc in (2, 3):
        plan = step_plan(256, [64, 32], 16, n_mpc, train=True, lr=LR)
        assert [it for it in plan if not isinstance(it, Triple)] == [Trunc((96 * 16,), 16, *LR)]
    fwd = [Triple((100, 64), (64, 16)), Triple((100, 32), (32, 16))]
    assert step_plan(100, [64, 32], 16, 3, train=False) == fwd
    with pytest.raises(ValueError, match="learning rate"):
        step_plan(100, [64, 32], 16, 3, train=True)


def test_step_counts_do_not_grow_in_rounds_with_parties():
    one, four = step_ops(256, [64], 64, 2), step_ops(256, [64] * 4, 64, 5)
    assert (one.matmuls, four.matmuls) == (3, 12)
    assert one.rounds == 4 and four.rounds == step_ops(256, [64] * 2, 64, 3).rounds == 4
    assert step_ops(256, [64] * 2, 64, 3, offline_steps=16).dealer_requests == 1 / 16


def test_top_up_only_when_short_and_to_the_chunk():
    plan = step_plan(8, [4, 4], 2, 3, train=True, lr=LR)
    assert top_up(plan, {it: 5 for it in plan}, steps=4) == []
    stock = {it: 5 for it in plan}
    fwd = plan[0]
    stock[fwd] = 0
    bundle = top_up(plan, stock, steps=4)
    # the same forward triple serves both parties (equal widths): 2 a step, 8 wanted
    assert bundle.count(fwd) == 8
    assert all(bundle.count(it) == 0 for it in plan if it != fwd and stock[it] >= 4 * plan.count(it))


def test_chunk_sizes():
    assert chunk_steps(1000, 16, None, full_batch=True) == 16
    assert chunk_steps(1000, 16, 3, full_batch=True) == 3
    assert chunk_steps(1000, 16, None, full_batch=False) == 1  # an epoch's short batch
    assert chunk_steps(64 << 20, 16, None, full_batch=True) == 1  # the pooled-bytes bound
    # forward-only plans (evaluation, prediction) one step at a time
    assert chunk_steps(1000, 16, None, full_batch=True, train=False) == 1
    assert chunk_steps(1000, 16, 3, full_batch=True, train=False) == 1


def test_chunk_sizes_with_the_steps_ahead():
    # no more than the run will take of this shape; without a count, as before
    assert chunk_steps(1000, 16, None, full_batch=True, ahead=14) == 14
    assert chunk_steps(1000, 16, None, full_batch=True, ahead=40) == 16
    assert chunk_steps(1000, 16, 3, full_batch=True, ahead=14) == 3
    assert chunk_steps(1000, 16, None, full_batch=False, ahead=3) == 3  # every epoch's short batch at once
    assert chunk_steps(1000, 16, None, full_batch=True, train=False, ahead=9) == 9  # one evaluation pass
    assert chunk_steps(64 << 20, 16, None, full_batch=True, ahead=14) == 1  # the pooled-bytes bound


def _drive(
    layout: str, steps: list[tuple[int, bool]], max_steps: int, run: RunPlan | None
) -> tuple[int, int, int]:
    """The pool across ``steps`` ((batch size, training?) in order), as both layouts'
    roles drive it, with a Lookahead given ``run`` or none: (tuples fetched, used,
    bundles). Every step must find its tuples in the pool."""

    def plan(batch: int, train: bool) -> list:
        if layout == "joint":
            return step_plan(batch, [64, 64], 64, 3, train=train, lr=LR)
        return pair_plan(batch, [64, 64], 64, [1, 2], train=train, lr=LR)

    ahead = None
    if run is not None:
        ahead = Lookahead()
        ahead.expect(run)
    stock: dict = {}
    fetched = used = bundles = 0
    for batch, train in steps:
        p = plan(batch, train)
        left = None if ahead is None else ahead.ahead(batch, train)
        steps_now = chunk_steps(1 << 20, 16, max_steps, full_batch=batch == 256, train=train, ahead=left)
        bundle = top_up(p, stock, steps_now)
        if ahead is not None:
            ahead.took(batch, train)
        fetched += len(bundle)
        bundles += bool(bundle)
        for it in bundle:
            stock[it] = stock.get(it, 0) + 1
        for it in p:
            assert stock.get(it, 0) > 0
            stock[it] -= 1
        used += len(p)
    return fetched, used, bundles


@pytest.mark.parametrize("layout", ["joint", "pairwise"])
def test_an_epoch_end_evaluation_leaves_no_triples_in_the_pool(layout):
    """The pool across 3 training steps (max_steps 3) and the evaluation that
    follows (a full batch and a short one), as both layouts' roles drive it: every
    tuple the dealer made is used; the evaluation used to fetch 16 forward steps
    for its one full batch."""
    fetched, used, _ = _drive(layout, [(256, True)] * 3 + [(256, False), (104, False)], 3, None)
    assert fetched == used


@pytest.mark.parametrize("layout", ["joint", "pairwise"])
def test_a_run_that_says_its_steps_uses_every_tuple_the_dealer_makes(layout):
    """With the run's plan (Lookahead) every tuple the dealer makes is used; without
    it the last training bundle outlives the run (max_steps counts the short batch
    too: 62 tuples made for 60 used in the pairwise layout, 157 for 93 in the joint
    one). In the pairwise layout each evaluation pass also takes one bundle per batch
    shape instead of one per batch (7 bundles in all instead of 10)."""
    # two epochs of 5 full batches and a short one (digits at batch 256: 1,437 rows)
    # cut at max_steps 11, an evaluation of 3 full batches and a short one after each
    train = [256] * 5 + [157] + [256] * 5
    evaluation = [256] * 3 + [104]
    steps = [(b, True) for b in train[:6]] + [(b, False) for b in evaluation]
    steps += [(b, True) for b in train[6:]] + [(b, False) for b in evaluation]
    fetched, used, bundles = _drive(layout, steps, 11, RunPlan(Counter(train), tuple(evaluation)))
    assert fetched == used
    before = _drive(layout, steps, 11, None)
    assert before[0] > before[1]  # tuples the dealer made for nothing
    if layout == "pairwise":
        assert bundles < before[2]


def test_lookahead_unknown_without_a_plan_and_past_it():
    ahead = Lookahead()
    assert ahead.ahead(256, True) is None and ahead.ahead(256, False) is None
    ahead.expect(RunPlan({256: 2}, (256,)))
    assert ahead.ahead(256, True) == 2 and ahead.ahead(64, True) is None
    ahead.took(256, True)
    ahead.took(256, True)
    assert ahead.ahead(256, True) is None  # more steps than the run said: sized as without a plan
    ahead.took(256, False)  # a pass is over: the next evaluation runs the same batches
    assert ahead.ahead(256, False) == 1


def test_bundle_request_round_trips_and_is_validated():
    plan = step_plan(16, [8, 8], 4, 3, train=True, lr=LR)
    msg = {"function": "bundle", "device": None, "args": [[it.to_wire() for it in plan]], "kwargs": {}}
    fn, args, device = parse_dealer_request(decode_obj(encode_obj(msg)))
    assert fn == "bundle" and args == plan and device is None


@pytest.mark.parametrize(
    "items",
    [
        [],
        [["additive", torch.Size([2, 3]), torch.Size([4, 5]), "matmul"]],  # shapes do not multiply
        [["additive", torch.Size([2]), torch.Size([2]), "conv2d"]],
        [["square", torch.Size([2])]],
        [["wraps", [2, 2]]],
        "additive",
        [["wraps", torch.Size([1 << 14, 1 << 13])]],  # over the element bound
    ],
)
def test_bundle_refuses_other_items(items):
    msg = {"function": "bundle", "device": None, "args": [items], "kwargs": {}}
    with pytest.raises(ProtocolError, match="invalid dealer request"):
        parse_dealer_request(msg)


def test_bundle_size_bound():
    with pytest.raises(ValueError, match="too large"):
        parse_bundle([["wraps", torch.Size([10])]], max_elements=9)


def test_dealer_bundle_matches_the_parties_draws():
    """The parties draw a, b (and c for rank != 0; r, theta for wraps) from the
    stream they share with the dealer, in plan order; the dealer's bundle is
    rank 0's share: the reconstructed c equals a @ b and theta counts the wraps."""
    import_crypten()
    from crypten.common.util import count_wraps

    from securevfl.exchange.crypten_dealer import SecretDealer
    from securevfl.exchange.crypten_rng import ring_element as generate_random_ring_element

    seeds = [11, 22, 33]
    server = SecretDealer([SecretStream.from_seed(s, "dealer") for s in seeds])
    plan = [Triple((5, 3), (3, 2)), Wraps((7,)), Triple((2, 5), (5, 3))]
    c0 = dealer_bundle(server, plan)
    assert c0.numel() == plan_elements(plan) == 10 + 7 + 6
    gens = [SecretStream.from_seed(s, "dealer") for s in seeds]
    at = 0
    for it in plan:
        m = math.prod(it.out)
        if isinstance(it, Triple):
            draws = []
            for rank, g in enumerate(gens):
                ai = generate_random_ring_element(torch.Size(it.size0), generator=g)
                bi = generate_random_ring_element(torch.Size(it.size1), generator=g)
                if rank == 0:
                    ci = c0[at : at + m].reshape(it.out)
                else:
                    ci = generate_random_ring_element(torch.Size(it.out), generator=g)
                draws.append((ai, bi, ci))
            a_sum = sum(d[0] for d in draws)
            b_sum = sum(d[1] for d in draws)
            assert torch.equal(sum(d[2] for d in draws), a_sum.matmul(b_sum))
        else:
            rs, ths = [], []
            for rank, g in enumerate(gens):
                rs.append(generate_random_ring_element(torch.Size(it.size), generator=g))
                size = torch.Size(it.size)
                ths.append(generate_random_ring_element(size, generator=g) if rank else c0[at : at + m])
            assert torch.equal(sum(ths), count_wraps(rs))
        at += m


def test_pooled_bytes_counts_every_share_a_party_keeps():
    from securevfl.exchange.crypten_pool import pooled_bytes

    # (2x3)(3x4): a 6, b 12, c 8 elements; wraps of 5: r 5, theta 5
    assert pooled_bytes([Triple((2, 3), (3, 4)), Wraps((5,))]) == 8 * (6 + 12 + 8 + 10)


_SHAPES = [
    (3,),
    (4,),
    (1,),
    (2, 3),
    (3, 4),
    (3, 2),
    (4, 3),
    (2, 1),
    (1, 3),
    (5, 2, 3),
    (1, 3, 4),
    (5, 3, 4),
    (2, 1, 3, 4),
]


@pytest.mark.parametrize("op", ["mul", "matmul"])
def test_product_shape_is_torchs(op):
    """Every item's c shape comes from shape arithmetic (no meta tensors): the same
    shape torch gives, and a ValueError wherever torch refuses, over every pair of a
    set of 1- to 4-d shapes."""
    for a, b in itertools.product(_SHAPES, repeat=2):
        x, y = torch.empty(a), torch.empty(b)
        try:
            want = tuple((x.matmul(y) if op == "matmul" else x * y).shape)
        except RuntimeError:
            with pytest.raises(ValueError):
                product_shape(a, b, op)
            continue
        assert product_shape(a, b, op) == want, (a, b)


@pytest.mark.parametrize("layout", ["joint", "pairwise"])
def test_prediction_takes_its_batches_in_bundles_of_offline_steps(layout):
    """Prediction over 20 full batches and a short one says its one pass: the
    dealer makes 16, 4 and 1 steps' tuples in three bundles, every one of them used,
    where one bundle a batch took 21 round trips."""
    steps = [(256, False)] * 20 + [(10, False)]
    run = RunPlan({}, tuple(b for b, _ in steps))
    fetched, used, bundles = _drive(layout, steps, 0, run)
    assert fetched == used and bundles == 3
    assert _drive(layout, steps, 0, None)[2] == 21
