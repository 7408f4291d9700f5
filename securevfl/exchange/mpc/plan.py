"""What one step of the ``mpc`` interactive layer consumes and sends: the
dealer's tuples (the offline plan) and the online protocol's operation counts,
for both share layouts (``layout: pairwise``, the default, and ``joint``).

Pure functions of the step's shape, shared by the backend (which asks the
dealer for exactly this plan), the benchmark's op-count floor and the tests.

A training step, k passive parties with embedding widths d_i, batch B, output
o, N = k + 1 MPC parties (docs/design.md §4, docs/benchmarks.md §3.2):

* forward: k products h_i W_i (one opening round), their untruncated sum z
  revealed to A (one reduce);
* backward: 2k products dL/dz W_i^T and h_i^T dL/dz (one opening round: in the
  pairwise layout of dL/dz alone, h'_i and W_i being open under the forward
  pass's masks, :class:`~securevfl.exchange.mpc.crypten.items.PairStep`);
  dL/dh_i revealed to P_i, all k in one round; the momentum update
  v_i <- trunc(m v_i + h_i^T dL/dz) and the weight update
  W_i <- W_i - trunc(lr' v_i): both exact truncations of one opening
  (:mod:`securevfl.exchange.mpc.truncation`, the dealer's :class:`Trunc` material),
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

from securevfl.exchange.base import RunPlan
from securevfl.exchange.mpc.crypten.items import Item, PairStep, Triple, Trunc, plan_elements

RING_BYTES = 8
FRAC_BITS = 16  # CrypTen's fixed point (cfg.encoder.precision_bits)
OFFLINE_BYTES = 64 << 20  # bound on one party's pooled tuples
_ANY_LR = (1, 0)  # a plan's sizes do not depend on the learning rate


def chunk_steps(
    per_step_bytes: int,
    offline_steps: int,
    max_steps: int | None,
    *,
    full_batch: bool,
    train: bool = True,
    ahead: int | None = None,
) -> int:
    """How many steps' tuples one offline bundle holds: ``offline_steps``, no more
    than the run's ``max_steps``, no more than the ``ahead`` steps of this shape the
    run has still to take when it says (:class:`Lookahead`), and within
    :data:`OFFLINE_BYTES` of pooled shares.

    Without ``ahead`` (a caller that did not say), an epoch's short
    last batch (its shape comes once per epoch) and a forward-only plan (evaluation,
    prediction: ``train`` false) take one step at a time: a chunk of ``offline_steps``
    would leave the rest of the dealer's tuples in the pool, serving the next
    epoch at best and nothing after the last one."""
    steps = offline_steps
    if max_steps:
        steps = min(steps, max_steps)
    if ahead:
        steps = min(steps, ahead)
    elif not full_batch or not train:
        steps = 1
    return max(1, min(steps, OFFLINE_BYTES // max(1, per_step_bytes)))


class Lookahead:
    """How many steps of each batch size the run has still to take through the
    exchange (from the :class:`~securevfl.exchange.base.RunPlan` the training loop
    gives it once), so that no offline bundle holds more than the run will use:
    training steps counted down over the whole run, evaluation batches over each
    pass (every evaluation runs the same batches). Every party keeps the same
    counts, so every party's :func:`chunk_steps` agrees. Without a plan every count
    is unknown (None) and :func:`chunk_steps` sizes as before."""

    def __init__(self) -> None:
        self._train: Counter[int] | None = None
        self._pass: Counter[int] = Counter()
        self._left: Counter[int] = Counter()

    def expect(self, plan: RunPlan) -> None:
        self._train = Counter(plan.train)
        self._pass = Counter(plan.evaluation)
        self._left = Counter(plan.evaluation)

    def ahead(self, batch: int, train: bool) -> int | None:
        """Steps of this batch size still to come, the next one included (None when
        unknown, or when the run takes more of them than it said)."""
        if train:
            n = None if self._train is None else self._train[batch]
        else:
            n = self._left[batch] if self._pass else None
        return n if n and n > 0 else None

    def took(self, batch: int, train: bool) -> None:
        """One step of this batch size went through the exchange."""
        if train:
            if self._train is not None:
                self._train[batch] -= 1
            return
        if self._pass:
            self._left[batch] -= 1
            if all(n <= 0 for n in self._left.values()):  # the pass is over; the next one runs the same
                self._left = Counter(self._pass)


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
    openings: int  # masked operands opened (joint: x - a and y - b per product; pairwise: h', W, dL/dz once)
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
    """The pairwise layout's tuples for one step, P_i's (rank ``ranks[i]``) with A
    only, in a fixed order every party agrees on: a forward pass (evaluation,
    prediction) takes one Beaver triple per pair; a training step one
    :class:`~securevfl.exchange.mpc.crypten.items.PairStep` per pair (its forward and
    backward products from three masks) and its truncation material."""
    pairs = list(zip(dims, ranks, strict=True))
    if not train:
        return [Triple((batch, d), (d, out), "matmul", r) for d, r in pairs]
    scale, shift = _lr(lr)
    plan: list[Item] = [PairStep(batch, d, out, r) for d, r in pairs]
    plan += [Trunc((d * out,), FRAC_BITS, scale, shift, r) for d, r in pairs]
    return plan


def pair_ops(batch: int, dims: Sequence[int], out: int, *, offline_steps: int = 1) -> StepOps:
    """Counts for one training step in the pairwise layout: forward opening (h'_i
    and W_i), reveal of z, backward opening (dL/dz alone: the forward openings serve
    the backward products), reveal of every dL/dh_i with the truncations' opening
    (4 rounds whatever k); two exact truncations from that one opening."""
    plan = pair_plan(batch, dims, out, range(1, len(dims) + 1), train=True, lr=_ANY_LR)
    return StepOps(
        matmuls=3 * len(dims),
        openings=3 * len(dims),
        rounds=4,
        truncations=2,
        dealer_requests=1 / max(1, offline_steps),
        offline_bytes=RING_BYTES * plan_elements(plan),
    )
