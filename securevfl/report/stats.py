"""Mean and 95% confidence interval of a metric over seeds (Student t).

With n seeds of a metric, the interval is ``mean +- t_{0.975, n-1} * s / sqrt(n)``,
``s`` the sample standard deviation (ddof 1): the textbook interval for the mean
of a small normal sample, which is what a handful of seeds gives. One seed has no
interval (its half-width is None). A metric that lies in a range (an accuracy or
AUC in [0, 1], an attack score at most 1, a time at least 0) has its interval's
ends clipped to it: the t interval is symmetric and knows nothing of the range, so
an accuracy of 0.97 ± 0.05 would otherwise claim values past 1. An interval whose
half-width exceeds its mean's magnitude is *noisy*: its seeds disagree by more
than the figure itself, so neither its size nor its sign can be trusted, and the
report says so. Pure functions: no I/O."""

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
    seed), the per-seed values it came from, in seed order, and the range the
    metric lies in (``floor``, ``ceiling``), which ``lo`` and ``hi`` are clipped to."""

    mean: float
    half: float | None
    values: tuple[float, ...]
    floor: float = -math.inf
    ceiling: float = math.inf

    @property
    def lo(self) -> float | None:
        return None if self.half is None else max(self.floor, self.mean - self.half)

    @property
    def hi(self) -> float | None:
        return None if self.half is None else min(self.ceiling, self.mean + self.half)

    @property
    def clipped(self) -> bool:
        """Whether the metric's range cut the interval (``lo``/``hi`` are then not ``mean ± half``)."""
        return self.half is not None and (
            self.mean - self.half < self.floor or self.mean + self.half > self.ceiling
        )

    @property
    def noisy(self) -> bool:
        """Whether the interval is wider than the figure: half-width above ``|mean|``."""
        return self.half is not None and self.half > abs(self.mean)

    @property
    def n(self) -> int:
        return len(self.values)


def t_quantile(n: int, level: float = LEVEL) -> float:
    """The two-sided Student t critical value for ``n`` samples (n - 1 degrees of freedom)."""
    if n < 2:
        raise ValueError("an interval needs at least two samples")
    return float(stats.t.ppf(0.5 + level / 2, n - 1))


def mean_interval(
    values: Sequence[object], level: float = LEVEL, bounds: tuple[float, float] = (-math.inf, math.inf)
) -> Interval | None:
    """Mean and Student-t interval of the finite values among ``values``, its ends
    clipped to ``bounds`` (the metric's range); None when
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
        return Interval(math.fsum(vals) / len(vals), None, vals, *bounds)
    n = len(vals)
    mean = math.fsum(vals) / n
    if n == 1:
        return Interval(mean, None, vals, *bounds)
    sd = math.sqrt(math.fsum((v - mean) ** 2 for v in vals) / (n - 1))
    return Interval(mean, t_quantile(n, level) * sd / math.sqrt(n), vals, *bounds)
