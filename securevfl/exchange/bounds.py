"""Norm bounds on what the HE exchanges encrypt (pure numpy).

Under ``ckks`` and ``paillier`` (:mod:`securevfl.exchange.he`) every encrypted
operand must lie within a bound the scheme's parameters are sized for: ``ckks``
sizes its exact decryption and its flooding for rows (and, for dL/dz, columns)
of l2 norm at most 2^value_norm_bits, ``paillier`` its fixed-point slots for
values below 2^value_bits. A party's embedding comes from a bottom model the
exchange knows nothing about (any width, any scale, a user's own module), so
the exchange does not hope its operands stay small: it puts them inside the
bound by construction, before encrypting, and the schemes' guards then only
catch a bug.

* P_i clips every row of h'_i to l2 norm at most the bound (:func:`clip_rows`),
  as DP-SGD clips per-example gradients: x -> x min(1, C / ||x||). The
  interactive layer then computes on the clipped rows, and the gradient P_i
  returns to its bottom model is taken through the clipping
  (:func:`clip_rows_grad`, the exact vector-Jacobian product), so training
  follows the function that was computed. A clipped row keeps its direction.
  Clipping after a defense's noise is post-processing: it spends no privacy.
* A scales dL/dz by one factor so that every row and every column is within
  the bound (:func:`scale_to_bound`): gradient-norm clipping of what flows into
  the interactive layer and the passive bottoms (A's own top model and bottom
  take the unscaled gradient). A mean-reduced loss gives rows of norm about
  1 / batch, so a healthy run never scales.

Both are computed by the owner of the operand on its own data; nothing about
them is sent (the bound is a public parameter, recorded in result.json).
"""

from __future__ import annotations

import numpy as np

#: the clip target's margin under the bound: a row rescaled to exactly C can
#: compute to C (1 + a few ulps); C (1 - 2^-40) leaves room for that rounding
MARGIN = 1.0 - 2.0**-40


def row_norms(x: np.ndarray) -> np.ndarray:
    """The l2 norm of every row of a float64 matrix, as the schemes' guards compute it."""
    return np.sqrt((x * x).sum(axis=1))


def _safe_row_norms(x: np.ndarray) -> np.ndarray:
    """Row norms that do not overflow for rows near the float64 limit (each row scaled
    by its largest entry first; a zero row has norm 0)."""
    top = np.abs(x).max(axis=1, initial=0.0)
    scale = np.where(top > 0, top, 1.0)
    return top * row_norms(x / scale[:, None])


def clip_rows(x: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """(y, f): y = x with every row of l2 norm above ``bound`` scaled onto it (rows
    within it unchanged), f the per-row factor (1 where unchanged). Every row of y
    has l2 norm at most ``bound`` as :func:`row_norms` computes it. x must be finite."""
    x = np.asarray(x, dtype=np.float64)
    norms = _safe_row_norms(x)
    target = bound * MARGIN
    over = norms > target
    f = np.ones_like(norms)
    f[over] = target / norms[over]
    return x * f[:, None], f


def clip_rows_grad(x: np.ndarray, f: np.ndarray, grad: np.ndarray) -> np.ndarray:
    """dL/dx from dL/dy for y = :func:`clip_rows` (x) with factors f. A row scaled onto
    the sphere of radius C is y = C x / ||x||, whose Jacobian is (C / ||x||)(I - u u^T)
    with u = x / ||x||: dL/dx = f (g - (u . g) u). Rows left alone pass g through."""
    x = np.asarray(x, dtype=np.float64)
    g = np.asarray(grad, dtype=np.float64)
    out = g.copy()
    over = f < 1.0
    if over.any():
        u = x[over] / _safe_row_norms(x[over])[:, None]  # the clipped rows' directions
        gs = g[over]
        out[over] = f[over, None] * (gs - (u * gs).sum(axis=1)[:, None] * u)
    return out


def scale_to_bound(g: np.ndarray, bound: float) -> np.ndarray:
    """g times min(1, C / m), m the largest l2 norm of a row or a column of g: every
    row and every column is then within ``bound`` (one factor keeps g's direction)."""
    g = np.asarray(g, dtype=np.float64)
    if g.size == 0:
        return g
    m = float(max(_safe_row_norms(g).max(), _safe_row_norms(g.T).max()))
    target = bound * MARGIN
    return g * (target / m) if m > target else g
