"""Gaussian embedding-release math for VFL-AFE (docs/methods/vfl-afe.md §2.3-2.5, §7), as pure functions.

Everything here is stateless: clipping rows to an L2 ball, calibrating a noise
multiplier from ``(eps, delta)`` (the paper's classic Lemma 3.3 formula, and the
analytic Gaussian mechanism of Balle & Wang 2018 as ``dp_accounting`` computes it),
the paper's batch sensitivity estimate and rescaling factor, Gaussian noise, and
the exact privacy figures the spec's critique asks for (the true delta of a
calibration and the eps of one release, both dp_accounting's; exact GDP
composition; the effective eps after paper-mode rescaling).

Conventions: a *noise multiplier* ``z`` is the noise standard deviation divided by
the L2 sensitivity of the release. The VFL-AFE release of one clipped row has
sensitivity ``2t`` (replace-one neighbours: two rows in the ball of radius ``t``
are at most ``2t`` apart) and noise std ``2*sigma*t``, so its multiplier is ``sigma``.
"""

from __future__ import annotations

import math
import warnings
from typing import Literal

import numpy as np
import torch
from dp_accounting import get_epsilon_gaussian, get_sigma_gaussian
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss
from scipy.special import erfinv

from securevfl.csprng import SecretStream

Calibration = Literal["classic", "analytic"]
Estimator = Literal["quantile", "max"]

#: Root-finding tolerance of the exact calibrations (dp_accounting's searches).
TOLERANCE = 1e-12

#: Numerical floor inside the row norm, so that clipping has a finite gradient at h = 0.
NORM_EPS = 1e-12


# -- clipping (Eq. 2) -----------------------------------------------------------------------


def clip_rows(h: torch.Tensor, t: float) -> torch.Tensor:
    """Project each row of ``h`` onto the L2 ball of radius ``t``: ``h / max(1, ||h||/t)``.

    Rows already inside the ball are returned bit-identical (their divisor is exactly 1);
    longer rows keep their direction. Differentiable, with no NaN at ``h = 0``.
    """
    if not t > 0:
        raise ValueError(f"clip threshold must be > 0, got {t}")
    norm = torch.sqrt((h * h).sum(dim=-1, keepdim=True) + NORM_EPS**2)
    return h / torch.clamp_min(norm / t, 1.0)


# -- calibration (Lemma 3.3, Balle & Wang 2018) ---------------------------------------------
#
# The exact figures of one Gaussian release (its delta at eps, its eps at delta, the
# smallest multiplier for an (eps, delta)) are dp_accounting's: its Gaussian mechanism
# (``dp_accounting.get_sigma_gaussian``, ``get_epsilon_gaussian``) and its Gaussian privacy
# loss (``GaussianPrivacyLoss.get_delta_for_epsilon``) compute them from Balle & Wang's
# Theorem 8. Written here: only what the library lacks, the paper's classic formula with
# its soundness check, GDP composition of repeated releases, and the rescaled release's
# multiplier.


def classic_sigma(eps: float, delta: float) -> float:
    """Lemma 3.3's noise multiplier ``sqrt(2 ln(1.25/delta)) / eps`` (valid only for eps < 1).
    The paper's formula; dp_accounting has none (it calibrates exactly)."""
    _check_eps_delta(eps, delta)
    return math.sqrt(2.0 * math.log(1.25 / delta)) / eps


def gaussian_delta(z: float, eps: float) -> float:
    """The exact delta at ``eps`` of one Gaussian release with noise multiplier ``z``:
    ``Phi(1/(2z) - eps z) - e^eps Phi(-1/(2z) - eps z)`` (Balle & Wang 2018, Thm 8), as
    dp_accounting's Gaussian privacy loss computes it; 1 for ``z = 0`` (no noise)."""
    if z <= 0:
        return 1.0
    return float(GaussianPrivacyLoss(z, sensitivity=1.0).get_delta_for_epsilon(eps))


def analytic_sigma(eps: float, delta: float) -> float:
    """The smallest noise multiplier whose exact delta at ``eps`` is ``<= delta`` (the analytic
    Gaussian mechanism of Balle & Wang 2018): dp_accounting's ``get_sigma_gaussian``, for
    every ``eps > 0``, after this module's check of the arguments."""
    _check_eps_delta(eps, delta)
    return float(get_sigma_gaussian(eps, delta, tol=TOLERANCE))


