"""How a floor of protocols/floors.toml follows from the runs it lists, and how
often that rule fails a run whose results are unchanged (a false alarm).

A shipped protocol's result is a random variable: every run draws its own secret
initial weights, masks and noise. A floor is set from the runs written beside it:
the lowest value less the whole spread of the values (highest less lowest), or
less 0.05 where the spread is narrower, rounded down to three decimals, as results
are written (for an ``at_most`` metric, the mirror image: the highest value plus that
margin, rounded up).

Why the whole spread. The tier checks about forty floors in one go, so each floor
must fail an unchanged run well under once in a thousand for the tier to pass
most of the time. ``python -m tests.shipped.floor_rule`` estimates, for samples of
n runs from a normal law and from a heavier-tailed one (Student's t, 4 degrees of
freedom), how often a next run lands below the floor each margin gives. With half
the spread, the rule before, a floor set from 7 runs fails a next run about 2% of
the time (3% under the heavier tail): over forty floors, most tiers. With the whole
spread it is 0.4% (1%) at 7 runs and 0.1% (0.5%) at 10, and the 0.05 lower bound on
the margin takes the narrow rows (most of them) far below that. docs/benchmarks.md
§11 gives the table.

What the floor still catches: every accuracy floor lies above the majority-class
rate of its test rows (tests/shipped/test_floors_above_trivial.py), so a run that
ends at the majority class, or a change that costs a protocol more than its own
spread, fails the tier.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

#: the least margin below the lowest run, for rows whose runs barely differ
LEAST_MARGIN = 0.05
#: the fewest runs a floor may be set from
FEWEST_RUNS = 5


def floor_from(runs: Sequence[float], direction: str = "at_least") -> float:
    """The floor the rule gives for ``runs`` (three decimals): the lowest run less
    max(0.05, spread) rounded down, or for ``at_most`` the highest plus it rounded up."""
    if len(runs) < FEWEST_RUNS:
        raise ValueError(f"a floor needs at least {FEWEST_RUNS} runs, got {len(runs)}")
    lo, hi = min(runs), max(runs)
    margin = max(LEAST_MARGIN, hi - lo)
    if direction == "at_least":
        return math.floor(round((lo - margin) * 1000, 6)) / 1000
    if direction == "at_most":
        return math.ceil(round((hi + margin) * 1000, 6)) / 1000
    raise ValueError(f"direction is at_least or at_most, not {direction!r}")


def false_alarm_rate(
    n: int, share: float, law: str = "normal", trials: int = 200_000, seed: int = 0
) -> float:
    """How often a next run lands below ``lowest - share * spread`` of ``n`` earlier
    runs, all drawn from ``law`` ("normal" or "t4"); scale-free, so without the
    0.05 lower bound (which only lowers a floor further)."""
    rng = np.random.default_rng(seed)  # a simulation of the rule, protects nothing
    if law == "normal":
        earlier, nxt = rng.standard_normal((trials, n)), rng.standard_normal(trials)
    elif law == "t4":
        earlier, nxt = rng.standard_t(4, (trials, n)), rng.standard_t(4, trials)
    else:
        raise ValueError(f"law is normal or t4, not {law!r}")
    lo = earlier.min(axis=1)
    floor = lo - share * (earlier.max(axis=1) - lo)
    return float((nxt < floor).mean())


def main() -> None:
    print("runs  margin         next run below the floor   (normal / t, 4 dof)   a tier of 40 floors fails")
    for n in (5, 7, 10):
        for share in (0.5, 1.0):
            normal, heavy = false_alarm_rate(n, share), false_alarm_rate(n, share, "t4")
            print(
                f"{n:4d}  {share:g} x spread   {normal:8.2%} / {heavy:6.2%}"
                f"{'':22s}{1 - (1 - normal) ** 40:6.0%} / {1 - (1 - heavy) ** 40:4.0%}"
            )


if __name__ == "__main__":
    main()
