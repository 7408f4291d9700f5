"""What one step of the ``mpc`` interactive layer consumes and sends: the
dealer's tuples (the offline plan) and the online protocol's operation counts.

Pure functions of the step's shape, shared by the backend (which asks the
dealer for exactly this plan), the benchmark's op-count floor and the tests.

A training step, k passive parties with embedding widths d_i, batch B, output
o, N = k + 1 MPC parties (DESIGN §4, the mpc section of README):

* forward: k products h_i W_i (one opening round), their untruncated sum z
  revealed to A (one reduce);
* backward: 2k products dL/dz W_i^T and h_i^T dL/dz (one opening round);
  dL/dh_i revealed to P_i, all k in one round; the momentum update
  v_i <- trunc(m v_i + h_i^T dL/dz) and the weight update
  W_i <- W_i - trunc(lr' v_i) each one truncation for all i: local with N = 2,
  CrypTen's wraps protocol (a dealer pair and one gather to rank 0) with N > 2.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from securevfl.exchange.crypten_pool import Item, Triple, Wraps, plan_elements

RING_BYTES = 8


def step_plan(batch: int, dims: Sequence[int], out: int, n_mpc: int, *, train: bool) -> list[Item]:
    """The tuples one step consumes, in a fixed order every party agrees on."""
    plan: list[Item] = [Triple((batch, d), (d, out)) for d in dims]
    if not train:
        return plan
    plan += [Triple((batch, out), (out, d)) for d in dims]
    plan += [Triple((d, batch), (batch, out)) for d in dims]
    if n_mpc > 2:
        weights = sum(d * out for d in dims)
        plan += [Wraps((weights,)), Wraps((weights,))]
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
    truncations: int  # truncations in shares (rounds only when N > 2)
    dealer_requests: float  # per step, amortised over the offline chunk
    offline_bytes: int  # dealer -> rank 0, per step

    def as_dict(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def step_ops(batch: int, dims: Sequence[int], out: int, n_mpc: int, *, offline_steps: int = 1) -> StepOps:
    """Counts for one training step (forward and backward) of ``step_plan``."""
    # rounds: forward opening, reveal z; backward opening, reveal dL/dh_i, 2 truncations if N > 2
    rounds = 4 + (2 if n_mpc > 2 else 0)
    plan = step_plan(batch, dims, out, n_mpc, train=True)
    return StepOps(
        matmuls=3 * len(dims),
        openings=6 * len(dims),
        rounds=rounds,
        truncations=2,
        dealer_requests=1 / max(1, offline_steps),
        offline_bytes=RING_BYTES * plan_elements(plan),
    )