def noise_multiplier(eps: float, delta: float, calibration: Calibration = "classic") -> float:
    """Noise multiplier ``sigma`` for a per-release ``(eps, delta)``; 0 for ``eps = inf`` (no noise).

    ``classic`` is the paper's formula: it warns outside the lemma's range (eps >= 1) and
    raises when its exact delta exceeds the target (e.g. eps > 6.77 at delta = 1e-2).
    ``analytic`` is exact for any eps (dp_accounting's calibration).
    """
    if math.isinf(eps) and eps > 0:
        return 0.0
    if calibration == "analytic":
        return analytic_sigma(eps, delta)
    if calibration != "classic":
        raise ValueError(f"unknown calibration {calibration!r} (known: classic, analytic)")
    sigma = classic_sigma(eps, delta)
    if eps >= 1:
        true = gaussian_delta(sigma, eps)
        if true > delta:
            raise ValueError(
                f"the classic Gaussian calibration is unsound at eps={eps:g}, delta={delta:g}: its exact "
                f"delta is {true:.3g}; use calibration 'analytic' or a smaller eps"
            )
        warnings.warn(
            f"classic Gaussian calibration at eps={eps:g} >= 1 is outside Lemma 3.3's range "
            f"(exact delta {true:.3g} still within {delta:g})",
            stacklevel=2,
        )
    return sigma


def _check_eps_delta(eps: float, delta: float) -> None:
    if not (eps > 0 and math.isfinite(eps)):
        raise ValueError(f"epsilon must be a positive finite number, got {eps}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must lie in (0, 1), got {delta}")


# -- exact privacy figures (docs/methods/vfl-afe.md §7) ----------------------------------------------------


def gaussian_epsilon(z: float, delta: float) -> float:
    """The exact eps at ``delta`` of one Gaussian release with noise multiplier ``z``:
    dp_accounting's ``get_epsilon_gaussian``; ``inf`` for ``z = 0`` (no noise)."""
    if z <= 0:
        return math.inf
    return float(get_epsilon_gaussian(z, delta, tol=TOLERANCE))


def gdp_composed_epsilon(z: float, count: int, delta: float) -> float:
    """Exact eps at ``delta`` of ``count`` Gaussian releases of multiplier ``z`` about the same
    record: they compose to one Gaussian of multiplier ``z / sqrt(count)`` (GDP, mu adds in
    quadrature; Dong et al. 2019), whose eps is :func:`gaussian_epsilon`."""
    if count <= 0:
        return 0.0
    return gaussian_epsilon(z / math.sqrt(count), delta)


def effective_epsilon(z: float, s: float, delta: float) -> float:
    """Per-release eps of a paper-mode rescaled release (critique 5): the rows are multiplied by
    ``s`` while the noise stays ``2*sigma*t``, so a neighbour can move the release by ``2ts``
    and the true multiplier is ``z / s``."""
    if s <= 0:
        raise ValueError(f"rescaling factor must be > 0, got {s}")
    return gaussian_epsilon(z / s, delta)


# -- sensitivity estimate and rescaling (Eqs. 3-5) -------------------------------------------


def quantile_multiplier(p2: float) -> float:
    """``k = sqrt(2) erfinv(2 p2 - 1)``: the number of standard deviations above the mean at
    which a Gaussian has mass ``p2`` below (k(Phi(3)) = 3)."""
    if not 0 < p2 < 1:
        raise ValueError(f"p2 must lie in (0, 1), got {p2}")
    return float(math.sqrt(2.0) * erfinv(2.0 * p2 - 1.0))


def pairwise_distances(h: torch.Tensor) -> torch.Tensor:
    """All ``n(n-1)/2`` pairwise L2 distances between rows (differentiable, as ``torch.pdist``)."""
    return torch.pdist(h)


