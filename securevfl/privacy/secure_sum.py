"""Secure summation for CRDP-FL's merged-data statistics (docs/methods/crdp-fl.md §2.5(f), §7.3).

The paper computes the correlated sensitivity ``Delta_CS_p`` and the feature
optimisation over the *merged* data of all organisations, which no organisation
holds (docs/methods/crdp-fl.md §6 item 10). Match counts are additive over disjoint column sets,
so the merged counts are the sum of every organisation's own counts; these
functions compute such sums with CrypTen secret sharing, on CrypTen's
communicator as :func:`securevfl.exchange.crypten_runtime.start_crypten` brings
it up on the session's process group (MPC parties are ranks ``0..n-1``, a
trusted dealer rank serves the correlated randomness that comparisons need).

Who learns what (semi-honest parties, dealer not colluding): every input is
secret-shared by its owner; only the value passed to ``get_plain_text`` is
opened. :func:`secure_sum` opens the sum; :func:`secure_correlated_sensitivity`
thresholds and takes the max row-sum inside MPC, so only the scalar
``Delta_CS_p`` is opened, never a count.

Every MPC rank must call these functions at the same point with the same shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from securevfl.privacy.correlated import MergedSensitivity, count_threshold, raised_threshold


def _share_sum(
    crypten: Any, local: torch.Tensor | None, shape: tuple[int, ...], sources: Sequence[int]
) -> Any:
    rank = crypten.communicator.get().get_rank()
    total = None
    for src in sources:
        t = local if rank == src and local is not None else torch.zeros(shape)
        part = crypten.cryptensor(t.float(), src=src)
        total = part if total is None else total + part
    return total


def secure_sum(
    crypten: Any,
    local: torch.Tensor | None,
    shape: tuple[int, ...],
    sources: Sequence[int],
    *,
    dst: int | None = None,
) -> torch.Tensor | None:
    """``sum_r local_r`` over the ``sources`` ranks, each term secret-shared from
    its owner; opened to every MPC party (``dst=None``) or to ``dst`` alone
    (others get None). Values are CrypTen fixed point (16 fractional bits): exact
    for integers below 2^46, resolution 1.5e-5 otherwise."""
    if not sources:
        raise ValueError("secure_sum needs at least one source rank")
    total = _share_sum(crypten, local, tuple(shape), sources)
    out = total.get_plain_text(dst=dst)
    rank = crypten.communicator.get().get_rank()
    return out if dst is None or rank == dst else None


def secure_correlated_sensitivity(
    crypten: Any,
    local_counts: torch.Tensor | None,
    n: int,
    sources: Sequence[int],
    *,
    n_features: int,
    w0: float,
    s: float = 1.0,
) -> float:
    """``Delta_CS_p = s max_i sum_j [M_ij >= w0 l] M_ij / l`` of the merged match
    counts ``M = sum_r M_r`` (Eq. 30), with every step after sharing done in MPC
    and only the final scalar opened to every MPC party.

    ``local_counts`` is this rank's ``n x n`` match-count matrix over its own
    columns (None on ranks that contribute nothing), ``n_features`` the merged
    column count ``l``. Counts are integers, so the comparison is made against
    ``ceil(w0 l) - 1/2``, far from any count in fixed point."""
    if n_features < 1:
        raise ValueError("n_features must be at least 1")
    counts = _share_sum(crypten, local_counts, (n, n), sources)
    k0 = count_threshold(w0, n_features)
    mask = counts >= (k0 - 0.5)
    row = (mask * counts).sum(dim=1)
    top = row.max()
    return float(top.get_plain_text()) * s / n_features


def secure_merged_sensitivity(
    crypten: Any,
    local: tuple[torch.Tensor, int, float] | None,
    n: int,
    sources: Sequence[int],
    *,
    w0: float,
) -> MergedSensitivity:
    """docs/methods/crdp-fl.md §2.5(e)-(f) across organisations, in MPC: the MPC twin of
    :func:`securevfl.privacy.correlated.merged_correlated_sensitivity`.

    ``local`` is this rank's ``(counts, l_r, mcd_r)``: its ``n x n`` match counts
    over its kept columns of the aligned training rows, its kept column count and
    its own MCD (None on ranks that contribute nothing). Two openings, both to
    every MPC party: the sums ``l = sum_r l_r`` and ``sum_r mcd_r`` (so the
    threshold ``max(w0, mean MCD)`` is public, as the paper shares every MCD in the
    clear), then the scalar ``Delta_CS_p`` at ``s = 1``. No count is opened."""
    if not sources:
        raise ValueError("secure_merged_sensitivity needs at least one source rank")
    stats = None
    if local is not None:
        stats = torch.tensor([float(local[1]), float(local[2])])
    opened = secure_sum(crypten, stats, (2,), sources)
    assert opened is not None
    l_total = round(float(opened[0]))
    mcd = float(opened[1]) / len(sources)
    thr = raised_threshold(w0, mcd)
    counts = None if local is None else torch.as_tensor(local[0])
    delta = secure_correlated_sensitivity(crypten, counts, n, sources, n_features=l_total, w0=thr, s=1.0)
    return MergedSensitivity(delta, l_total, mcd, thr, len(sources))
