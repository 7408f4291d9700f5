"""A privacy budget as a number of training steps.

Every rank derives the same plan from the protocol and the aligned training-row
count, so all of them stop at the same step without exchanging anything: the
run is truncated at the largest step count whose composed epsilon stays within
``privacy.budget.epsilon`` for every party (docs/design.md §7).

The math here is pure: the caller supplies every party's mechanisms for a plan
(:data:`MechanismsOf`; :mod:`securevfl.defenses.spending` builds them from the
protocol's defense stacks), so the privacy package does not depend on the
defenses that declare what they release.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from securevfl.config import PrivacySpec, TrainingSpec
from securevfl.errors import ConfigError
from securevfl.privacy.accountant import Mechanism, Plan, account
from securevfl.schedule import planned_steps, rounds_of, schedule

#: Every party's declared mechanisms over a plan, keyed by party name.
MechanismsOf = Callable[[Plan], dict[str, list[Mechanism]]]


def plan_for(steps: int, n_train: int, tr: TrainingSpec) -> Plan:
    """The release counts of the first ``steps`` training steps of the schedule
    the parties run (the same :func:`~securevfl.schedule.schedule`)."""
    counts = np.zeros(n_train, dtype=np.int64)
    evaluations = rounds = 0
    for epoch, batches, last in schedule(n_train, tr, steps):
        for idx in batches:
            counts[idx] += 1
        rounds += len(rounds_of(batches, tr.local_steps))
        if last or (epoch + 1) % tr.eval_every == 0:
            evaluations += 1
    return Plan(steps, n_train, tr.batch_size, int(counts.max(initial=0)), evaluations, rounds)


def worst_epsilon(
    mechanisms_of: MechanismsOf, steps: int, n_train: int, tr: TrainingSpec, delta: float
) -> float:
    """The largest composed epsilon of any party after ``steps`` training steps."""
    parties = account(mechanisms_of(plan_for(steps, n_train, tr)), delta)
    return max((p["total"]["epsilon"] for p in parties.values()), default=0.0)


def allowed_steps(mechanisms_of: MechanismsOf, n_train: int, tr: TrainingSpec, privacy: PrivacySpec) -> int:
    """How many steps to run: the schedule's length, or fewer where the budget
    would otherwise be exceeded. Raises when even the releases made before any
    training step (e.g. labels perturbed once) exceed it."""
    total = planned_steps(n_train, tr)
    budget = privacy.budget
    if budget is None:
        return total

    def worst(steps: int) -> float:
        return worst_epsilon(mechanisms_of, steps, n_train, tr, privacy.delta)

    if worst(total) <= budget.epsilon:
        return total
    if worst(0) > budget.epsilon:
        raise ConfigError(
            f"the privacy budget epsilon={budget.epsilon} is spent before the first training step "
            f"(one-off releases already cost {worst(0):.4g} at delta={privacy.delta})",
            path="privacy.budget.epsilon",
        )
    lo, hi = 0, total  # f(lo) within budget, f(hi) over it; epsilon grows with steps
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if worst(mid) <= budget.epsilon:
            lo = mid
        else:
            hi = mid
    return lo