def estimate_sensitivity(hc: torch.Tensor, k: float = 3.0, estimator: Estimator = "quantile") -> torch.Tensor:
    """The paper's data-dependent sensitivity estimate on one batch of clipped rows.

    ``quantile`` (Eq. 5): ``mean(d) + k * std(d)`` over the pairwise distances ``d``
    (population std); ``max`` (Eq. 3): the batch diameter. Needs at least 2 rows.
    """
    if hc.shape[0] < 2:
        raise ValueError("the sensitivity estimate needs at least 2 rows")
    d = pairwise_distances(hc)
    if estimator == "max":
        return d.max()
    if estimator != "quantile":
        raise ValueError(f"unknown estimator {estimator!r} (known: quantile, max)")
    return d.mean() + k * d.std(correction=0)


def rescale_factor(dt: float, t: float, *, s_max: float | None = None, floor: float = 1e-6) -> float:
    """``s = 2t / Delta~`` (Eq. 4), with the spec's guards: ``s = 1`` when ``Delta~ <= floor*t``
    (a degenerate batch) and an optional cap ``s_max``."""
    if dt <= floor * t:
        return 1.0
    s = 2.0 * t / dt
    return min(s, s_max) if s_max is not None else s


def rescale(
    hc: torch.Tensor,
    t: float,
    dt: torch.Tensor,
    *,
    grad: bool = False,
    s_max: float | None = None,
    floor: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s * hc, s)`` with ``s = 2t / Delta~`` (guards of :func:`rescale_factor`). ``s`` is a
    stop-gradient constant unless ``grad`` (docs/methods/vfl-afe.md §2.8)."""
    s_val = rescale_factor(float(dt), t, s_max=s_max, floor=floor)
    if grad and s_val == 2.0 * t / float(dt):
        s = 2.0 * t / dt
    else:
        s = torch.as_tensor(s_val, dtype=hc.dtype, device=hc.device)
    return hc * s, s.detach()


def add_noise(h: torch.Tensor, sigma: float, t: float, stream: SecretStream) -> torch.Tensor:
    """``h + N(0, (2 sigma t)^2 I)``, i.i.d. per coordinate and row (Eq. 2); the noise scale depends
    only on the public ``(sigma, t)``. Noise is drawn on the CPU from the party's secret stream
    (:meth:`SecretStream.normal`, Box-Muller on 53-bit uniforms) and moved to ``h``'s device. A
    float64 Gaussian is not a certified DP sampler (floating-point attacks, critique 12; SECURITY.md,
    "Randomness and masking")."""
    if sigma == 0:
        return h
    noise = stream.normal(h.shape)
    return h + (2.0 * sigma * t * noise).to(dtype=h.dtype, device=h.device)


# -- the sound rescaling variant (docs/methods/vfl-afe.md §7, rescale_mode="dp"; ours, not the paper) --------


def dp_centre_scale(
    hc: torch.Tensor, t: float, est_sigma: float, stream: SecretStream
) -> tuple[torch.Tensor, float]:
    """A private centre ``m`` and spread ``r`` of one batch of rows clipped to radius ``t``.

    ``m`` is the batch mean plus Gaussian noise (one row moves the mean by at most ``2t/n``), ``r``
    the mean distance to ``m`` (each distance clipped to ``[0, 2t]``, so one row moves it by at
    most ``2t/n``) plus Gaussian noise; both at noise multiplier ``est_sigma``, i.e. two Gaussian
    releases per batch. Floors ``r`` at ``t/100`` so the derived scale ``t/r`` stays bounded.
    """
    n = hc.shape[0]
    if n < 1:
        raise ValueError("the DP centre/scale estimate needs at least one row")
    sens = 2.0 * t / n
    x = hc.detach().double().cpu()
    m = x.mean(0) + est_sigma * sens * stream.normal((x.shape[1],))
    dist = torch.clamp((x - m).norm(dim=1), max=2.0 * t)
    r = float(dist.mean()) + est_sigma * sens * float(stream.normal((1,))[0])
    return m.to(dtype=hc.dtype, device=hc.device), max(r, t / 100.0)


def empirical_quantiles(values: list[float] | np.ndarray) -> dict[str, float]:
    """mean / p99 / max / count of a list of logged values (e.g. the rescaling factors)."""
    v = np.asarray(values, dtype=np.float64)
    if v.size == 0:
        return {"count": 0}
    return {
        "count": int(v.size),
        "mean": float(v.mean()),
        "p99": float(np.quantile(v, 0.99)),
        "max": float(v.max()),
    }
