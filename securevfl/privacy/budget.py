"""A protocol's privacy budget as a number of training steps.

Every rank derives the same plan from the protocol and the aligned training-row
count, so all of them stop at the same step without exchanging anything: the
run is truncated at the largest step count whose composed epsilon stays within
``privacy.budget.epsilon`` for every party (DESIGN §7).
"""

from __future__ import annotations

import numpy as np

from securevfl.config import Protocol, TrainingSpec
from securevfl.errors import ConfigError
from securevfl.privacy.accountant import Mechanism, Plan, account


def plan_for(steps: int, n_train: int, tr: TrainingSpec) -> Plan:
    """The release counts of the first ``steps`` training steps of the schedule
    the parties run (the same :func:`~securevfl.parties.common.schedule`)."""
    from securevfl.parties.common import rounds_of, schedule

    counts = np.zeros(n_train, dtype=np.int64)
    evaluations = rounds = 0
    for epoch, batches, last in schedule(n_train, tr, steps):
        for idx in batches:
            counts[idx] += 1
        rounds += len(rounds_of(batches, tr.local_steps))
        if last or (epoch + 1) % tr.eval_every == 0:
            evaluations += 1
    return Plan(steps, n_train, tr.batch_size, int(counts.max(initial=0)), evaluations, rounds)


def planned_steps(n_train: int, tr: TrainingSpec) -> int:
    from securevfl.parties.common import steps_per_epoch

    total = steps_per_epoch(n_train, tr.batch_size) * tr.epochs
    return min(total, tr.max_steps) if tr.max_steps else total


def all_mechanisms(proto: Protocol, plan: Plan) -> dict[str, list[Mechanism]]:
    """Every party's declared mechanisms for ``plan`` (built from the protocol
    alone, so any rank can compute any party's figure)."""
    from securevfl.defenses.base import build_stack

    out = {}
    parties = [("active", proto.parties.active)] + [("passive", p) for p in proto.parties.passive]
    for side, spec in parties:
        out[spec.name] = build_stack(proto, spec.name, side, spec.defenses).mechanisms(plan)
    return out


def spent(proto: Protocol, plan: Plan) -> dict[str, object]:
    return account(all_mechanisms(proto, plan), proto.privacy.delta)


def _worst(proto: Protocol, steps: int, n_train: int) -> float:
    parties = spent(proto, plan_for(steps, n_train, proto.training))
    return max((p["total"]["epsilon"] for p in parties.values()), default=0.0)


def allowed_steps(proto: Protocol, n_train: int) -> int:
    """How many steps to run: the schedule's length, or fewer where the budget
    would otherwise be exceeded. Raises when even the releases made before any
    training step (e.g. labels perturbed once) exceed it."""
    total = planned_steps(n_train, proto.training)
    budget = proto.privacy.budget
    if budget is None:
        return total
    if _worst(proto, total, n_train) <= budget.epsilon:
        return total
    if _worst(proto, 0, n_train) > budget.epsilon:
        raise ConfigError(
            f"the privacy budget epsilon={budget.epsilon} is spent before the first training step "
            f"(one-off releases already cost {_worst(proto, 0, n_train):.4g} at delta={proto.privacy.delta})",
            path="privacy.budget.epsilon",
        )
    lo, hi = 0, total  # f(lo) within budget, f(hi) over it; epsilon grows with steps
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _worst(proto, mid, n_train) <= budget.epsilon:
            lo = mid
        else:
            hi = mid
    return lo
