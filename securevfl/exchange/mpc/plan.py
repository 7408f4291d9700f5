"""What one step of the ``mpc`` interactive layer consumes and sends: the
dealer's tuples (the offline plan) and the online protocol's operation counts,
for both share layouts (``layout: pairwise``, the default, and ``joint``).

Pure functions of the step's shape, shared by the backend (which asks the
dealer for exactly this plan), the benchmark's op-count floor and the tests.

A training step, k passive parties with embedding widths d_i, batch B, output
o, N = k + 1 MPC parties (docs/design.md §4, docs/benchmarks.md §3.2):

* forward: k products h_i W_i (one opening round), their untruncated sum z
  revealed to A (one reduce);
* backward: 2k products dL/dz W_i^T and h_i^T dL/dz (one opening round);
  dL/dh_i revealed to P_i, all k in one round; the momentum update
  v_i <- trunc(m v_i + h_i^T dL/dz) and the weight update
  W_i <- W_i - trunc(lr' v_i): both exact truncations of one opening
  (:mod:`securevfl.exchange.truncation`, the dealer's :class:`Trunc` material),
  which travels in the round that reveals dL/dh_i.

That is the ``joint`` layout (:func:`step_plan`, :func:`step_ops`): every product
shared among all N parties. In the ``pairwise`` layout (:func:`pair_plan`,
:func:`pair_ops`; :mod:`.pairwise`) P_i's three products are shared between A and
P_i alone, from triples only those two hold; the openings of all pairs run in one
round, z is revealed to A from every pair's shares (masked by a zero sharing) in
one round and each dL/dh_i in one, with each pair's truncation opening: 4 rounds
for any k, and each pair's work and bytes are those of a two-party computation, so
a step's total grows linearly in k.

A training plan needs the learning rate's public fixed-point form ``lr`` = (L, s)
(:func:`securevfl.exchange.mpc.ops.fixed_scalar`): the dealer's truncation material
depends on it; byte counts do not.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from securevfl.exchange.crypten_pool import Item, Triple, Trunc, plan_elements

RING_BYTES = 8
FRAC_BITS = 16  # CrypTen's fixed point (cfg.encoder.precision_bits)
OFFLINE_BYTES = 64 << 20  # bound on one party's pooled tuples
_ANY_LR = (1, 0)  # a plan's sizes do not depend on the learning rate


def chunk_steps(
    per_step_bytes: int, offline_steps: int, max_steps: int | None, *, full_batch: bool, train: bool = True
) -> int:
    """How many steps' tuples one offline bundle holds: ``offline_steps``, no more
    than the run's ``max_steps``, one for an epoch's short last batch (its shape
    comes once per epoch), and within :data:`OFFLINE_BYTES` of pooled shares.

    A forward-only plan (evaluation, prediction: ``train`` false) takes one step at
    a time: the evaluation at the end of an epoch runs a batch or two, and a chunk
    of ``offline_steps`` left the rest of the dealer's forward triples in the pool,
    serving the next epoch's training at best and nothing after the last one."""
    steps = offline_steps
    if max_steps:
        steps = min(steps, max_steps)
    if not full_batch or not train:
        steps = 1
    return max(1, min(steps, OFFLINE_BYTES // max(1, per_step_bytes)))


def _lr(lr: tuple[int, int] | None) -> tuple[int, int]:
    if lr is None:
        raise ValueError(
            "a training plan needs the learning rate's fixed-point form (its truncation material)"
        )
    return lr


def step_plan(
    batch: int, dims: Sequence[int], out: int, n_mpc: int, *, train: bool, lr: tuple[int, int] | None = None
) -> list[Item]:
    """The tuples one step consumes, in a fixed order every party agrees on: the
    Beaver triples and, in training, the material of one exact truncation of every
    weight (the momentum and, scaled by ``lr``, the weight step)."""
    plan: list[Item] = [Triple((batch, d), (d, out)) for d in dims]
    if not train:
        return plan
    scale, shift = _lr(lr)
    plan += [Triple((batch, out), (out, d)) for d in dims]
    plan += [Triple((d, batch), (batch, out)) for d in dims]
    plan += [Trunc((sum(d * out for d in dims),), FRAC_BITS, scale, shift)]
    return plan


def top_up(plan: Sequence[Item], stock: dict[Item, int], steps: int) -> list[Item]:
    """The bundle that brings the pool to ``steps`` steps' worth of ``plan`` when it
    holds less than one step of some item, else []. Depends only on the plan
    and the pool, which every party tracks identically."""
    need = Counter(plan)
    if all(stock.get(it, 0) >= n for it, n in need.items()):
        return []
    bundle: list[Item] = []
    for it in dict.fromkeys(plan):
        bundle += [it] * max(0, steps * need[it] - stock.get(it, 0))
    return bundle


@dataclass(frozen=True)
class StepOps:
    """Online operation counts of one training step (the critical path)."""

    matmuls: int  # Beaver products
    openings: int  # masked operands opened (x - a and y - b: 2 per product)
    rounds: int  # sequential communication rounds among the MPC parties
    truncations: int  # exact truncations in shares (one opening, in the reveal round)
    dealer_requests: float  # per step, amortised over the offline chunk
    offline_bytes: int  # dealer -> rank 0, per step

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def step_ops(batch: int, dims: Sequence[int], out: int, n_mpc: int, *, offline_steps: int = 1) -> StepOps:
    """Counts for one training step (forward and backward) of ``step_plan``."""
    # rounds: forward opening, reveal z; backward opening, reveal dL/dh_i with the truncations' opening
    plan = step_plan(batch, dims, out, n_mpc, train=True, lr=_ANY_LR)
    return StepOps(
        matmuls=3 * len(dims),
        openings=6 * len(dims),
        rounds=4,
        truncations=2,
        dealer_requests=1 / max(1, offline_steps),
        offline_bytes=RING_BYTES * plan_elements(plan),
    )


def pair_plan(
    batch: int,
    dims: Sequence[int],
    out: int,
    ranks: Sequence[int],
    *,
    train: bool,
    lr: tuple[int, int] | None = None,
) -> list[Item]:
    """The pairwise layout's tuples for one step: P_i's (rank ``ranks[i]``) triples
    and, in training, its truncation material, with A only, in a fixed order every
    party agrees on."""
    pairs = list(zip(dims, ranks, strict=True))
    plan: list[Item] = [Triple((batch, d), (d, out), "matmul", r) for d, r in pairs]
    if not train:
        return plan
    scale, shift = _lr(lr)
    plan += [Triple((batch, out), (out, d), "matmul", r) for d, r in pairs]
    plan += [Triple((d, batch), (batch, out), "matmul", r) for d, r in pairs]
    plan += [Trunc((d * out,), FRAC_BITS, scale, shift, r) for d, r in pairs]
    return plan


def pair_ops(batch: int, dims: Sequence[int], out: int, *, offline_steps: int = 1) -> StepOps:
    """Counts for one training step in the pairwise layout: forward opening, reveal
    of z, backward opening, reveal of every dL/dh_i with the truncations' opening
    (4 rounds whatever k); two exact truncations from that one opening."""
    plan = pair_plan(batch, dims, out, range(1, len(dims) + 1), train=True, lr=_ANY_LR)
    return StepOps(
        matmuls=3 * len(dims),
        openings=6 * len(dims),
        rounds=4,
        truncations=2,
        dealer_requests=1 / max(1, offline_steps),
        offline_bytes=RING_BYTES * plan_elements(plan),
    )
