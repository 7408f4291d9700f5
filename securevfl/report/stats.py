"""Mean and 95% confidence interval of a metric over seeds (Student t).

With n seeds of a metric, the interval is ``mean +- t_{0.975, n-1} * s / sqrt(n)``,
``s`` the sample standard deviation (ddof 1): the textbook interval for the mean
of a small normal sample, which is what a handful of seeds gives. One seed has no
interval (its half-width is None). Pure functions: no I/O."""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

from scipy import stats

LEVEL = 0.95


@dataclass(frozen=True)
class Interval:
    """A metric over seeds: its mean, the half-width of its interval (None for one
    seed), and the per-seed values it came from, in seed order."""

    mean: float
    half: float | None
    values: tuple[float, ...]

    @property
    def lo(self) -> float | None:
        return None if self.half is None else self.mean - self.half

    @property
    def hi(self) -> float | None:
        return None if self.half is None else self.mean + self.half

    @property
    def n(self) -> int:
        return len(self.values)


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided Student t critical value for ``n`` samples (n - 1 degrees of freedom)."""
    if n < 2:
        raise ValueError("an interval needs at least two samples")
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def mean_interval(values: Sequence[object], level: float = LEVEL) -> Interval | None:
    """Mean and Student-t interval of the finite values among ``values``; None when
    there is none (a metric no seed produced). NaN and None entries are left out,
    so an attack that failed on one seed does not poison the others, and so is
    anything that is not a number (a string or a mapping where a metric belongs
    measures nothing); an infinite value (an epsilon without noise) makes the mean
    infinite, with no interval."""
    numbers_ = (float(v) for v in values if isinstance(v, numbers.Real) and not isinstance(v, bool))
    vals = tuple(v for v in numbers_ if not math.isnan(v))
    if not vals:
        return None
    if any(math.isinf(v) for v in vals):
        return Interval(math.fsum(vals) / len(vals), None, vals)
    n = len(vals)
    mean = math.fsum(vals) / n
    if n == 1:
        return Interval(mean, None, vals)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    return Interval(mean, t_quantile(n, level) * sd / math.sqrt(n), vals)
