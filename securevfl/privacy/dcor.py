"""Distance correlation between a batch of inputs and a batch of embeddings.

Pure functions used by the DRAVL defense (docs/methods/dravl.md §3.3) as a training loss and as
a leakage metric: how strongly a passive party's embedding ``Z`` still depends on
its raw inputs ``X`` (any dependence, not only linear). Everything is computed in
float64 whatever the input dtype; the result keeps the graph, so ``log dCor`` can be
minimised by backpropagation.

Estimators (Székely, Rizzo & Bakirov 2007; Székely & Rizzo 2014):

* ``v_dcor``: the sample (V-statistic) distance correlation, in [0, 1]. This is the
  paper's training loss. It is biased upwards for independent data, more so in
  high dimension and at small n (about 0.41 for independent 13- and 64-dim
  Gaussians at n = 512), so report it next to a permutation baseline.
* ``v_dcor2``: its square.
* ``u_dcor2``: the bias-corrected squared distance correlation (U-centred), whose
  expectation is 0 under independence; it can be slightly negative.

Numerical safety (each has a unit test): pairwise distances are
``sqrt(d^2 + eps)`` so the gradient stays finite at zero distance (the diagonal,
duplicate rows); the squared correlation is clamped at 0 before its root; a
constant argument gives 0 instead of 0/0.
"""

from __future__ import annotations

from typing import Literal

import torch

Estimator = Literal["v_dcor", "v_dcor2", "u_dcor2"]
ESTIMATORS: tuple[str, ...] = ("v_dcor", "v_dcor2", "u_dcor2")


def _rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as an ``n x d`` float64 matrix (a vector is n samples of dimension 1)."""
    x = x.to(torch.float64)
    return x.reshape(len(x), -1)


def pairwise_distances(x: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """``a_ij = sqrt(||x_i - x_j||^2 + eps)`` as an ``n x n`` float64 matrix.

    Squared distances come from the Gram matrix of the column-centred rows (O(n^2)
    memory instead of the O(n^2 d) of broadcasting), are clamped at 0 against
    rounding, and the diagonal
    is set to exactly 0 before ``eps`` is added. ``eps = 0`` gives exact distances
    but an infinite gradient wherever two rows coincide.
    """
    x = _rows(x)
    x = x - x.mean(0, keepdim=True)  # shift-free; identical rows give exactly equal entries
    sq_norm = (x * x).sum(1)
    sq = (sq_norm[:, None] + sq_norm[None, :] - 2.0 * (x @ x.T)).clamp_min(0.0)
    off_diag = 1.0 - torch.eye(len(x), dtype=x.dtype, device=x.device)
    return torch.sqrt(sq * off_diag + eps)


def double_centre(d: torch.Tensor) -> torch.Tensor:
    """``A_ij = a_ij - mean_i. - mean_.j + mean_..`` (V-statistic centring)."""
    return d - d.mean(0, keepdim=True) - d.mean(1, keepdim=True) + d.mean()


def u_centre(d: torch.Tensor) -> torch.Tensor:
    """U-centring (Székely & Rizzo 2014): for i != j,
    ``a_ij - a_i./(n-2) - a_.j/(n-2) + a_../((n-1)(n-2))`` with row/column/grand
    *sums*; the diagonal is 0. Needs n >= 4."""
    n = len(d)
    if n < 4:
        raise ValueError(f"the bias-corrected estimator needs at least 4 rows, got {n}")
    u = (
        d
        - d.sum(0, keepdim=True) / (n - 2)
        - d.sum(1, keepdim=True) / (n - 2)
        + d.sum() / ((n - 1) * (n - 2))
    )
    return u * (1.0 - torch.eye(n, dtype=d.dtype, device=d.device))


def _check_pair(x: torch.Tensor, z: torch.Tensor) -> None:
    if len(x) != len(z):
        raise ValueError(f"dCor needs paired rows: X has {len(x)}, Z has {len(z)}")
    if len(x) < 2:
        raise ValueError("dCor needs at least 2 rows")


def v_dcor2(x: torch.Tensor, z: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Squared V-statistic distance correlation, clamped to [0, 1]; 0 when either
    argument is constant (its distance variance is 0). ``eps`` in the denominator
    (docs/methods/dravl.md Appendix A) only matters for embeddings at a scale near sqrt(eps)."""
    _check_pair(x, z)
    a = double_centre(pairwise_distances(x, eps))
    b = double_centre(pairwise_distances(z, eps))
    dcov2 = (a * b).mean()
    dvar2 = (a * a).mean() * (b * b).mean()
    return (dcov2 / torch.sqrt(dvar2 + eps)).clamp(0.0, 1.0)


def v_dcor(x: torch.Tensor, z: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """V-statistic distance correlation ``sqrt(dCor^2 + eps)`` in [0, 1] (docs/methods/dravl.md
    §3.3; eps keeps the gradient finite at dCor = 0)."""
    return torch.sqrt(v_dcor2(x, z, eps) + eps).clamp_max(1.0)


def u_dcor2(x: torch.Tensor, z: torch.Tensor, eps: float = 1e-12) -> torch.Tensor:
    """Bias-corrected squared distance correlation (U-statistic, Székely & Rizzo
    2014): about 0 for independent data at any dimension; in [-1, 1]."""
    _check_pair(x, z)
    n = len(x)
    a = u_centre(pairwise_distances(x, eps))
    b = u_centre(pairwise_distances(z, eps))
    scale = 1.0 / (n * (n - 3))
    dcov = (a * b).sum() * scale
    dvar = (a * a).sum() * scale * (b * b).sum() * scale
    return dcov / torch.sqrt(dvar.clamp_min(0.0) + eps * eps)


def distance_correlation(
    x: torch.Tensor, z: torch.Tensor, *, estimator: Estimator = "v_dcor", eps: float = 1e-12
) -> torch.Tensor:
    """The named estimator (``v_dcor`` | ``v_dcor2`` | ``u_dcor2``) as a float64 scalar."""
    if estimator == "v_dcor":
        return v_dcor(x, z, eps)
    if estimator == "v_dcor2":
        return v_dcor2(x, z, eps)
    if estimator == "u_dcor2":
        return u_dcor2(x, z, eps)
    raise ValueError(f"unknown dCor estimator {estimator!r} (known: {', '.join(ESTIMATORS)})")


def dcor_loss(
    x: torch.Tensor, z: torch.Tensor, *, use_log: bool = True, eps: float = 1e-12, log_eps: float = 1e-8
) -> torch.Tensor:
    """The paper's eq. 3 loss ``log(dCor(X, Z) + log_eps)`` (or plain ``dCor``).

    ``d log dCor / d dCor = 1 / dCor``: the push grows as dCor shrinks, which is why
    large weights collapse Z to a constant (docs/methods/dravl.md §7.7)."""
    d = v_dcor(x, z, eps)
    return torch.log(d + log_eps) if use_log else d


def permutation_baseline(
    x: torch.Tensor, z: torch.Tensor, *, generator: torch.Generator, eps: float = 1e-12
) -> torch.Tensor:
    """``v_dcor(X, Z[perm])``: the value the biased V-statistic takes at this n and
    these dimensions when the pairing is broken; report it next to ``v_dcor``."""
    perm = torch.randperm(len(z), generator=generator).to(z.device)
    return v_dcor(x, z[perm], eps)


def batched_metrics(
    x: torch.Tensor, z: torch.Tensor, *, batch: int = 512, generator: torch.Generator, eps: float = 1e-12
) -> dict[str, float]:
    """Leakage metrics over consecutive batches of ``batch`` rows, averaged (docs/methods/dravl.md
    §5, metric 2): V-dCor, its permutation baseline and the bias-corrected dCor².
    A trailing batch smaller than 4 rows is merged into the previous one."""
    _check_pair(x, z)
    n = len(x)
    starts = list(range(0, n, batch))
    if len(starts) > 1 and n - starts[-1] < 4:
        starts.pop()
    bounds = [*starts[1:], n]
    acc = {"v_dcor": 0.0, "v_dcor_permuted": 0.0, "u_dcor2": 0.0}
    with torch.no_grad():
        for s, e in zip(starts, bounds, strict=True):
            xb, zb = x[s:e], z[s:e]
            acc["v_dcor"] += float(v_dcor(xb, zb, eps))
            acc["v_dcor_permuted"] += float(permutation_baseline(xb, zb, generator=generator, eps=eps))
            acc["u_dcor2"] += float(u_dcor2(xb, zb, eps)) if len(xb) >= 4 else float("nan")
    return {k: v / len(starts) for k, v in acc.items()}
